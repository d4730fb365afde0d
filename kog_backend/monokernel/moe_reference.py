"""The MoE block as the MoE kernel's schedule computes it (moe_plan), chunk by chunk, in torch: the buffers a kernel
test compares stage by stage. Each chunk computes its rows as kog_backend.reference.moe_step does for the whole
matrix (fp32 dot products, the same roundings), so the result is moe_step.moe_block's up to the summation order
inside each dot product; what this adds is the schedule: which slot and rows each chunk of router, expert_gu and
expert_down covers, and that each down chunk sums its rows' k slot outputs.
"""

from __future__ import annotations

import dataclasses

import torch

from kog_backend.monokernel.moe_plan import MoePlan
from kog_backend.reference import moe_step


@dataclasses.dataclass
class MoeStages:
    router_logits: torch.Tensor  # [E] bf16
    route: moe_step.Route
    act: torch.Tensor  # [k, I] bf16: silu(gate) * up of each slot's expert (the kernel's act, slot-major)
    y: torch.Tensor  # [k, H] bf16: each slot's down projection scaled by its routing weight (not stored by the kernel)
    out: torch.Tensor  # [H] bf16: the slots' sum in slot order (the kernel's down_out)


def moe_block_stages(lw: moe_step.MoeLayerWeights, x: torch.Tensor, moe: moe_step.MoeShape, plan: MoePlan,
                     route: moe_step.Route | None = None) -> MoeStages:
    """The MoE block on x [H] (the post-attention norm's output), every buffer written chunk by chunk in plan order.
    Buffers start as NaN: a unit no chunk writes stays NaN. route: the experts to run (a kernel test passes the route
    of the kernel's own logits), default the route of these logits."""
    H, E, k, I = x.shape[0], moe.num_experts, moe.top_k, moe.intermediate_size
    dt = lw.w2.dtype
    xf = x.float()
    dev = x.device
    logits = torch.full((E,), float("nan"), dtype=dt, device=dev)
    for c in range(plan.router.chunks):
        rows = plan.router_chunk(c)
        logits[rows.start : rows.stop] = (lw.router[rows.start : rows.stop].float() @ xf).to(dt)
    if route is None:
        route = moe_step.route(logits, moe)
    act = torch.full((k, I), float("nan"), dtype=dt, device=dev)
    for c in range(plan.expert_gu.chunks):
        s, j = plan.gu_chunk(c)
        e = int(route.experts[s])
        gate = (lw.w13[e, j.start : j.stop].float() @ xf).to(dt)
        up = (lw.w13[e, I + j.start : I + j.stop].float() @ xf).to(dt)
        act[s, j.start : j.stop] = moe_step.silu_and_mul_op(torch.cat([gate, up]))
    y = torch.full((k, H), float("nan"), dtype=dt, device=dev)
    out = torch.full((H,), float("nan"), dtype=dt, device=dev)
    for c in range(plan.expert_down.chunks):
        h = plan.down_chunk(c)
        for s in range(k):
            e = int(route.experts[s])
            y[s, h.start : h.stop] = ((lw.w2[e, h.start : h.stop].float() @ act[s].float()) * route.weights[s]).to(dt)
        out[h.start : h.stop] = moe_step.combine(y[:, h.start : h.stop])
    return MoeStages(router_logits=logits, route=route, act=act, y=y, out=out)
