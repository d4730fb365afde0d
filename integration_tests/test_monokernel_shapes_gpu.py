"""The monokernel against its torch reference on the shape classes the derived tiling opened (no vLLM needed).

Two layers of each real shape (synthetic.SHAPES: the published hidden / heads / KV heads / head dim / FFN /
vocabulary): rows split unevenly over their warps (hidden 2560, 3584, 896, 1536; FFN 9728, 18944, 8960, 4864),
enlarged ring slots (down rows of FFN 17408 / 18944 / 25600 / 27648: 34-54 KiB slots, 3-5 of them), GQA 3, 5, 6, 7,
KV heads 2 and 4 (66 / 33 attention splits), Qwen2's QKV bias (N(0, 0.5^2), larger than the projection's
spread: a dropped or misplaced bias fails every qkv_out check), vocabularies 32768 to 152064. Fresh random
weights and K/V per case, every written buffer NaN-poisoned (test_monokernel_gpu's helpers), each stage of each
layer against torch from the kernel's own inputs, the K/V slot and nothing else written, the token the first
argmax of the kernel's logits, end to end against reference_step; then five K = 1 launches against a K = 5 launch
(the ring across tokens and layers with few, large slots).
"""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from kernel_gpu import burst_equals_steps, logits_follow_reference, require_sm90_extension  # noqa: E402

from kog_backend.monokernel import Monokernel, layout, reference, synthetic  # noqa: E402

pytestmark = pytest.mark.gpu

require_sm90_extension()

from test_monokernel_gpu import BS, DEV, MAX_CTX, NUM_BLOCKS, _check_step, _poison, _prepare  # noqa: E402

# shape -> the ring slot the plan must pick (bytes): kSlotBytes, or the longest row rounded up to 1 KiB
SHAPES = {
    "qwen3-4b": 32768,
    "qwen3-14b": 34816,
    "qwen3-32b": 51200,
    "qwen2.5-0.5b": 32768,
    "qwen2.5-coder-1.5b": 32768,
    "qwen2.5-coder-7b": 37888,
    "qwen2.5-coder-32b": 55296,
    "llama-3.2-3b": 32768,
    "mistral-7b": 32768,
}

_MODELS: dict = {}


def _model(name):
    if name not in _MODELS:
        _MODELS.clear()
        torch.cuda.empty_cache()
        arch, _, *rest = synthetic.SHAPES[name]
        s = synthetic.make_shape(arch, 2, *rest, max_position=MAX_CTX + 64)
        w = synthetic.random_decoder(s, DEV, seed=sum(map(ord, name)))
        caches = synthetic.paged_kv_caches(s, NUM_BLOCKS, BS, DEV)
        mk = Monokernel(w, caches, DEV, max_model_len=MAX_CTX + 16)
        _MODELS[name] = (w, caches, mk)
    return _MODELS[name]


@pytest.mark.parametrize("ctx", [1, 17, 1000, 4096])
@pytest.mark.parametrize("name", list(SHAPES))
def test_step_matches_reference(name, ctx):
    w, _, mk = _model(name)
    assert mk.plan.slot_bytes == SHAPES[name], mk.plan
    assert mk.plan.smem_bytes <= layout.CONFIG["kMaxSmemBytes"]
    assert all(lw.qkv_bias is not None for lw in w.layers) == (w.shape.arch == "qwen2")
    _step_case(name, ctx, {"attn_single_ctx": 0} if ctx % 2 else {})  # odd contexts: the split schedule, partials


@pytest.mark.parametrize("ctx", [1001, 4096])
@pytest.mark.parametrize("name,gqa", [("qwen3-14b", 5), ("qwen2.5-coder-1.5b", 6), ("qwen2.5-coder-7b", 7)])
def test_wide_attention_pass_on_gqa_5_to_7(name, gqa, ctx):
    """attn_mode kAttnModeMmaWide on the GQA ratios between its single-pass case (<= 4, as kAttnModeMma) and its
    full 8 columns: one pass of 5-7 query heads, the warps' states handed over 4 then 1-3 heads."""
    w, _, mk = _model(name)
    assert w.shape.num_heads // w.shape.num_kv_heads == gqa
    ov = {"attn_mode": layout.CONFIG["kAttnModeMmaWide"]}
    _step_case(name, ctx, {**ov, "attn_single_ctx": 0} if ctx % 2 else ov)


def _step_case(name, ctx, ov):
    w, caches, mk = _model(name)
    table = mk.variant_table(**ov) if ov else None
    splits = mk.attention_splits(ctx, **ov)
    seed = ctx * 7 + sum(map(ord, name))
    pos, slot, bt = _prepare(w, caches, ctx, seed)
    token = (seed * 7919) % w.shape.vocab_size
    logits_out = torch.empty(w.shape.vocab_size, dtype=torch.bfloat16, device=DEV) if ctx % 2 else None
    _poison(mk, logits_out)
    pre = [c.clone() for c in caches]
    tok = mk.step(torch.tensor([token], device=DEV), torch.tensor([pos], device=DEV), bt,
                  torch.tensor([slot], device=DEV), logits_out=logits_out, model_table=table)
    torch.cuda.synchronize()
    got_token = int(tok.item())
    errors: list[str] = []
    _check_step(w, caches, mk, token, pos, slot, bt, logits_out, errors, pre, got_token, splits,
                attn_mode=ov.get("attn_mode"))
    ref = reference.reference_step(w, pre, token, pos, slot, bt, splits)
    logits = (logits_out if logits_out is not None else mk.logits_scratch).float()
    rel = ((logits - ref["logits"].float()).norm() / ref["logits"].float().norm()).item()
    if rel > 2e-2:
        errors.append(f"end to end: logits relative error {rel:.2e} vs reference_step")
    top2 = ref["logits"].float().topk(2).values
    if (top2[0] - top2[1]).item() > 0.02 * top2[0].abs().item() and got_token != ref["token"]:
        errors.append(f"end to end: token {got_token} vs reference {ref['token']}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("name", ["qwen2.5-coder-7b", "qwen3-4b", "qwen2.5-coder-32b"])
def test_multi_token_launch_equals_single_steps(name):
    """Five K = 1 launches (each against reference_step fed the kernel's own tokens) and one K = 5 launch from the
    same caches give the same tokens and the same caches bit for bit."""
    w, caches, mk = _model(name)
    pos, _, bt = _prepare(w, caches, 101, 13)
    ref_caches = [c.clone() for c in caches]
    errors: list[str] = []
    burst_equals_steps(mk, caches, bt, pos, 321, 5, errors, BS, logits_follow_reference(w, mk, bt, ref_caches, errors))
    assert not errors, "\n".join(errors)
