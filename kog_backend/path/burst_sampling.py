"""The draw a K-token burst reproduces for a sampled or penalised request: its SamplingParams normalised as
vLLM 0.26's SamplingStates and PenaltiesState hold them (fp32 values), and the monokernel's arguments for it.

Whether a request bursts at all is the gate's decision (kog_backend.path.gate.burst).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

GREEDY_TEMPERATURE = 1e-5  # vLLM's SamplingParams: temperature below this is greedy


@dataclasses.dataclass(frozen=True)
class BurstSampling:
    """A sampled (or penalised) request's draw as vLLM's SamplingStates and PenaltiesState hold it (fp32 values;
    temperature 0 = greedy, top_k 0 = off, top_p 1 = off, penalties at 1 / 0 / 0 = off)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def draw_kwargs(self, device: Any, penalty_rows: tuple[Any, Any] | None = None) -> dict[str, Any]:
        """Monokernel.generate's arguments for this draw; a filtered draw gets a fresh zeroed defer_out. A penalised
        one needs penalty_rows: (prompt_mask, output_counts), the request's rows of vLLM's PenaltiesState."""
        kw: dict[str, Any] = {"temperature": self.temperature}
        if self.filtered:
            import torch

            kw.update(top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                      defer_out=torch.zeros(1, dtype=torch.int32, device=device))
        if self.penalized:
            if penalty_rows is None:
                raise ValueError("a penalised draw needs the request's PenaltiesState rows")
            kw.update(prompt_mask=penalty_rows[0], output_counts=penalty_rows[1],
                      repetition_penalty=self.repetition_penalty, frequency_penalty=self.frequency_penalty,
                      presence_penalty=self.presence_penalty)
        return kw


def burst_sampling(sampling_params: Any, vocab_size: int) -> BurstSampling | None:
    """The draw a burst reproduces for this request, normalised as vLLM 0.26's SamplingStates and PenaltiesState
    do (top_k <= 0 or >= vocab_size: off; fp32 temperature, top_p, min_p and penalties; a greedy request has no
    filters), or None for a greedy request without penalties (the greedy kernel). What else a request may ask for
    is refused by the gate (gate.request) or keeps it at one token per step (gate.burst)."""
    sp = sampling_params
    if sp is None:
        return None
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    penalties = (f32(sp.repetition_penalty), f32(sp.frequency_penalty), f32(sp.presence_penalty))
    if sp.temperature < GREEDY_TEMPERATURE:
        return BurstSampling(0.0, 0, 1.0, 0.0, *penalties) if penalties != (1.0, 0.0, 0.0) else None
    top_k = int(sp.top_k or 0)
    top_k = 0 if top_k <= 0 or top_k >= vocab_size else top_k
    top_p = f32(sp.top_p)
    return BurstSampling(f32(sp.temperature), top_k, 1.0 if top_p == 1.0 else top_p, f32(sp.min_p), *penalties)

