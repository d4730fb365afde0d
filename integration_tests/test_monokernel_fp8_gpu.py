"""The FP8-weight monokernel against its torch reference on an sm_90 GPU (no vLLM needed).

The four projections of every layer are float8 e4m3 with fp32 scales in each layout vLLM 0.26 loads (per tensor,
per output row, 128 x 128 blocks), quantised from fresh random bf16 weights (synthetic.random_decoder(fp8=...));
embedding, norms and LM head bf16. The reference dequantises every weight (reference/fp8_linear.py: float(w8) x
scale, fp32 sums, one bf16 rounding); the kernel sums 16-element products and scales them, so the two differ only
in the order of fp32 sums: the bounds are test_monokernel_gpu's (bf16 outputs |err| <= 1e-2 |ref| + 1e-2 rms(ref)
and 5e-3 relative norm per stage, teacher-forced from the kernel's own inputs; logits 2e-2 end to end). Every
buffer the kernel writes is NaN-poisoned first.

Both forms of the FP8 GEMV (ModelArgs::fp8_gemv: fp32 FMAs with a bf16 input; f16 FMA chains with the input as f16
scaled by 2^-8, whose sums sit ~4e-4 (relative norm) from the exact ones, tests/test_fp8_half_form.py) run every case
under the same bounds against the exact reference.

Cases: every layout x (Llama, head dim 64, GQA 4, tied) and (Qwen3, head dim 128, GQA 2, untied) at contexts 1, 17
and 1000; two layers of real shapes with long rows (Llama-3.1-8B: down rows of 14,336 bytes, 112 block scales a
row; Qwen3-4B: hidden 2560, a K that is no multiple of 512) per layout; a K = 5 launch against five K = 1 launches
and a sampled launch's tokens against the one-token launches' (the LM head stays bf16 in the FP8 kernel); an input
beyond the f16 form's range (|x| > 4096) in the input of QKV, O or down aborts an f16-form launch with no token and
names the projection, and the next launch after reset_counters is correct; the f16 form's O and down outputs against
the replay of its schedule (half_form_linear_fp32) on the kernel's own inputs.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernel_gpu import burst_equals_steps, require_sm90_extension  # noqa: E402

from kog_backend.monokernel import Monokernel, layout as mk_layout, reference, synthetic  # noqa: E402
from kog_backend.monokernel.host import SITE_FP8_RANGE  # noqa: E402
from kog_backend.path.model_spec import SCALE_FIELDS  # noqa: E402
from kog_backend.path.quant_format import LAYOUTS  # noqa: E402
from kog_backend.reference.fp8_linear import half_form_linear_fp32  # noqa: E402

pytestmark = pytest.mark.gpu

require_sm90_extension()

# (_prepare draws block tables over test_monokernel_gpu's NUM_BLOCKS: the caches here have as many blocks)
from test_monokernel_gpu import BS, MAX_CTX, NUM_BLOCKS, _buffers, _check_step, _poison, _prepare  # noqa: E402

DEV = torch.device("cuda", 0)

_MODELS: dict = {}

GEMVS = {"cuda_cores": mk_layout.CONFIG["kFp8GemvCudaCores"], "half": mk_layout.CONFIG["kFp8GemvHalf"]}


def _table(mk, gemv):
    """The argument table of FP8 GEMV form `gemv` (None: the model's own table where that is its default)."""
    code = GEMVS[gemv]
    return None if mk.table_value("fp8_gemv") == code else mk.variant_table(fp8_gemv=code)


def _model(key, shape, layout, seed):
    if key not in _MODELS:
        _MODELS.clear()
        torch.cuda.empty_cache()
        w = synthetic.random_decoder(shape, DEV, seed=seed, fp8=layout)
        caches = synthetic.paged_kv_caches(shape, NUM_BLOCKS, BS, DEV, "NHD")
        mk = Monokernel(w, caches, DEV, max_model_len=MAX_CTX + 16)
        _MODELS[key] = (w, caches, mk)
    return _MODELS[key]


def _small(arch, head_dim, gqa, tied, layout):
    heads = 2048 // head_dim
    s = synthetic.make_shape(arch, 2, 1536, heads, heads // gqa, head_dim, 3072, 32003, tied, MAX_CTX + 64)
    return _model(("small", arch, head_dim, gqa, layout), s, layout, seed=head_dim + gqa)


def _half_form_schedule(w, mk, errors, min_equal=0.95, max_rel=5e-4):
    """The f16 form's O and down projections against the replay of its schedule (fp8_linear.half_form_linear_fp32)
    on the kernel's own inputs (attn_out, act): at least min_equal of the bf16 outputs bit-equal (the replay sums the
    lanes' fp32 partials in another order, which flips a rounding now and then) and max_rel relative norm overall;
    the exact-product bounds of _check_step cannot tell a slightly wrong f16 schedule (an FTZ, a chain's order) from
    the right one."""
    for i, (lw, b) in enumerate(zip(w.layers, _buffers(mk))):
        for proj, src, out in (("o_proj", "attn_out", "o_out"), ("down", "act", "down_out")):
            ref = half_form_linear_fp32(b[src].float().cpu().to(torch.bfloat16), getattr(lw, proj).cpu(),
                                        getattr(lw, SCALE_FIELDS[proj]).cpu(), w.fp8)
            got = b[out].cpu()
            want = ref.to(torch.bfloat16)
            equal = float((got == want).float().mean())
            rel = float((got.float() - ref).norm() / ref.norm())
            if equal < min_equal or rel > max_rel:
                errors.append(f"layer {i} {proj}: f16 form {equal:.1%} bit-equal to its schedule's replay, "
                              f"relative error {rel:.1e}")


def _one_step(w, caches, mk, ctx, seed, token, errors, check_end_to_end=True, gemv=None, replay=True):
    """One launch (FP8 GEMV form `gemv`, None: the table's own) checked stage by stage; the f16 form also against
    its schedule's replay (replay: on the CPU in float64, seconds for the small shapes)."""
    table = _table(mk, gemv) if gemv is not None else None
    pos, slot, bt = _prepare(w, caches, ctx, seed)
    logits_out = torch.empty(w.shape.vocab_size, dtype=torch.bfloat16, device=DEV)
    _poison(mk, logits_out)
    pre = [c.clone() for c in caches]
    tok = mk.step(torch.tensor([token], device=DEV), torch.tensor([pos], device=DEV), bt,
                  torch.tensor([slot], device=DEV), logits_out=logits_out, model_table=table)
    torch.cuda.synchronize()
    got_token = int(tok.item())
    splits = mk.attention_splits(ctx)
    if _check_step(w, caches, mk, token, pos, slot, bt, logits_out, errors, pre, got_token, splits) is None:
        return
    if replay and w.fp8 is not None and (GEMVS[gemv] if gemv is not None else mk.table_value("fp8_gemv")) == GEMVS["half"]:
        _half_form_schedule(w, mk, errors)
    if check_end_to_end:
        ref = reference.reference_step(w, pre, token, pos, slot, bt, splits)
        rel = ((logits_out.float() - ref["logits"].float()).norm() / ref["logits"].float().norm()).item()
        if rel > 2e-2:
            errors.append(f"end to end: logits relative error {rel:.2e} vs reference_step")


@pytest.mark.parametrize("ctx", [1, 17, 1000])
@pytest.mark.parametrize("arch,head_dim,gqa,tied", [("llama", 64, 4, True), ("qwen3", 128, 2, False)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gemv", list(GEMVS))
def test_fp8_step_matches_reference(gemv, layout, arch, head_dim, gqa, tied, ctx):
    w, caches, mk = _small(arch, head_dim, gqa, tied, layout)
    assert w.fp8 == layout and w.layers[0].qkv.dtype == torch.float8_e4m3fn
    errors: list[str] = []
    _one_step(w, caches, mk, ctx, seed=ctx * 7 + head_dim, token=(ctx * 7919) % w.shape.vocab_size, errors=errors,
              gemv=gemv)
    assert not errors, "\n".join(errors)


# Two layers of real shapes: (arch, hidden, heads, kv heads, head dim, FFN, vocab, tied).
REAL = {
    "llama-3.1-8b": ("llama", 4096, 32, 8, 128, 14336, 128256, False),
    "qwen3-4b": ("qwen3", 2560, 32, 8, 128, 9728, 151936, True),
}


@pytest.mark.parametrize("name", list(REAL))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gemv", list(GEMVS))
def test_fp8_real_shape_layers(gemv, layout, name):
    arch, H, nh, nkv, D, I, V, tied = REAL[name]
    s = synthetic.make_shape(arch, 2, H, nh, nkv, D, I, V, tied, MAX_CTX + 64)
    w, caches, mk = _model(("real", name, layout), s, layout, seed=7)
    errors: list[str] = []
    _one_step(w, caches, mk, 300, seed=3, token=4242, errors=errors, check_end_to_end=False, gemv=gemv,
              replay=False)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gemv", list(GEMVS))
def test_fp8_multi_token_equals_single_steps(gemv, layout):
    """Five K = 1 launches, then one K = 5 launch from the same caches: the same tokens and caches bit for bit (the
    loader's scale spans move with the ring across layers, stages and tokens)."""
    w, caches, mk = _small("llama", 64, 4, True, layout)
    pos, _, bt = _prepare(w, caches, 41, 11)
    errors: list[str] = []
    burst_equals_steps(mk, caches, bt, pos, 123, 5, errors, BS, model_table=_table(mk, gemv))
    assert not errors, "\n".join(errors)


def _push_out_of_range(w, caches, where):
    """Makes one layer-0 projection input of the small Llama model exceed the f16 form's range; returns its undo.
    qkv: input_norm weights 1e5 (|x| up to ~1e5 sqrt(H)); o_proj: every V row of layer 0's cache 6e4 (the attention
    output is a convex mix of the context's V rows, 16 of 17 of them 6e4); down: the up rows' block scales x 1e4 (act
    = silu(gate) up)."""
    if where == "qkv":
        t, saved = w.layers[0].input_norm, w.layers[0].input_norm.clone()
        t.fill_(1e5)
    elif where == "o_proj":
        d = w.shape.head_dim
        t = caches[0][..., d:]  # V of every (block, KV head, position) row: [K | V] rows of 2 D
        saved = t.clone()
        t.fill_(6e4)
    else:
        s = w.layers[0].gate_up_scale  # block scales [ceil(2 I / 128), ceil(H / 128)]: rows [I / 128, ...) are up's
        t = s[w.shape.intermediate_size // 128 :]
        saved = t.clone()
        t.mul_(1e4)
    return lambda: t.copy_(saved)


@pytest.mark.parametrize("where", ["qkv", "o_proj", "down"])
def test_fp8_half_input_out_of_range_aborts(where):
    """An f16-form launch whose layer-0 input of one projection (the RMSNorm fill of QKV, the tagged fill of O, the
    copy fill of down) holds a value beyond the form's range reports no token and the site's diagnostic naming that
    projection; the CUDA-core form of the same launch completes (its input is bf16); after reset_counters and with
    the inputs restored, the f16-form launch matches the reference."""
    w, caches, mk = _small("llama", 64, 4, True, "block")
    table = _table(mk, "half")
    pos, slot, bt = _prepare(w, caches, 17, 5)
    args = (torch.tensor([77], device=DEV), torch.tensor([pos], device=DEV), bt, torch.tensor([slot], device=DEV))
    undo = _push_out_of_range(w, caches, where)
    try:
        num_out = torch.full((1,), -1, dtype=torch.int32, device=DEV)
        mk.step(*args, model_table=table, num_out=num_out)
        torch.cuda.synchronize()
        diag = mk.diagnostics()
        assert int(num_out.item()) == 0 and mk.status_word() == SITE_FP8_RANGE, (int(num_out.item()), diag)
        assert diag is not None and f"layer 0 {where} " in diag and "f16 form's range" in diag, diag
        mk.reset_counters()
        mk.step(*args, model_table=_table(mk, "cuda_cores"), num_out=num_out)
        torch.cuda.synchronize()
        assert int(num_out.item()) == 1 and mk.status_word() == 0 and mk.diagnostics() is None
    finally:
        undo()
        mk.reset_counters()
    errors: list[str] = []
    _one_step(w, caches, mk, 17, seed=5, token=77, errors=errors, gemv="half")
    assert not errors, "\n".join(errors)


def test_fp8_and_bf16_kernels_share_one_process():
    """An FP8 Monokernel and a bf16 one of the same shape, launched alternately: each matches its own reference
    (the instantiation follows the table, not whichever ran first)."""
    s = synthetic.make_shape("llama", 2, 1536, 24, 6, 64, 3072, 32003, True, MAX_CTX + 64)
    errors: list[str] = []
    for layout in (None, "block", None, "channel"):
        _MODELS.clear()
        torch.cuda.empty_cache()
        w = synthetic.random_decoder(s, DEV, seed=5, fp8=layout)
        caches = synthetic.paged_kv_caches(s, NUM_BLOCKS, BS, DEV, "NHD")
        mk = Monokernel(w, caches, DEV, max_model_len=MAX_CTX + 16)
        case: list[str] = []
        _one_step(w, caches, mk, 33, seed=9, token=77, errors=case)
        errors += [f"{layout or 'bf16'}: {e}" for e in case]
    assert not errors, "\n".join(errors)
