"""What the gate reads, built for its CPU tests: a vLLM config a server-level check accepts, and one engine step's
SchedulerOutput (vLLM's own class)."""

from __future__ import annotations

import types

import torch
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput


def server_config(**over):
    """A config every server-level check accepts; `over` sets dotted paths, e.g. `**{"lora_config": object()}` or
    `**{"model_config.dtype": torch.float16}`."""
    ns = types.SimpleNamespace
    cfg = ns(
        parallel_config=ns(pipeline_parallel_size=1, data_parallel_size=1, decode_context_parallel_size=1,
                           prefill_context_parallel_size=1),
        model_config=ns(dtype=torch.bfloat16, is_encoder_decoder=False, is_multimodal_model=False,
                        runner_type="generate"),
        cache_config=ns(cache_dtype="auto"), lora_config=None, speculative_config=None,
    )  # fmt: skip
    for path, value in over.items():
        obj = cfg
        *head, last = path.split(".")
        for h in head:
            obj = getattr(obj, h)
        setattr(obj, last, value)
    return cfg


def decode_step(*req_ids: str, tokens: int = 1, **over) -> SchedulerOutput:
    """A step scheduling `tokens` tokens for each of the cached requests `req_ids`; `over` sets SchedulerOutput
    fields."""
    so = SchedulerOutput.make_empty()
    so.scheduled_cached_reqs = CachedRequestData.make_empty()
    so.num_scheduled_tokens = {r: tokens for r in req_ids}
    so.total_num_scheduled_tokens = tokens * len(req_ids)
    for k, v in over.items():
        setattr(so, k, v)
    return so


def decode_at(position: int, outputs: int, req_id: str = "a") -> SchedulerOutput:
    """One cached request decoding the token at `position` (num_computed_tokens), with `outputs` output tokens so
    far (vLLM's num_output_tokens; the prompt then has position + 1 - outputs tokens)."""
    return decode_step(req_id, scheduled_cached_reqs=CachedRequestData(
        req_ids=[req_id], resumed_req_ids=set(), new_token_ids=[], all_token_ids={}, new_block_ids=[None],
        num_computed_tokens=[position], num_output_tokens=[outputs],
    ))  # fmt: skip
