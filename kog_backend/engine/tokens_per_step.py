"""How many tokens one kog step may generate: the server's K (tokens_per_step, which needs kog's scheduler), and
for one step the burst's length under K, the request's max_tokens, max_model_len and the tested context range."""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger

from kog_backend.config import KogConfig
from kog_backend.path import gate
from kog_backend.path.gate.step import MAX_TESTED_CONTEXT

logger = init_logger("kog_backend.engine.tokens_per_step")


def effective_tokens_per_step(kog_config: KogConfig, vllm_config: Any) -> int:
    """The option tokens_per_step where kog's scheduler runs (gate.scheduling_reason), else 1: warned when the user
    asked for K > 1, logged at INFO for the default K."""
    k = kog_config.tokens_per_step
    if k == 1:
        return 1
    from kog_backend.engine.scheduler import KogScheduler

    sc = vllm_config.scheduler_config
    try:
        cls = sc.get_scheduler_cls()
    except Exception:  # an unimportable scheduler is vLLM's error to report
        cls = None
    problem = gate.scheduling_reason(isinstance(cls, type) and issubclass(cls, KogScheduler))
    if problem is not None:
        if "tokens_per_step" in KogConfig.given_keys(vllm_config):
            logger.warning("kog: tokens_per_step=%d needs its scheduler; running 1 token per step: %s", k, problem)
        else:
            logger.info("kog: 1 token per engine step (the default K=%d needs kog's scheduler): %s", k, problem)
        return 1
    return k


def burst_max_len(max_model_len: int) -> int:
    """The max_model_len a burst is capped by (burst_length): vLLM's, or one past the tested context range, so
    that no burst computes a position whose context exceeds MAX_TESTED_CONTEXT."""
    return min(max_model_len, MAX_TESTED_CONTEXT + 1)


def burst_length(tokens_per_step: int, position: int, prompt_len: int, max_tokens: int, max_model_len: int) -> int:
    """Tokens one kog step may generate for the token at `position`: at most K, never past max_tokens (outputs
    so far: position - prompt_len + 1) or max_model_len (the last token may sit at max_model_len - 1)."""
    outputs_so_far = position - prompt_len + 1
    return max(1, min(tokens_per_step, max_tokens - outputs_so_far, max_model_len - 1 - position))
