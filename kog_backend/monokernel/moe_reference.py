"""The MoE block as the MoE monokernel's schedule computes it (moe_plan), chunk by chunk, in torch: the buffers a
kernel test compares stage by stage. Each chunk computes its rows as kog_backend.reference.moe_step does for the
whole matrix (fp32 dot products, the same roundings), so the result is moe_step.moe_block's up to the summation order
inside each dot product; what this adds is the schedule: which slot and rows each chunk of router, expert_gu and expert_down covers, and that the slots' sum is
taken by the layer output's readers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from kog_backend.monokernel.moe_plan import MoePlan, expert_chunk
from kog_backend.monokernel.plan import StagePlan
from kog_backend.reference import moe_step
from kog_backend.reference.torch_step import silu_and_mul


@dataclasses.dataclass
class MoeStages:
    router_logits: torch.Tensor  # [E] bf16
    route: moe_step.Route
    act: torch.Tensor  # [k, I] bf16: silu(gate) * up of each slot's expert
    y: torch.Tensor  # [k, H] bf16: each slot's down projection scaled by its routing weight
    out: torch.Tensor  # [H] bf16: the slots' sum in slot order (what the layer output's readers add)


def _expert_chunks(stage: StagePlan, route: moe_step.Route) -> Iterator[tuple[int, int, slice]]:
    """(slot, its routed expert, the chunk's units) of each chunk of an expert stage, in chunk order."""
    for c in range(stage.chunks):
        s, first, units = expert_chunk(stage, c)
        yield s, int(route.experts[s]), slice(first, first + units)


def moe_block_stages(lw: moe_step.MoeLayerWeights, x: torch.Tensor, moe: moe_step.MoeShape, plan: MoePlan) -> MoeStages:
    """The MoE block on x [H] (the post-attention norm's output), every buffer written chunk by chunk in plan order.
    Buffers start as NaN: a unit no chunk writes stays NaN."""
    H, E, k, I = x.shape[0], moe.num_experts, moe.top_k, moe.intermediate_size
    dt = lw.w2.dtype
    logits = torch.full((E,), float("nan"), dtype=dt)
    for c in range(plan.router.chunks):  # one slot: expert_chunk gives the chunk's rows
        _, first, units = expert_chunk(plan.router, c)
        rows = slice(first, first + units)
        logits[rows] = (lw.router[rows].float() @ x.float()).to(dt)
    route = moe_step.route(logits, moe)
    act = torch.full((k, I), float("nan"), dtype=dt)
    for s, e, j in _expert_chunks(plan.expert_gu, route):
        gate = (lw.w13[e, :I][j].float() @ x.float()).to(dt)
        up = (lw.w13[e, I:][j].float() @ x.float()).to(dt)
        act[s, j] = silu_and_mul(torch.cat([gate, up]))
    y = torch.full((k, H), float("nan"), dtype=dt)
    for s, e, h in _expert_chunks(plan.expert_down, route):
        y[s, h] = ((lw.w2[e, h].float() @ act[s].float()) * route.weights[s]).to(dt)
    return MoeStages(router_logits=logits, route=route, act=act, y=y, out=moe_step.combine(y))
