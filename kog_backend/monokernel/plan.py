"""How one decode step is cut into chunks and attention splits for a given model shape and GPU.

Everything is derived from the shape; no list of accepted sizes. Per stage: K (input length), N (output units:
rows, or gate/up row pairs), nu (units per chunk: the largest power of two <= kConsumerWarps whose rows fit one
weight slot) and the number of chunks. A unit's row is split over kConsumerWarps / nu warps in 16-byte vectors
(gemv.cuh), so K needs only to be a multiple of 8. The slot is kSlotBytes unless one unit's row is longer (a down
row of FFN 17408 and up, or a gate/up pair of hidden 8192): then every slot of the launch is that row rounded up to
kSlotAlign, and fewer slots fit. Whether a shape fits is the gate's decision (kog_backend.path.gate.tiling):
make_plan asks it at each step, and every refusal names the config field that causes it.
"""

from __future__ import annotations

import dataclasses
import math

from kog_backend.monokernel.layout import CONFIG, STAGE_NAMES, attn_work_floats, sample_smem_bytes
from kog_backend.path.gate import tiling
from kog_backend.path.gate.tiling import SAMPLE_MAX_GRID  # noqa: F401  (re-exported: tests and tools read it here)


@dataclasses.dataclass(frozen=True)
class StagePlan:
    k: int
    n: int
    nu: int
    chunks: int
    pair: bool

    @property
    def bytes(self) -> int:
        return self.n * self.k * 2 * (2 if self.pair else 1)


@dataclasses.dataclass(frozen=True)
class Plan:
    grid: int
    num_splits: int
    heads_per_pass: int  # query heads per attention pass: the kernel instantiation (monokernel_step's heads_per_pass)
    num_slots: int
    work_bytes: int
    smem_bytes: int
    stages: tuple[StagePlan, ...]
    # LM-head rows of the block that owns the most (top-k / top-p / min-p draws keep a level and a score per row in
    # the work area, burst_sampling.cuh)
    sample_rows: int = 0
    slot_bytes: int = CONFIG["kSlotBytes"]  # bytes of one ring slot (ModelArgs::slot_bytes)

    @property
    def filtered_sampling_reason(self) -> str | None:
        """None when the work area holds a filtered draw's per-row state, else why not (such requests then run
        one token per engine step, with vLLM's sampler)."""
        return tiling.filtered_sampling_reason(self.grid, self.sample_rows, sample_smem_bytes(self.sample_rows),
                                               self.work_bytes)


def units_per_chunk(k: int, rows_per_unit: int, slot_bytes: int = CONFIG["kSlotBytes"]) -> int | None:
    """Largest power-of-two nu <= kConsumerWarps whose chunk (nu units of rows_per_unit rows of k bf16) fits one
    slot; None when k is not a whole number of 16-byte vectors or one unit does not fit."""
    if k < 8 or k % 8:
        return None
    nu = CONFIG["kConsumerWarps"]
    while nu >= 1:
        if nu * rows_per_unit * k * 2 <= slot_bytes:
            return nu
        nu //= 2
    return None


def slot_bytes_for(unit_bytes: int) -> int:
    """Ring slot for a shape whose longest unit (one row; a gate/up pair: two) is unit_bytes: kSlotBytes, or the unit
    rounded up to kSlotAlign."""
    c = CONFIG
    return max(c["kSlotBytes"], -(-unit_bytes // c["kSlotAlign"]) * c["kSlotAlign"])


# The config field each stage's input length comes from (refusal reasons name it).
STAGE_K_FIELDS = ("hidden_size", "num_attention_heads * head_dim", "hidden_size", "intermediate_size", "hidden_size")


def heads_per_pass(group: int) -> int:
    """Query heads per attention pass for `group` query heads per KV head: 2 up to GQA 2 (no empty heads
    computed), else kHeadsPerPass (GQA 4 in one pass, GQA 8 in two)."""
    return 2 if group <= 2 else CONFIG["kHeadsPerPass"]


def lm_rows(shape) -> int:
    """Rows of this rank's LM head that hold logical vocabulary entries (padded rows are never read)."""
    return max(0, min(shape.padded_vocab_local, shape.vocab_size - shape.vocab_start))


def make_plan(shape, sm_count: int) -> Plan | str:
    """The plan for `shape` (model_spec.DecoderShape) on a GPU with `sm_count` SMs, or why there is none (a reason
    that names the config field)."""
    c = CONFIG
    H, D, I = shape.hidden_size, shape.head_dim, shape.intermediate_size
    nh, nkv = shape.num_heads, shape.num_kv_heads
    n_lm = lm_rows(shape)
    reason = tiling.shape_reason(H, nh, nkv, sm_count, n_lm)
    if reason is not None:
        return reason
    specs = (
        (H, (nh + 2 * nkv) * D, False),  # qkv
        (nh * D, H, False),  # o_proj
        (H, I, True),  # gate/up pairs
        (I, H, False),  # down
        (H, n_lm, False),  # lm head
    )
    for name, field, (k, _, _) in zip(STAGE_NAMES, STAGE_K_FIELDS, specs):
        reason = tiling.stage_input_reason(name, field, k)
        if reason is not None:
            return reason
    slot = slot_bytes_for(max(k * 2 * (2 if pair else 1) for k, _, pair in specs))
    stages = []
    for k, n, pair in specs:
        nu = units_per_chunk(k, 2 if pair else 1, slot)
        assert nu is not None  # the slot holds the longest unit
        stages.append(StagePlan(k=k, n=n, nu=nu, chunks=math.ceil(n / nu), pair=pair))
    for st in (1, 3):  # O and down preload the residual of every row they own
        rows = math.ceil(stages[st].chunks / sm_count) * stages[st].nu
        reason = tiling.residual_rows_reason(STAGE_NAMES[st], H, rows, sm_count)
        if reason is not None:
            return reason
    max_k = max(H, nh * D, I)
    work = max(max_k * 2, attn_work_floats(D) * 4)
    work = (work + 127) // 128 * 128
    room = c["kMaxSmemBytes"] - c["kHeaderBytes"] - work
    slots = min(c["kMaxSlots"], room // slot)
    # A filtered draw's per-row state (burst_sampling.cuh) shares the work area: grown to hold it where that costs
    # no weight slot (the real shapes' work areas already hold it).
    sample_rows = math.ceil(stages[4].chunks / sm_count) * stages[4].nu
    need = (sample_smem_bytes(sample_rows) + 127) // 128 * 128
    if need > work and (c["kMaxSmemBytes"] - c["kHeaderBytes"] - need) // slot >= slots:
        work = need
    reason = tiling.slots_reason(I, H, work, slot, slots)
    if reason is not None:
        return reason
    splits = max(1, sm_count // nkv)
    return Plan(
        grid=sm_count,
        num_splits=splits,
        heads_per_pass=heads_per_pass(nh // nkv),
        num_slots=slots,
        work_bytes=work,
        smem_bytes=c["kHeaderBytes"] + work + slots * slot,
        stages=tuple(stages),
        sample_rows=sample_rows,
        slot_bytes=slot,
    )
