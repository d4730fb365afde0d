"""One engine step: the kog path takes it only when exactly one request is decoding one token.

All TP ranks see the same SchedulerOutput, so they take the same decision. The step of a request that request.py
refused counts that request's reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kog_backend.path.gate.request import REQUEST_FEATURES

# Values are the counted reasons (the request itself may be eligible).
STEP_REASONS = {
    "batch": "batch of several requests",
    "idle": "no request scheduled",
    "prefill": "prefill",
    "speculative": "speculative tokens scheduled",
    "encoder": "encoder inputs scheduled",
    "unknown_request": "request unknown to the kog runner",
}
REASONS = {**STEP_REASONS, "dummy_run": "dummy run"}


def step_unsupported_reason(
    scheduler_output: Any, request_reasons: Mapping[str, str | None], dummy_run: bool = False
) -> str | None:
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
    return request_reasons[req_id]
