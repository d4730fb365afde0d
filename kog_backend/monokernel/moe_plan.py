"""How a Qwen3-MoE decode step is cut into chunks (the MoE monokernel's schedule, docs/moe.md): the dense plan for
attention, O and the LM head, and in place of the dense MLP three stages per layer.

  router       K = H, N = E rows: bf16 router logits; the last block to finish it routes (softmax, top-k,
               norm_topk_prob; moe_step.route) and publishes the k experts and their weights
  expert_gu    k slots x (K = H, N = I gate/up row pairs) of the routed experts' w13: slot s's chunks stream rows
               of w13[expert[s]], so the loader reads the route before it streams them
  expert_down  k slots x (K = I, N = H rows) of w2[expert[s]]: each chunk writes y[s][rows] =
               bf16(fp32 dot x weight[s]) (moe_step.expert_outputs); the slots' sum (moe_step.combine, bf16 in slot
               order) is taken by the readers of the layer's output (the next layer's norm and O epilogue, the
               final norm), as they add the residual

Every expert stage is per slot the dense GEMV of one expert's matrix, so its chunk geometry is the dense plan's
gate/up and down geometry for intermediate size I (moe_intermediate_size), repeated for each of the k slots
(expert_chunk).
"""

from __future__ import annotations

import dataclasses
import math

from kog_backend.monokernel.plan import Plan, StagePlan, make_plan, units_per_chunk
from kog_backend.path.gate import tiling
from kog_backend.reference.moe_step import MoeShape


@dataclasses.dataclass(frozen=True)
class MoePlan:
    dense: Plan  # grid, splits, ring, work area; its qkv / o / lm_head stages; its gate_up / down: one expert's
    router: StagePlan
    expert_gu: StagePlan  # n, nu: one expert's (the dense gate_up stage's); chunks: top_k x its chunks
    expert_down: StagePlan  # likewise of the dense down stage
    top_k: int

    @property
    def stages(self) -> tuple[StagePlan, ...]:
        """A MoE layer's stages in schedule order, then the LM head: qkv, o, router, expert_gu, expert_down, lm_head."""
        d = self.dense.stages
        return (d[0], d[1], self.router, self.expert_gu, self.expert_down, d[4])

    def layer_bytes(self) -> int:
        """Weight bytes one MoE layer streams per token: attention's projections, the router and k experts."""
        d = self.dense.stages
        experts = self.top_k * (self.expert_gu.bytes + self.expert_down.bytes)
        return d[0].bytes + d[1].bytes + self.router.bytes + experts


def expert_chunk(stage: StagePlan, c: int) -> tuple[int, int, int]:
    """Chunk c of an expert stage -> (slot, first unit, units): with per_slot = ceil(N / nu) chunks per slot, slot
    c // per_slot and units [j nu, min((j + 1) nu, N)) of that slot's expert matrix, j = c % per_slot. For the
    router (one slot) it is slot 0 and the chunk's rows."""
    if not 0 <= c < stage.chunks:
        raise IndexError(f"chunk {c} of {stage.chunks}")
    slot, j = divmod(c, math.ceil(stage.n / stage.nu))
    first = j * stage.nu
    return slot, first, min(stage.nu, stage.n - first)


def make_moe_plan(shape, moe: MoeShape, sm_count: int) -> MoePlan | str:
    """The plan for a Qwen3-MoE `shape` (model_spec.DecoderShape; its intermediate_size is ignored) with experts
    `moe`, or why there is none (a reason naming the config field)."""
    dense = make_plan(dataclasses.replace(shape, intermediate_size=moe.intermediate_size), sm_count)
    if isinstance(dense, str):
        return dense.replace("intermediate_size", "moe_intermediate_size")
    reason = tiling.moe_reason(moe.num_experts, moe.top_k)
    if reason is not None:
        return reason
    H = shape.hidden_size
    nu = units_per_chunk(H, 1, dense.slot_bytes)
    assert nu is not None  # the dense qkv stage has rows of the same length
    router = StagePlan(k=H, n=moe.num_experts, nu=nu, chunks=math.ceil(moe.num_experts / nu), pair=False)
    gu, down = dense.stages[2], dense.stages[3]
    return MoePlan(
        dense=dense,
        router=router,
        expert_gu=dataclasses.replace(gu, chunks=moe.top_k * gu.chunks),
        expert_down=dataclasses.replace(down, chunks=moe.top_k * down.chunks),
        top_k=moe.top_k,
    )
