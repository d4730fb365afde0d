"""One engine step: the kog path takes it only when exactly one request is decoding one token, its last known
token, at a context within the tested range.

All TP ranks see the same SchedulerOutput, so they take the same decision. The step of a request that request.py
refused counts that request's reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kog_backend.path.gate.request import REQUEST_FEATURES

# The longest context, in positions (the step's own token included), at which the kog path is checked against its
# reference: the longest case of integration_tests/test_monokernel_long_context_gpu.py, which imports this constant.
# A step whose context is longer runs stock, and a burst never computes past it (burst_max_len's cap on
# engine/tokens_per_step.burst_length).
MAX_TESTED_CONTEXT = 131072

# Values are the counted reasons (the request itself may be eligible).
STEP_REASONS = {
    "batch": "batch of several requests",
    "idle": "no request scheduled",
    "prefill": "prefill",
    "speculative": "speculative tokens scheduled",
    "encoder": "encoder inputs scheduled",
    "unknown_request": "request unknown to the kog runner",
    "long_context": f"context beyond {MAX_TESTED_CONTEXT} positions (the kog path's tested range)",
}
REASONS = {**STEP_REASONS, "dummy_run": "dummy run"}


def step_unsupported_reason(
    scheduler_output: Any,
    request_reasons: Mapping[str, str | None],
    dummy_run: bool = False,
    prompt_lens: Mapping[str, int] | None = None,
    max_context: int = MAX_TESTED_CONTEXT,
) -> str | None:
    """None when the step is one request decoding one token on the kog path. Where the request is in the step's
    scheduled_cached_reqs (every step but its first), its position is checked too: the scheduled token must be its
    last known one (num_computed_tokens + 1 == prompt length + outputs; a prefill chunk of one token that is not
    the prompt's last is a prefill, the final one-token chunk of a chunked prefill decodes), and the context
    (position + 1) at most max_context. prompt_lens: request id -> prompt length (tokens), as the runner recorded
    it; without it only the context length is checked."""
    if dummy_run:
        return REASONS["dummy_run"]
    num_reqs = len(scheduler_output.num_scheduled_tokens)
    if num_reqs != 1:
        return STEP_REASONS["batch"] if num_reqs > 1 else STEP_REASONS["idle"]
    if scheduler_output.scheduled_new_reqs or scheduler_output.total_num_scheduled_tokens != 1:
        return STEP_REASONS["prefill"]
    if scheduler_output.scheduled_spec_decode_tokens:
        return STEP_REASONS["speculative"]
    if scheduler_output.scheduled_encoder_inputs:
        return STEP_REASONS["encoder"]
    if scheduler_output.has_structured_output_requests:
        return REQUEST_FEATURES["structured_outputs"]
    (req_id,) = scheduler_output.num_scheduled_tokens
    if req_id not in request_reasons:
        return STEP_REASONS["unknown_request"]
    if request_reasons[req_id] is not None:
        return request_reasons[req_id]
    cached = scheduler_output.scheduled_cached_reqs
    if cached is not None and req_id in cached.req_ids:
        i = cached.req_ids.index(req_id)  # one request: a list of one
        position = cached.num_computed_tokens[i]
        prompt_len = (prompt_lens or {}).get(req_id)
        if prompt_len is not None and position + 1 < prompt_len + cached.num_output_tokens[i]:
            return STEP_REASONS["prefill"]
        if position + 1 > max_context:
            return STEP_REASONS["long_context"]
    return None
