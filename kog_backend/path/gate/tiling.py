"""The tiling plan (kog_backend.monokernel.plan): a shape the kernel's chunks, attention splits and shared memory
cannot cover, and the work area a top-k / top-p / min-p draw needs. Each reason names the config field.

plan.make_plan computes the plan and asks these functions at each step; a reason turns kog off for the server
(a filtered-draw reason only keeps such requests at one token per engine step).
"""

from __future__ import annotations

from typing import Any

# burst_sampling.cuh BurstSamplingConfig::kMaxGrid: blocks whose split-level rows the grid buffer holds.
SAMPLE_MAX_GRID = 256
# The MoE schedule's route (kog_backend.monokernel.moe_plan, docs/moe.md): one block holds the E router
# probabilities and picks the k experts; the loaders read the k expert ids. Sized for Qwen3-MoE (128 experts, 8 per
# token) with room for 256 x 8 (DeepSeek-class routers); the MoE kernel's constants take these bounds.
MOE_MAX_EXPERTS = 256
MOE_MAX_TOP_K = 8

REASONS = {
    "hidden_size": "hidden_size {hidden} (the norm covers multiples of 8 up to {most})",
    "heads": "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
    "kv_heads_sms": "num_key_value_heads {kv_heads} exceed the {sms} SMs (one attention split per SM at least)",
    "no_vocab_rows": "this rank holds no logical vocabulary rows (vocab_size)",
    "stage_input": "{field} {k}: the {stage} input length must be a multiple of 8 (16-byte GEMV vectors)",
    "stage_input_fp8": "{field} {k}: the {stage} input length must be a multiple of 16 with FP8 weights (16-byte "
                       "GEMV vectors of 16 float8 values)",
    "residual_rows": "{stage}: hidden_size {hidden} gives {rows} rows per block on {sms} SMs, more than the "
                     "{most}-row residual buffer",
    "slots": "shared memory: intermediate_size {intermediate} / hidden_size {hidden} need {work} B of input vector "
             "and {slot} B slots, room for {slots} weight slots (< {least})",
    "moe_experts": "num_experts {experts}: the route stage holds 1 to {most} router probabilities",
    "moe_top_k": "num_experts_per_tok {k}: the MoE schedule routes a power of two from 1 to {most} experts per "
                 "token, at most num_experts ({experts})",
    "moe_kernel": "head_dim {head_dim} with {group} query heads per KV head: the MoE kernel is built for head_dim 128 "
                  "and 3 or more query heads per KV head (Qwen3-MoE's shapes)",
    "filtered_grid": "top-k/top-p/min-p bursts: {grid} blocks, the split-level buffer holds {most}",
    "filtered_work": "top-k/top-p/min-p bursts: {rows} LM-head rows per block need {need} B of the {work} B work area",
}


def _config() -> dict[str, Any]:
    """The kernel's constants (monokernel.layout, from csrc/include/kog/config.cuh); imported on use, because the
    monokernel package imports the gate."""
    from kog_backend.monokernel.layout import CONFIG

    return CONFIG


def shape_reason(hidden: int, heads: int, kv_heads: int, sm_count: int, vocab_rows: int) -> str | None:
    c = _config()
    if hidden % 8 or hidden > c["kMaxHidden"]:
        return REASONS["hidden_size"].format(hidden=hidden, most=c["kMaxHidden"])
    if kv_heads < 1 or heads % kv_heads:
        return REASONS["heads"].format(heads=heads, kv_heads=kv_heads)
    if kv_heads > sm_count:
        return REASONS["kv_heads_sms"].format(kv_heads=kv_heads, sms=sm_count)
    if vocab_rows < 1:
        return REASONS["no_vocab_rows"]
    return None


def stage_input_reason(stage: str, field: str, k: int, elem_bytes: int = 2) -> str | None:
    """A stage's GEMV reads each weight row in 16-byte vectors: 8 bf16 (elem_bytes 2) or 16 float8 (elem_bytes 1,
    an FP8 model's layer stages)."""
    if elem_bytes == 1:
        if k < 16 or k % 16:
            return REASONS["stage_input_fp8"].format(field=field, k=k, stage=stage)
        return None
    if k < 8 or k % 8:
        return REASONS["stage_input"].format(field=field, k=k, stage=stage)
    return None


def residual_rows_reason(stage: str, hidden: int, rows: int, sm_count: int) -> str | None:
    """O and down preload the residual of every row a block owns."""
    c = _config()
    if rows > c["kMaxResidRows"]:
        return REASONS["residual_rows"].format(stage=stage, hidden=hidden, rows=rows, sms=sm_count,
                                               most=c["kMaxResidRows"])
    return None


def slots_reason(intermediate: int, hidden: int, work: int, slot: int, slots: int) -> str | None:
    c = _config()
    if slots < c["kMinSlots"]:
        return REASONS["slots"].format(intermediate=intermediate, hidden=hidden, work=work, slot=slot, slots=slots,
                                       least=c["kMinSlots"])
    return None


def moe_reason(experts: int, top_k: int) -> str | None:
    """The route stage's bounds (MOE_MAX_EXPERTS router probabilities in one block, MOE_MAX_TOP_K slots)."""
    if not 1 <= experts <= MOE_MAX_EXPERTS:
        return REASONS["moe_experts"].format(experts=experts, most=MOE_MAX_EXPERTS)
    if not 1 <= top_k <= min(MOE_MAX_TOP_K, experts) or top_k & (top_k - 1):
        # (a power of two: a row's k slots are k aligned lanes of one warp in the down stage's epilogue)
        return REASONS["moe_top_k"].format(k=top_k, most=MOE_MAX_TOP_K, experts=experts)
    return None


def moe_kernel_reason(head_dim: int, group: int) -> str | None:
    """The MoE kernel instantiation (csrc/monokernel.cu has_moe_kernel): head dim 128, the kHeadsPerPass pass width
    (plan.heads_per_pass: 3 or more query heads per KV head)."""
    if head_dim != 128 or group < 3:
        return REASONS["moe_kernel"].format(head_dim=head_dim, group=group)
    return None


def filtered_sampling_reason(grid: int, sample_rows: int, need: int, work_bytes: int) -> str | None:
    """A filtered draw keeps a level and a score per LM-head row of a block in the work area (need bytes), and one
    split-level row per block in a grid buffer (burst_sampling.cuh)."""
    if grid > SAMPLE_MAX_GRID:
        return REASONS["filtered_grid"].format(grid=grid, most=SAMPLE_MAX_GRID)
    if need > work_bytes:
        return REASONS["filtered_work"].format(rows=sample_rows, need=need, work=work_bytes)
    return None
