"""Stock scheduling for a `--backend kog` server on which kog will not run.

`--backend kog` selects KogScheduler when the command line is parsed (cli_args._select_scheduler), before any config
exists. When vLLM then builds the engine's config, kog's platform (KogCudaPlatform.check_and_update_config, in the
API server process, before the engine starts) asks the gate whether kog can run on this server at all
(`start_reason`: the server features, vLLM version, GPU, model architecture, quantisation, extension); if not, it
puts back the scheduler the user had (None: vLLM's own), so the server runs exactly as stock. Async scheduling is
never changed by kog (KogScheduler is vLLM's async scheduler).

What the gate cannot know before the model and KV cache exist (a layer the monokernel cannot take, a KV cache
that is not bf16, a monokernel set-up failure, a kernel abort later on) turns kog off in the worker only; the server
then keeps kog's scheduler, whose batched steps are stock's and whose single-request steps are not scheduled ahead
of the previous one's tokens (benchmarks/concurrency_ab.sh measures batched traffic).
"""

from __future__ import annotations

from typing import Any

from kog_backend.config import SCHEDULER_CLS, KogConfig

# Set by cli_args._select_scheduler when it chose kog's scheduler: the one the user had.
_forced: dict[str, Any] | None = None


def record_forced(scheduler_cls: Any) -> None:
    global _forced
    _forced = {"scheduler_cls": scheduler_cls}


def start_reason(vllm_config: Any) -> str | None:
    """Why kog will turn itself off for this server whatever its requests are, as far as the config tells before
    the engine starts, or None: the gate's start reason (kog_backend.path.gate.server.start_reason)."""
    from kog_backend.path import gate

    return gate.start_reason(vllm_config, KogConfig.from_vllm_config(vllm_config))


def restore_stock_scheduling(vllm_config: Any) -> str | None:
    """Puts back the user's scheduler where kog chose its own and will not run; returns the gate's reason then."""
    sc = vllm_config.scheduler_config
    if _forced is None or sc.scheduler_cls != SCHEDULER_CLS:
        return None
    reason = start_reason(vllm_config)
    if reason is None:
        return None
    sc.scheduler_cls = _forced["scheduler_cls"]
    from vllm.logger import init_logger

    init_logger("kog_backend.engine.scheduling").info(
        "kog will not run on this server (%s): stock scheduling (scheduler %s, async scheduling %s)",
        reason, sc.scheduler_cls or "vLLM's default", "on" if sc.async_scheduling else "off",
    )  # fmt: skip
    return reason
