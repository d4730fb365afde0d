"""How one decode step is cut into chunks and attention splits for a given model shape and GPU.

Everything is derived from the shape; no list of accepted sizes. Per stage: K (input length), N (output units:
rows, or gate/up row pairs), nu (units per chunk: the largest power of two <= kConsumerWarps whose rows fit one
weight slot) and the number of chunks. A unit's row is split over kConsumerWarps / nu warps in 16-byte vectors
(gemv.cuh), so K needs only to be a multiple of 8 (bf16) or 16 (FP8). A row is K x elem_bytes bytes: 2 (bf16), or
1 for the four layer stages of an FP8 model (float8 e4m3 weights; make_plan's weight_bytes); the LM head is bf16 in
every model. An FP8 chunk's slot also holds, after its rows, the scales the chunk uses (fp8_tail_bytes,
csrc/include/kog/fp8.cuh). The slot is kSlotBytes unless one unit's row (and an FP8 tail) is
longer (a bf16 down row of FFN 17408 and up, or a bf16 gate/up pair of hidden 8192): then every slot of the launch
is that rounded up to kSlotAlign, and fewer slots fit. Whether a shape fits is the gate's decision
(kog_backend.path.gate.tiling): make_plan asks it at each step, and every refusal names the config field that
causes it.
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
    elem_bytes: int = 2  # bytes of one weight element: 2 (bf16), 1 (float8 e4m3: an FP8 model's layer stages)

    @property
    def bytes(self) -> int:
        """Weight bytes the stage streams (its scales not included)."""
        return self.n * self.k * self.elem_bytes * (2 if self.pair else 1)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of a slot one chunk uses: nu units' rows, then (FP8) its scale spans."""
        return chunk_bytes(self.k, self.nu, self.pair, self.elem_bytes)


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


FP8_BLOCK_LEN = 128  # fp8.cuh kFp8BlockLen: rows and columns of one 128 x 128 scale block


def fp8_span_bytes(k: int) -> int:
    """Slot bytes of one half's scale span in an FP8 chunk (fp8.cuh fp8_span_bytes): the scales a half can need
    (block: ceil(K / 128); per row: nu <= kConsumerWarps; per tensor: 1) plus up to 3 words either side, in 16-byte
    units."""
    words = max(-(-k // FP8_BLOCK_LEN), CONFIG["kConsumerWarps"])
    return (4 * words + 24 + 15) // 16 * 16


def fp8_tail_bytes(k: int, pair: bool) -> int:
    """Slot bytes an FP8 layer chunk needs after its rows (fp8.cuh fp8_tail_bytes): each half's scale span."""
    return (2 if pair else 1) * fp8_span_bytes(k)


def chunk_bytes(k: int, nu: int, pair: bool, elem_bytes: int) -> int:
    """Bytes of a slot a chunk of nu units takes: their rows (k elements of elem_bytes; a gate/up unit two rows),
    then, for FP8 rows (elem_bytes 1), the scale spans (fp8_tail_bytes)."""
    rows = nu * (2 if pair else 1) * k * elem_bytes
    return rows + (fp8_tail_bytes(k, pair) if elem_bytes == 1 else 0)


def units_per_chunk(k: int, rows_per_unit: int, slot_bytes: int = CONFIG["kSlotBytes"],
                    elem_bytes: int = 2) -> int | None:
    """Largest power-of-two nu <= kConsumerWarps whose chunk (nu units of rows_per_unit rows of k elements of
    elem_bytes bytes; with elem_bytes 1, an FP8 layer chunk, the scale tail too) fits one slot; None when a row is
    not a whole number of 16-byte vectors or one unit does not fit."""
    if k * elem_bytes < 16 or (k * elem_bytes) % 16:
        return None
    nu = CONFIG["kConsumerWarps"]
    while nu >= 1:
        if chunk_bytes(k, nu, rows_per_unit == 2, elem_bytes) <= slot_bytes:
            return nu
        nu //= 2
    return None


def slot_bytes_for(unit_bytes: int) -> int:
    """Ring slot for a shape whose longest unit (one row; a gate/up pair: two; an FP8 chunk of one unit: with its
    tail) is unit_bytes: kSlotBytes, or the unit rounded up to kSlotAlign."""
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


def make_plan(shape, sm_count: int, weight_bytes: int = 2, fp8_full_slots: bool = False) -> Plan | str:
    """The plan for `shape` (model_spec.DecoderShape) on a GPU with `sm_count` SMs, or why there is none (a reason
    that names the config field). weight_bytes: bytes of one element of the four layer projections, 2 (bf16) or 1
    (FP8: DecoderWeights.projection_bytes); the LM head is bf16 either way. fp8_full_slots (FP8 only; a benchmark
    variant until measured): slots of kSlotBytes plus the largest scale tail, so that an FP8 chunk holds kSlotBytes of
    rows (with kSlotBytes slots the tail halves nu: 16 KiB chunks for K = 4,096), at the price of fewer slots where
    the shared memory is short (Llama-3.1-8B: 5 instead of 6)."""
    if weight_bytes not in (1, 2):
        raise ValueError(f"weight_bytes {weight_bytes} (2: bf16, 1: FP8)")
    c = CONFIG
    H, D, I = shape.hidden_size, shape.head_dim, shape.intermediate_size
    nh, nkv = shape.num_heads, shape.num_kv_heads
    n_lm = lm_rows(shape)
    reason = tiling.shape_reason(H, nh, nkv, sm_count, n_lm)
    if reason is not None:
        return reason
    wb = weight_bytes
    specs = (  # (K, N, gate/up pairs, bytes per weight element)
        (H, (nh + 2 * nkv) * D, False, wb),  # qkv
        (nh * D, H, False, wb),  # o_proj
        (H, I, True, wb),  # gate/up pairs
        (I, H, False, wb),  # down
        (H, n_lm, False, 2),  # lm head: bf16 in every model
    )
    for name, field, (k, _, _, eb) in zip(STAGE_NAMES, STAGE_K_FIELDS, specs):
        reason = tiling.stage_input_reason(name, field, k, eb)
        if reason is not None:
            return reason
    slot = slot_bytes_for(max(chunk_bytes(k, 1, pair, eb) for k, _, pair, eb in specs))
    if fp8_full_slots and wb == 1:  # the tail rounded up to 128 bytes: slots stay 128-byte aligned (config.cuh)
        tail = max(fp8_tail_bytes(k, pair) for k, _, pair, eb in specs if eb == 1)
        slot = max(slot, c["kSlotBytes"] + -(-tail // 128) * 128)
    stages = []
    for k, n, pair, eb in specs:
        nu = units_per_chunk(k, 2 if pair else 1, slot, eb)
        assert nu is not None  # the slot holds the longest unit
        stages.append(StagePlan(k=k, n=n, nu=nu, chunks=math.ceil(n / nu), pair=pair, elem_bytes=eb))
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
