"""The MoE monokernel's schedule (kog_backend.monokernel.moe_plan) and its chunk-by-chunk reference
(moe_reference): every expert row of every slot belongs to exactly one chunk, the plan's bytes agree with the
benchmark's weight-bytes estimate, bad router configs get a reason, and the block computed chunk by chunk is
moe_step's."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch

from kog_backend.monokernel import moe_plan, moe_reference
from kog_backend.monokernel.synthetic import make_shape
from kog_backend.path.model_spec import DecoderShape
from kog_backend.reference import moe_step, torch_step
from kog_backend.tools.fixtures.shapes import SHAPES, weight_bytes_per_token

SMS = 132  # H100 / H200


def _shapes(name: str) -> tuple[DecoderShape, moe_step.MoeShape]:
    c = SHAPES[name]
    shape = make_shape("qwen3", c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
                       c["num_key_value_heads"], c["head_dim"], c["intermediate_size"], c["vocab_size"],
                       c["tie_word_embeddings"], c["max_position_embeddings"])  # fmt: skip
    moe = moe_step.MoeShape(num_experts=c["num_experts"], top_k=c["num_experts_per_tok"],
                            intermediate_size=c["moe_intermediate_size"], norm_topk_prob=c["norm_topk_prob"])
    return shape, moe


MOE_SHAPES = ["qwen3-30b-a3b", "tiny-qwen3-moe-e8", "tiny-qwen3-moe-e16"]


@pytest.mark.parametrize("name", MOE_SHAPES)
def test_every_expert_unit_of_every_slot_in_exactly_one_chunk(name):
    shape, moe = _shapes(name)
    plan = moe_plan.make_moe_plan(shape, moe, SMS)
    assert isinstance(plan, moe_plan.MoePlan), plan
    assert [s.k for s in plan.stages] == [shape.hidden_size, shape.num_heads * shape.head_dim, shape.hidden_size,
                                          shape.hidden_size, moe.intermediate_size, shape.hidden_size]  # fmt: skip
    assert plan.router.n == moe.num_experts and plan.expert_gu.pair and not plan.expert_down.pair
    k, I, H = moe.top_k, moe.intermediate_size, shape.hidden_size
    router = torch.zeros(moe.num_experts, dtype=torch.int64)
    for c in range(plan.router.chunks):
        router[list(plan.router_chunk(c))] += 1
    gu = torch.zeros(k, I, dtype=torch.int64)
    for c in range(plan.expert_gu.chunks):
        slot, rows = plan.gu_chunk(c)
        assert len(rows) == plan.expert_gu.nu
        gu[slot, list(rows)] += 1
    down = torch.zeros(H, dtype=torch.int64)
    for c in range(plan.expert_down.chunks):
        rows = plan.down_chunk(c)
        assert len(rows) * k == plan.expert_down.nu <= 8
        down[list(rows)] += 1
    assert bool((router == 1).all()) and bool((gu == 1).all()) and bool((down == 1).all())
    for st, chunk in ((plan.router, plan.router_chunk), (plan.expert_gu, plan.gu_chunk),
                      (plan.expert_down, plan.down_chunk)):  # fmt: skip
        with pytest.raises(IndexError):
            chunk(st.chunks)
        assert st.chunk_bytes <= plan.kernel.slot_bytes
    # the down stage's input (every slot's act) fits the work area, and the launch its shared memory
    assert k * I * 2 <= plan.kernel.work_bytes and plan.kernel.smem_bytes <= 227 * 1024


@pytest.mark.parametrize("name", MOE_SHAPES)
def test_down_epilogue_meets_a_rows_slots_in_one_warp(name):
    """moe_stages.cuh's down epilogue sums a row's k slot outputs by shuffles: in consume_chunks' batched epilogue
    thread q = (chunk of the batch) nu + unit runs unit row * k + slot, so the k units of a row must be k aligned
    lanes of one warp, every one of them valid (no unit past N skips the shuffle)."""
    shape, moe = _shapes(name)
    plan = moe_plan.make_moe_plan(shape, moe, SMS)
    d, k = plan.expert_down, moe.top_k
    assert d.nu % k == 0 and d.nu <= 8 and 32 % d.nu == 0 and d.n == d.chunks * d.nu == k * shape.hidden_size
    batch = 8  # kEpilogueBatch chunks: threads 0 .. 8 nu - 1
    for q in range(batch * d.nu):
        unit = q % d.nu
        first = q - unit % k  # the lane of the row's slot 0
        assert first % k == 0 and first // 32 == (first + k - 1) // 32


def test_qwen3_30b_a3b_bytes_per_token():
    """The plan's streamed bytes plus the embedding row and the final norm equal the benchmark's estimate
    (tools.fixtures.shapes.weight_bytes_per_token: 6.08 GB, the router and 8 of 128 experts per layer)."""
    shape, moe = _shapes("qwen3-30b-a3b")
    plan = moe_plan.make_moe_plan(shape, moe, SMS)
    H, L = shape.hidden_size, shape.num_layers
    D = shape.head_dim
    norms = L * (2 * H + 2 * D) * 2 + H * 2  # input / post norms, q / k norms, final norm (bf16)
    streamed = L * plan.layer_bytes() + plan.stages[-1].bytes
    assert streamed + norms + H * 2 == weight_bytes_per_token("qwen3-30b-a3b")
    # 8 x 768 row pairs in chunks of 4, and 2,048 output rows, each chunk one row of the 8 slots (12 KiB)
    assert (plan.expert_gu.chunks, plan.expert_gu.nu) == (8 * 768 // 4, 4)
    assert (plan.expert_down.chunks, plan.down_rows) == (2048, 1)


@pytest.mark.parametrize(
    "experts,top_k,field",
    [(300, 8, "num_experts"), (0, 1, "num_experts"), (128, 9, "num_experts_per_tok"), (4, 6, "num_experts_per_tok"),
     (16, 0, "num_experts_per_tok"), (128, 6, "num_experts_per_tok")],
)  # fmt: skip
def test_router_configs_the_route_stage_cannot_hold(experts, top_k, field):
    shape, moe = _shapes("tiny-qwen3-moe-e16")
    got = moe_plan.make_moe_plan(shape, dataclasses.replace(moe, num_experts=experts, top_k=top_k), SMS)
    assert isinstance(got, str) and got.startswith(field), got


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 4, 128), (8, 2, 64)])
def test_shapes_without_a_moe_kernel(heads, kv_heads, head_dim):
    shape, moe = _shapes("tiny-qwen3-moe-e16")
    shape = dataclasses.replace(shape, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
    got = moe_plan.make_moe_plan(shape, moe, SMS)
    assert isinstance(got, str) and got.startswith(f"head_dim {head_dim} with {heads // kv_heads} query heads"), got


def test_dense_refusals_name_the_moe_field():
    shape, moe = _shapes("tiny-qwen3-moe-e8")
    got = moe_plan.make_moe_plan(shape, dataclasses.replace(moe, intermediate_size=100), SMS)
    assert isinstance(got, str) and "moe_intermediate_size 100" in got, got


@pytest.mark.parametrize("name", ["tiny-qwen3-moe-e8", "tiny-qwen3-moe-e16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_chunked_block_is_moe_step(name, seed):
    shape, moe = _shapes(name)
    plan = moe_plan.make_moe_plan(shape, moe, SMS)
    g = torch.Generator().manual_seed(seed)
    H, E, I = shape.hidden_size, moe.num_experts, moe.intermediate_size

    def w(*size):
        return (torch.randn(*size, generator=g) * 0.05).to(torch.bfloat16)

    lw = moe_step.MoeLayerWeights(
        input_norm=w(H), qkv=w(8, H), q_norm=w(4), k_norm=w(4), o_proj=w(H, 8), post_norm=w(H),
        router=w(E, H) * 20, w13=w(E, 2 * I, H), w2=w(E, H, I),
    )  # fmt: skip
    x = torch.randn(H, generator=g).to(torch.bfloat16)
    got = moe_reference.moe_block_stages(lw, x, moe, plan)
    assert not any(bool(t.isnan().any()) for t in (got.router_logits, got.act, got.y, got.out))
    r = moe_step.route(torch_step.linear(x, lw.router), moe)
    assert torch.equal(got.route.experts, r.experts)
    # Row by row the same fp32 dot products as moe_step's whole-matrix ones, up to the summation order inside them:
    # within one bf16 rounding step.
    torch.testing.assert_close(got.y, moe_step.expert_outputs(x, lw.w13, lw.w2, r), rtol=8e-3, atol=1e-5)
    torch.testing.assert_close(got.out, moe_step.moe_block(lw, x, moe), rtol=1.6e-2, atol=2e-5)


def test_route_bounds_are_the_kernels():
    """tiling's MOE_MAX_EXPERTS / MOE_MAX_TOP_K are moe_route.cuh's kMoeMaxExperts / kMoeMaxTopK (the route's
    device function is in no extension the host loads at start, so the layout check cannot compare them)."""
    from kog_backend.path.gate import tiling

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "csrc", "include", "kog", "moe_route.cuh")).read()
    got = {name: int(v) for name, v in re.findall(r"constexpr int (kMoeMax\w+) = (\d+);", text)}
    assert got == {"kMoeMaxExperts": tiling.MOE_MAX_EXPERTS, "kMoeMaxTopK": tiling.MOE_MAX_TOP_K}
