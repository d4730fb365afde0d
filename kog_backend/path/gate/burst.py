"""Why a kog step makes one token (vLLM's sampler on the kernel's logits) instead of a K-token burst.

Counted per step (`single_token_steps` in `kog stats`); the step itself stays on the kog path.
"""

from __future__ import annotations

from typing import Any

# The counted reasons; "filters" and "penalties" are followed by the monokernel's own reason.
BURST_REASONS = {
    "option": "sampled bursts off (kog option sampled_bursts)",
    "fp64_gumbel": "vLLM draws with fp64 Gumbel noise (the kernel draws vLLM's fp32 noise)",
    "no_monokernel": "sampled bursts need the monokernel",
    "filters": "top-k/top-p/min-p bursts unavailable",
    "penalties": "penalty bursts unavailable",
    # What vLLM's sampler applies from its own per-request state that a burst does not reproduce: the kernel's
    # logits of one token go through vLLM's sampler instead.
    "logit_bias": "logit_bias",
    "allowed_token_ids": "allowed_token_ids",
    "bad_words": "bad_words",
    "min_tokens": "min_tokens > 0",
    "kv_slots": "no KV slots past this token (another request is waiting)",  # (fit_to_slots)
}

# Why the server runs one token per engine step at all (tokens_per_step > 1 needs kog's scheduler): logged once at
# start, not counted per step.
SCHEDULING_REASONS = {
    "scheduler": "the scheduler is not kog_backend.engine.scheduler.KogScheduler (pass --scheduler-cls or use "
                 "--backend kog)",
}

REASONS = {
    **BURST_REASONS,
    "filters": BURST_REASONS["filters"] + ": {reason}",
    "penalties": BURST_REASONS["penalties"] + ": {reason}",
    **SCHEDULING_REASONS,
}


def request_single_token_reason(sampling_params: Any) -> str | None:
    """Why a request on the kog path runs one token per engine step whatever the kernel can do (vLLM's sampler
    applies these from its own state to the kernel's logits), or None."""
    sp = sampling_params
    if sp is None:
        return None
    if sp.logit_bias:
        return BURST_REASONS["logit_bias"]
    if sp.allowed_token_ids:
        return BURST_REASONS["allowed_token_ids"]
    if sp.bad_words or getattr(sp, "bad_words_token_ids", None):
        return BURST_REASONS["bad_words"]
    if sp.min_tokens and sp.min_tokens > 0:
        return BURST_REASONS["min_tokens"]
    return None


def fit_to_slots(k: int, position: int, slots: int) -> tuple[int, str | None]:
    """A burst of k tokens from `position` cut to the KV slots its request holds (positions 0 .. slots - 1), and the
    counted reason when that leaves one token. KogScheduler reserves the burst's slots only while the request runs
    alone: scheduled beside a request that waits for KV blocks, it holds fewer, and a position past its blocks has
    no slot of its own."""
    if k <= slots - position:
        return k, None
    k = max(1, slots - position)
    return k, (BURST_REASONS["kv_slots"] if k == 1 else None)


def burst_reason(single_token: str | None, sampling: Any, sampled_bursts: bool, monokernel: Any,
                 fp64_gumbel: bool) -> str | None:
    """None when a request's kog step may generate K tokens, else why it runs one. Plain greedy requests
    (sampling None) always may; a sampled or penalised one (path.burst_sampling.BurstSampling) on the monokernel,
    with the sampled_bursts option on, vLLM's fp32 Gumbel noise, and (for top-k / top-p / min-p, penalties) a
    kernel that can apply them; none whose sampler state the burst does not reproduce (single_token)."""
    if single_token is not None:
        return single_token
    if sampling is None:
        return None
    if not sampled_bursts:
        return BURST_REASONS["option"]
    if monokernel is None:
        return BURST_REASONS["no_monokernel"]
    if fp64_gumbel:
        return BURST_REASONS["fp64_gumbel"]
    if sampling.filtered and monokernel.filtered_sampling_reason is not None:
        return REASONS["filters"].format(reason=monokernel.filtered_sampling_reason)
    if sampling.penalized and monokernel.penalty_reason is not None:
        return REASONS["penalties"].format(reason=monokernel.penalty_reason)
    return None


def scheduling_reason(uses_kog_scheduler: bool) -> str | None:
    """Why tokens_per_step > 1 cannot run on this server (it then runs 1 token per engine step), or None."""
    if not uses_kog_scheduler:
        return SCHEDULING_REASONS["scheduler"]
    return None
