"""What Monokernel packs for a Qwen3-MoE model (the MoE kernel instantiation), on CPU tensors with the extension
and the GPU stood in for (test_fp8_monokernel_cpu's harness): the MoE fields of the argument table, the experts'
fused weights in the layer table, the buffers and counters the MoE stages use, and the instantiation launched."""

from __future__ import annotations

import pytest
import torch

from kog_backend.monokernel import layout, moe_plan, synthetic
from kog_backend.reference.moe_step import MoeShape
from test_fp8_monokernel_cpu import _layer_table, _monokernel

CPU = torch.device("cpu")


@pytest.mark.parametrize("moe", [MoeShape(8, 2, 128, False), MoeShape(16, 8, 128, True)])
def test_monokernel_packs_the_moe_table(monkeypatch, moe):
    shape = synthetic.make_shape("qwen3", 3, 256, 8, 2, 128, 512, 4096, False)
    w = synthetic.random_moe_decoder(shape, moe, CPU, seed=int(torch.randint(0, 1000, (1,))))
    mk, calls = _monokernel(monkeypatch, w, synthetic.paged_kv_caches(shape, 8, 16, CPU))
    v = layout.unpack_model(bytes(mk.model_table.numpy()))
    plan = moe_plan.make_moe_plan(shape, moe, 132)
    assert mk.moe_plan == plan and mk.plan == plan.kernel
    k, I, E, L = moe.top_k, moe.intermediate_size, moe.num_experts, shape.num_layers
    assert (v["moe_top_k"], v["moe_experts"], v["moe_norm_topk"], v["moe_inter"]) == (k, E, int(moe.norm_topk_prob), I)
    assert (v["moe_router_nu"], v["moe_router_chunks"]) == (plan.router.nu, plan.router.chunks)
    assert v["inter"] == k * I  # act holds every slot's
    # the expert stages are the table's gate/up and down stages
    assert v["stage_n"][2:4] == [k * I, k * shape.hidden_size] and v["stage_nu"][3] == plan.expert_down.nu
    assert v["stage_chunks"][2:4] == [plan.expert_gu.chunks, plan.expert_down.chunks]
    # counters: the dense ones, then a router count and a route per layer
    stride = layout.CONFIG["kCounterStride"]
    assert v["moe_ctr_base"] * stride == layout.num_counters(L, shape.num_kv_heads)
    assert mk.counters.numel() == (v["moe_ctr_base"] + 2 * L) * stride
    assert v["moe_routers"] == mk.moe_routers.data_ptr()
    assert mk.moe_routers.tolist() == [lw.router.data_ptr() for lw in w.layers]
    assert v["moe_logits"] == mk.moe_logits.data_ptr() and tuple(mk.moe_logits.shape) == (L, E)
    assert v["moe_route"] == mk.moe_route.data_ptr() and tuple(mk.moe_route.shape) == (L, 16)
    for row, lw, b in zip(_layer_table(mk), w.layers, mk.buffers):
        assert row["gate_up"] == lw.w13.data_ptr() and row["down"] == lw.w2.data_ptr()
        assert b["act"].numel() == k * I and row["act"] == b["act"].data_ptr()
    (launch,) = calls["launch"]
    assert launch[6:] == (1, False, mk.burst_counts, True)  # tp_size, fp8_weights, burst_counts, moe
    assert [c[-1] for c in calls["max_grid"]] == [True, True]


def test_dense_tables_carry_no_moe_fields(monkeypatch):
    w = synthetic.random_decoder(synthetic.make_shape("qwen3", 2, 256, 8, 2, 128, 512, 4096, False), CPU)
    mk, calls = _monokernel(monkeypatch, w, synthetic.paged_kv_caches(w.shape, 8, 16, CPU))
    v = layout.unpack_model(bytes(mk.model_table.numpy()))
    assert all(v[n] == 0 for n, _, _ in layout.MODEL_FIELDS if n.startswith("moe_"))
    assert mk.moe_plan is None and calls["launch"][0][-1] is False
