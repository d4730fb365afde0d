"""Run-ahead bursts: the next burst of a request decoding alone starts on the GPU before vLLM asks for it.

With K tokens per engine step the GPU still idles while vLLM's engine turns a burst into outputs and schedules
the next step (1.3-1.5 ms per step on the H200, docs/tuning.md `tokens_per_step`): ~45 us per token at K = 32, 6% of the
Llama-3.2-1B step. So right after a burst's launch (and after vLLM has queued the copy of its tokens to the host),
the runner queues the burst after it on the same stream: its input is the burst's last token, its positions the
K after the burst's, its KV slots the second K of the 2K - 1 look-ahead slots KogScheduler reserves, and it
runs only if the burst produced all K tokens (`launch_gate`: its count must reach K, checked by the kernel, so
the host never waits). When vLLM then schedules that next step, the runner takes the burst already computed (or
being computed) instead of launching one.

The run-ahead burst is only a guess that vLLM's next step will be exactly this one: the same request, at the
position right after the burst, for the same number of tokens. Anything else (a second request arrived, a stop
string ended the request, a prefill, a step that falls back to stock) abandons it: the host writes its id into a
pinned word the kernel reads before each token's hand-over (`cancel`), so it ends after at most one more token,
and the stock step queued behind it starts then. Its KV writes went to slots of the abandoned request past what
vLLM has accounted: every such slot is rewritten before it is read (a later step of the same request writes the
position again; a freed block's next owner writes its slots before reading them, after this kernel in stream
order). Its tokens are never handed to vLLM. Greedy or seeded-sampled bursts are the same tokens whether computed
ahead or on time (the kernel keys sampling by seed and position).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class BurstKey:
    """What identifies a burst: the request, the position of its first input token, and its length."""

    req_id: str
    position: int
    num_tokens: int


@dataclasses.dataclass
class RunAheadBurst:
    key: BurstKey
    launch_id: int
    tokens: torch.Tensor  # int64 [num_tokens], GPU
    count: torch.Tensor  # int32 [1], GPU: 0 when its gate stayed closed
    positions: torch.Tensor  # int64 [1], GPU: the position of its first input token
    defer: torch.Tensor | None = None  # int32 [1], GPU: a top-k/top-p/min-p draw left to vLLM's sampler (generate)


@dataclasses.dataclass
class PlannedLaunch:
    """A run-ahead launch waiting to be queued once vLLM has queued the copy of the current burst's tokens."""

    key: BurstKey
    input_ids: torch.Tensor  # int64 [1], GPU: the current burst's last token (a view)
    positions: torch.Tensor  # int64 [1], GPU
    block_table: torch.Tensor  # int32 [blocks], GPU: a copy of the request's row
    slot_mapping: torch.Tensor  # int64 [1], GPU
    gate: torch.Tensor  # int32 [1], GPU: the current burst's count
    gate_min: int  # the current burst's length
    stop_ids: torch.Tensor
    sample_seed: torch.Tensor | None
    sampling: Any = None  # burst_sampling.BurstSampling of a sampled request (None: greedy)
    penalty_rows: Any = None  # (prompt_mask, output_counts) of a penalised one: vLLM's PenaltiesState rows


def next_burst_key(key: BurstKey, next_len: int) -> BurstKey | None:
    """The burst after `key` if `key` produces all its tokens, or None when that next step would not be a burst
    (next_len: burst_length at the position after `key`; a step of one token is vLLM's to sample)."""
    if next_len < 2:
        return None
    return BurstKey(key.req_id, key.position + key.num_tokens, next_len)


def blocks_needed(key: BurstKey, block_size: int) -> int:
    """KV blocks a request must hold for `key`'s burst to write its last position."""
    return (key.position + key.num_tokens - 1) // block_size + 1


class RunAhead:
    """At most one run-ahead burst in flight. Not thread-safe (the runner's steps are sequential)."""

    def __init__(self, counters=None, cancel_word: torch.Tensor | None = None) -> None:
        # Pinned so that the kernel reads it while it runs (StepArgs::cancel); ids only grow, so writing one id
        # abandons that launch and every earlier one, never a later one. (cancel_word: for CPU tests.)
        if cancel_word is None:
            cancel_word = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self.cancel_word = cancel_word
        self._last_id = 0
        self.pending: RunAheadBurst | None = None
        self.planned: PlannedLaunch | None = None
        self.counters = counters  # kog_backend.path.counters.StepCounters, or None

    def take(self, key: BurstKey) -> RunAheadBurst | None:
        """The burst already launched for `key`, or None (and whatever was launched is abandoned)."""
        pending, self.pending = self.pending, None
        if pending is not None and pending.key == key:
            if self.counters is not None:
                self.counters.record_run_ahead(used=True)
            return pending
        if pending is not None:
            self._cancel(pending)
        return None

    def abandon(self) -> None:
        """Nothing launched ahead will be used (a stock step, a finished request, shutdown)."""
        self.planned = None
        if self.pending is not None:
            self._cancel(self.pending)
            self.pending = None

    def abandon_request(self, req_id: str) -> None:
        if self.pending is not None and self.pending.key.req_id == req_id:
            self.abandon()

    def plan(self, launch: PlannedLaunch) -> None:
        self.planned = launch

    def launch_planned(self, mk) -> None:
        """Queues the planned burst (mk: the Monokernel) on the current stream."""
        p, self.planned = self.planned, None
        if p is None:
            return
        self._last_id += 1
        draw = p.sampling.draw_kwargs(p.positions.device, p.penalty_rows) if p.sampling is not None else {}
        tokens, count = mk.generate(
            p.input_ids, p.positions, p.block_table, p.slot_mapping, p.key.num_tokens, stop_ids=p.stop_ids,
            sample_seed=p.sample_seed, launch_gate=p.gate, gate_min=p.gate_min,
            cancel=self.cancel_word, cancel_id=self._last_id, **draw,
        )  # fmt: skip
        self.pending = RunAheadBurst(p.key, self._last_id, tokens, count, p.positions, draw.get("defer_out"))

    def _cancel(self, burst: RunAheadBurst) -> None:
        self.cancel_word[0] = burst.launch_id  # read by the running kernel; ids only grow
        if self.counters is not None:
            self.counters.record_run_ahead(used=False)
