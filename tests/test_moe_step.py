"""The torch reference of the Qwen3-MoE decode step (kog_backend.reference.moe_step) against Hugging Face
transformers' Qwen3MoeForCausalLM on tiny random models: 2 layers, 8 or 16 experts, top-2 or top-8, norm_topk_prob
on and off, fresh weights per case.

Each sequence is decoded one position at a time through a paged CPU cache with a shuffled block table; the logits
at every position are compared with HF's full-sequence forward, and each layer's routing with HF's router logits
(output_router_logits). In float32 the two differ only in summation order: routes and routing weights agree and
the logits are within a relative 1e-5 (measured: at most 1.2e-6 per position over 80 fresh models of these cases).
In bf16 the reference follows vLLM's roundings (router logits in bf16) while HF runs in fp32, so a top-k boundary
that HF sees as a near-tie may fall the other way and that position's MLP changes by a whole expert (measured: up
to 0.32 relative error of such a position's logits). The bf16 test therefore requires (a) every differing route to
be explained by the drift of the router logits: HF's gap between its k-th and (k+1)-th logit at most the spread of
(HF's log-softmax - the reference's), which any flip implies (a fixed gap bound, 0.5, was exceeded once, 0.5003, in
a few hundred fresh models), (b) at least half the positions routed as HF routes them, (c) the logits of those
positions within a relative 0.15 of HF's over the sequence. Measured over 160 fresh models (40 per case, 20
positions): relative error at most 0.079, at least 15 of 20 positions routed as HF.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_moe_models import moe_weights_from_hf, tiny_hf_moe_model  # noqa: E402
from kog_backend.path import model_spec  # noqa: E402
from kog_backend.reference import moe_step, torch_step  # noqa: E402

BLOCK_SIZE = 16  # vLLM's default; the gate's tested sizes start there
SEQ_LEN = 20  # a prompt's worth of positions and a few decode steps; crosses a block, ends mid-block
CASES = [(8, 2, True), (8, 2, False), (16, 8, True), (16, 8, False)]  # experts, top-k, norm_topk_prob


def _paged_caches(shape: model_spec.DecoderShape, num_blocks: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """vLLM's flash layout: logical [blocks, kv_heads, block, 2D] over NHD memory; poisoned with NaN."""
    return [torch.full((num_blocks, BLOCK_SIZE, shape.num_kv_heads, 2 * shape.head_dim), float("nan"), dtype=dtype)
            .permute(0, 2, 1, 3) for _ in range(shape.num_layers)]


