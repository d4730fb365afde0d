"""What the runner records of a request when vLLM adds it (KogModelRunner.add_requests): whether the kog path may
decode it, whether its kog steps may be bursts, its draw as a burst reproduces it, and what ends it."""

from __future__ import annotations

import dataclasses
from typing import Any

from kog_backend.engine.tokens_per_step import burst_length
from kog_backend.path import gate
from kog_backend.path.burst_sampling import BurstSampling, burst_sampling


@dataclasses.dataclass(frozen=True)
class KogRequest:
    reason: str | None  # why this request never takes the kog path, or None
    single_token: str | None  # why its kog steps make one token each whatever the kernel can do, or None
    sampling: BurstSampling | None  # its draw and penalties as vLLM holds them, None: plain greedy (the greedy kernel)
    prompt_len: int
    max_tokens: int
    stop_ids: tuple[int, ...]  # EOS (unless ignore_eos) and stop_token_ids: the monokernel ends a burst there

    @classmethod
    def from_new_request(cls, new: Any, vocab_size: int) -> KogRequest:
        """From vLLM's NewRequestData (scheduler_output.scheduled_new_reqs)."""
        sp = new.sampling_params
        return cls(
            reason=gate.request_unsupported_reason(sp, new.lora_request, new.pooling_params),
            single_token=gate.request_single_token_reason(sp),
            sampling=burst_sampling(sp, vocab_size),
            prompt_len=len(new.prompt_token_ids or ()),
            max_tokens=(sp.max_tokens if sp is not None and sp.max_tokens is not None else 1),
            stop_ids=stop_ids(sp),
        )

    def burst_length(self, tokens_per_step: int, position: int, max_len: int) -> int:
        """Tokens one kog step of this request may generate for the token at `position` (tokens_per_step.burst_length;
        max_len: tokens_per_step.burst_max_len)."""
        return burst_length(tokens_per_step, position, self.prompt_len, self.max_tokens, max_len)


def stop_ids(sp: Any) -> tuple[int, ...]:
    """The ids vLLM's check_stop ends a request on: stop_token_ids, and EOS unless ignore_eos."""
    if sp is None:
        return ()
    ids = set(sp.stop_token_ids or ())
    if not sp.ignore_eos and sp.eos_token_id is not None:
        ids.add(sp.eos_token_id)
    return tuple(sorted(ids))
