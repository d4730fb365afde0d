"""How a Qwen3-MoE decode step is cut into chunks (the MoE kernel's schedule, csrc/include/kog/moe_stages.cuh;
docs/moe.md): the dense plan for attention, O and the LM head, and in place of the dense MLP three stages per layer.

  router       K = H, N = E rows: bf16 router logits; the last block to finish it routes (softmax, top-k,
               norm_topk_prob; moe_step.route) and publishes the k experts and their weights
  expert_gu    K = H, N = k I units, unit slot * I + j: row pair j of the slot's expert's w13 (gate row j, up row
               I + j); a chunk is nu pairs of one slot (the dense gate/up geometry for I = moe_intermediate_size), so
               the loader reads the route before it streams them
  expert_down  K = I, N = k H units, unit row * k + slot: row `row` of the slot's expert's w2; a chunk is R output
               rows of every slot (nu = R k units), so its epilogue has all k slot outputs of its rows: y_s =
               bf16(fp32 dot x weight_s), their sum in slot order in fp32, rounded once (moe_step.combine), and the
               residual, the dense down stage's outputs (down_out, rin_next)

The kernel's argument table carries expert_gu and expert_down as its gate/up and down stages (`kernel.stages`) and
the router's geometry in fields of its own (ModelArgs::moe_router_*).
"""

from __future__ import annotations

import dataclasses
import math

from kog_backend.monokernel.layout import CONFIG
from kog_backend.monokernel.plan import Plan, StagePlan, make_plan, slot_bytes_for, units_per_chunk
from kog_backend.path.gate import tiling
from kog_backend.reference.moe_step import MoeShape


@dataclasses.dataclass(frozen=True)
class MoePlan:
    kernel: Plan  # the launch (grid, splits, ring, work area); stages qkv, o, expert_gu, expert_down, lm_head
    router: StagePlan
    top_k: int
    inter: int  # I, moe_intermediate_size

    @property
    def expert_gu(self) -> StagePlan:
        return self.kernel.stages[2]

    @property
    def expert_down(self) -> StagePlan:
        return self.kernel.stages[3]

    @property
    def down_rows(self) -> int:
        """R: output rows per expert_down chunk (each with its k slots)."""
        return self.expert_down.nu // self.top_k

    @property
    def stages(self) -> tuple[StagePlan, ...]:
        """A MoE layer's stages in schedule order, then the LM head: qkv, o, router, expert_gu, expert_down, lm_head."""
        d = self.kernel.stages
        return (d[0], d[1], self.router, d[2], d[3], d[4])

    def layer_bytes(self) -> int:
        """Weight bytes one MoE layer streams per token: attention's projections, the router and k experts."""
        d = self.kernel.stages
        return d[0].bytes + d[1].bytes + self.router.bytes + self.expert_gu.bytes + self.expert_down.bytes

    def router_chunk(self, c: int) -> range:
        """The router rows chunk c covers."""
        _check(self.router, c)
        nu = self.router.nu
        return range(c * nu, min((c + 1) * nu, self.router.n))

    def gu_chunk(self, c: int) -> tuple[int, range]:
        """(slot, rows j of that slot's expert) of expert_gu chunk c."""
        _check(self.expert_gu, c)
        nu = self.expert_gu.nu
        slot, j = divmod(c * nu, self.inter)
        return slot, range(j, j + nu)

    def down_chunk(self, c: int) -> range:
        """The output rows expert_down chunk c covers (every slot's row of each)."""
        _check(self.expert_down, c)
        return range(c * self.down_rows, (c + 1) * self.down_rows)


def _check(stage: StagePlan, c: int) -> None:
    if not 0 <= c < stage.chunks:
        raise IndexError(f"chunk {c} of {stage.chunks}")


def make_moe_plan(shape, moe: MoeShape, sm_count: int) -> MoePlan | str:
    """The plan for a Qwen3-MoE `shape` (model_spec.DecoderShape; its intermediate_size is ignored) with experts
    `moe`, or why there is none (a reason naming the config field)."""
    dense = make_plan(dataclasses.replace(shape, intermediate_size=moe.intermediate_size), sm_count)
    if isinstance(dense, str):
        return dense.replace("intermediate_size", "moe_intermediate_size")
    reason = tiling.moe_reason(moe.num_experts, moe.top_k) or tiling.moe_kernel_reason(
        shape.head_dim, shape.num_heads // shape.num_kv_heads)
    if reason is not None:
        return reason
    c = CONFIG
    H, E, k, I = shape.hidden_size, moe.num_experts, moe.top_k, moe.intermediate_size
    nu = units_per_chunk(H, 1, dense.slot_bytes)
    assert nu is not None  # the dense qkv stage has rows of the same length
    router = StagePlan(k=H, n=E, nu=nu, chunks=math.ceil(E / nu), pair=False)
    gu = dense.stages[2]
    assert I % gu.nu == 0  # I is a multiple of 8 (the dense down stage's input), nu a power of two <= 8
    expert_gu = StagePlan(k=H, n=k * I, nu=gu.nu, chunks=k * I // gu.nu, pair=True)
    # R rows x k slots of I elements per down chunk: the most rows (R k <= kConsumerWarps) whose rows fit a slot
    slot = max(dense.slot_bytes, slot_bytes_for(k * I * 2))
    rows = c["kConsumerWarps"] // k
    while rows > 1 and rows * k * I * 2 > slot:
        rows //= 2
    assert H % rows == 0  # H is a multiple of 8 (the norm's vectors)
    expert_down = StagePlan(k=I, n=k * H, nu=rows * k, chunks=H // rows, pair=False)
    reason = tiling.residual_rows_reason("down", H, math.ceil(expert_down.chunks / sm_count) * rows, sm_count)
    if reason is not None:
        return reason
    # the work area holds the down stage's input: every slot's act (k I bf16)
    work = max(dense.work_bytes, (k * I * 2 + 127) // 128 * 128)
    slots = min(c["kMaxSlots"], (c["kMaxSmemBytes"] - c["kHeaderBytes"] - work) // slot)
    reason = tiling.slots_reason(k * I, H, work, slot, slots)
    if reason is not None:
        return reason.replace("intermediate_size", "num_experts_per_tok x moe_intermediate_size")
    kernel = dataclasses.replace(
        dense,
        stages=(dense.stages[0], dense.stages[1], expert_gu, expert_down, dense.stages[4]),
        num_slots=slots,
        work_bytes=work,
        smem_bytes=c["kHeaderBytes"] + work + slots * slot,
        slot_bytes=slot,
    )
    return MoePlan(kernel=kernel, router=router, top_k=k, inter=I)