def _decode(weights: moe_step.MoeDecoderWeights, tokens: torch.Tensor, dtype: torch.dtype):
    """Logits [T, V] (fp32 copy) and each position's routes (one per layer), decoded one position at a time."""
    num_blocks = 8
    caches = _paged_caches(weights.shape, num_blocks, dtype)
    used = (len(tokens) + BLOCK_SIZE - 1) // BLOCK_SIZE
    block_table = torch.zeros(num_blocks, dtype=torch.int32)  # vLLM's rows are padded to max blocks per request
    block_table[:used] = torch.randperm(num_blocks - 1)[:used] + 1
    logits, routes = [], []
    with torch.no_grad():
        for pos in range(len(tokens)):
            slot = int(block_table[pos // BLOCK_SIZE]) * BLOCK_SIZE + pos % BLOCK_SIZE
            r: list[moe_step.Route] = []
            h = moe_step.decode_hidden(weights, caches, torch_step.embed(weights, int(tokens[pos])), pos, slot,
                                       block_table, pos + 1 + 3, r)
            logits.append(torch_step.logits(weights, h).float())
            routes.append(r)
    return torch.stack(logits), routes


def _hf(num_experts: int, top_k: int, norm: bool, tied: bool):
    hf = tiny_hf_moe_model(num_experts, top_k, norm, tied, head_dim=64 if tied else 128)
    tokens = torch.randint(0, hf.config.vocab_size, (SEQ_LEN,))
    with torch.no_grad():
        out = hf(tokens[None], output_router_logits=True)
    return hf, tokens, out.logits[0].float(), [r.float() for r in out.router_logits]  # [T, V], L x [T, E]


def _hf_route(router_logits: torch.Tensor, top_k: int, norm: bool) -> tuple[set[int], dict[int, float]]:
    """HF's routing of one token (Qwen3MoeTopKRouter): softmax in fp32, torch.topk, renormalised when norm."""
    p = torch.softmax(router_logits.float(), dim=-1)
    w, idx = torch.topk(p, top_k)
    if norm:
        w = w / w.sum()
    return set(idx.tolist()), dict(zip(idx.tolist(), w.tolist()))


@pytest.mark.parametrize("num_experts,top_k,norm", CASES)
@pytest.mark.parametrize("tied", [True, False])
def test_fp32_matches_hf_logits_and_routes(num_experts, top_k, norm, tied):
    hf, tokens, ref, router_logits = _hf(num_experts, top_k, norm, tied)
    got, routes = _decode(moe_weights_from_hf(hf, torch.float32), tokens, torch.float32)
    assert torch.isfinite(got).all()
    for pos, per_layer in enumerate(routes):
        assert len(per_layer) == hf.config.num_hidden_layers
        for layer, r in enumerate(per_layer):
            experts, weights = _hf_route(router_logits[layer][pos], top_k, norm)
            assert set(r.experts.tolist()) == experts, (pos, layer)
            for e, w in zip(r.experts.tolist(), r.weights.tolist()):
                assert w == pytest.approx(weights[e], rel=1e-5, abs=1e-7)
            assert bool((r.weights[:-1] >= r.weights[1:]).all())  # decreasing, as vLLM's kernel writes them
            assert float(r.weights.sum()) == pytest.approx(1.0 if norm else float(r.probs[r.experts].sum()), rel=1e-6)
    rel = (got - ref).norm() / ref.norm()
    assert rel < 1e-5, f"relative error {rel:.2e}"
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("num_experts,top_k,norm", CASES)
def test_bf16_matches_hf_up_to_routing_near_ties(num_experts, top_k, norm):
    hf, tokens, ref, router_logits = _hf(num_experts, top_k, norm, tied=True)
    got, routes = _decode(moe_weights_from_hf(hf, torch.bfloat16), tokens, torch.bfloat16)
    assert torch.isfinite(got).all()
    agree = torch.ones(SEQ_LEN, dtype=torch.bool)
    for pos, per_layer in enumerate(routes):
        for layer, r in enumerate(per_layer):
            logits = router_logits[layer][pos]
            if set(r.experts.tolist()) != _hf_route(logits, top_k, norm)[0]:
                # Routes can differ only where the router logits (each side's, up to the softmax's constant) moved
                # by more than HF's gap between its k-th and (k+1)-th: for an expert a that HF takes and the
                # reference does not, and b the other way, (lh - lr)[a] - (lh - lr)[b] >= lh[a] - lh[b] >= gap.
                top = logits.float().sort(descending=True).values
                gap = float(top[top_k - 1] - top[top_k])
                moved = torch.log_softmax(logits.float(), -1) - torch.log(r.probs)
                spread = float(moved.max() - moved.min())
                assert gap <= spread, (f"position {pos} layer {layer}: routed differently at a logit gap of "
                                       f"{gap:.3f} while the router logits moved by at most {spread:.3f}")
                agree[pos] = False
    assert agree.sum() >= SEQ_LEN // 2
    rel = (got[agree] - ref[agree]).norm() / ref[agree].norm()
    assert rel < 0.15, f"relative error {rel:.2e} over the {int(agree.sum())} positions routed as HF routes them"


def _shape(num_experts: int, top_k: int, norm: bool) -> moe_step.MoeShape:
    return moe_step.MoeShape(num_experts=num_experts, top_k=top_k, intermediate_size=4, norm_topk_prob=norm)


def test_route_breaks_ties_to_the_lower_expert_index():
    """Equal probabilities go to the lower index, in decreasing order of probability (vLLM's topk_softmax)."""
    logits = torch.tensor([0.5, 2.0, -1.0, 2.0, 2.0, 1.0, 2.0, 0.0])
    r = moe_step.route(logits, _shape(8, 3, False))
    assert r.experts.tolist() == [1, 3, 4]
    r = moe_step.route(logits.flip(0), _shape(8, 3, False))
    assert r.experts.tolist() == [1, 3, 4]  # flipped: the 2.0s sit at 1, 3, 4, 6
    r = moe_step.route(torch.tensor([1.0, 3.0, 1.0, 1.0]), _shape(4, 3, True))
    assert r.experts.tolist() == [1, 0, 2]


def test_route_weights_and_normalisation():
    logits = torch.tensor([1.0, 0.0, 3.0, 2.0], dtype=torch.bfloat16)
    p = torch.softmax(logits.float(), dim=-1)
    r = moe_step.route(logits, _shape(4, 2, False))
    assert r.experts.tolist() == [2, 3] and torch.equal(r.weights, p[[2, 3]]) and r.weights.dtype == torch.float32
    r = moe_step.route(logits, _shape(4, 2, True))
    assert torch.allclose(r.weights, p[[2, 3]] / p[[2, 3]].sum()) and float(r.weights.sum()) == pytest.approx(1.0)


def test_w13_rows_are_gate_then_up():
    """One expert chosen with weight 1: the block is down(silu(rows [0, I) . x) * (rows [I, 2I) . x))."""
    torch.manual_seed(0)
    H, I, E = 8, 4, 2
    gate, up, down = torch.randn(I, H), torch.randn(I, H), torch.randn(H, I)
    lw = moe_step.MoeLayerWeights(
        input_norm=torch.ones(H), qkv=torch.zeros(1, H), q_norm=torch.ones(1), k_norm=torch.ones(1),
        o_proj=torch.zeros(H, 1), post_norm=torch.ones(H), router=torch.stack([torch.zeros(H), torch.ones(H) * 9]),
        w13=torch.stack([torch.zeros(2 * I, H), torch.cat([gate, up])]), w2=torch.stack([torch.zeros(H, I), down]),
    )  # fmt: skip
    x = torch.rand(H) + 0.5  # router logit of expert 1 = 9 * sum(x) >> 0: it takes all the weight
    out = moe_step.moe_block(lw, x, _shape(E, 1, True))
    want = down @ (torch.nn.functional.silu(gate @ x) * (up @ x))
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
    swapped = down @ (torch.nn.functional.silu(up @ x) * (gate @ x))
    assert not torch.allclose(out, swapped, rtol=1e-2, atol=1e-3)


def test_combine_sums_in_fp32_and_rounds_once():
    """The slot sum accumulates in fp32 and rounds once (vLLM's moe_sum kernels): 256 + 1 + 1 gives 258, where a bf16
    accumulator (each addition rounded) stays at 256."""
    y = torch.tensor([[256.0], [1.0], [1.0]], dtype=torch.bfloat16)
    assert float(moe_step.combine(y)[0]) == 258.0
    acc = y[0]
    for v in y[1:]:
        acc = (acc.float() + v.float()).to(torch.bfloat16)
    assert float(acc[0]) == 256.0


def test_silu_and_mul_op_rounds_silu_first():
    """vLLM's silu_and_mul op rounds silu(gate) to bf16 before the product: on random rows it differs from the single
    rounding of the dense step's torch_step.silu_and_mul in some elements, by at most one bf16 ulp of the product
    (relative 2^-7), and equals the two-rounding formula everywhere."""
    g = torch.Generator().manual_seed(7)
    gate_up = (torch.randn(2, 4096, generator=g) * 3).to(torch.bfloat16)
    got = moe_step.silu_and_mul_op(gate_up)
    gate, up = gate_up.float().chunk(2, dim=-1)
    silu = torch.nn.functional.silu(gate).to(torch.bfloat16).float()
    assert torch.equal(got, (silu * up).to(torch.bfloat16))
    once = torch_step.silu_and_mul(gate_up)
    differ = got != once
    assert 0 < int(differ.sum()) < got.numel() // 2
    assert torch.allclose(got.float(), once.float(), rtol=2**-7, atol=0)
