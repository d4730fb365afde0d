"""The MoE kernel instantiation (csrc/include/kog/moe_stages.cuh) against the MoE reference on an sm_90 GPU (no
vLLM needed). Fresh random weights and context per case; the kernel's scratch, router logits and routes poisoned
before each launch. Per layer, from the kernel's own inputs to the MoE block (teacher forcing, as
test_monokernel_gpu.py does for the dense stages):
  * router logits: moe_reference's chunks on the kernel's x within one bf16 rounding (rtol 1e-2, atol 1e-2 of the
    RMS; the fp32 sums run in another order);
  * route: the experts of moe_step.route on the kernel's own logits, in the same order, except where the k-th and
    (k+1)-th probabilities are within 1e-5 relative (a near tie the softmax's summation order may flip); weights
    within 1e-5 relative;
  * act (every slot's silu(gate) * up, on the kernel's route) within 2 bf16 ulps; down_out (the slots' sum) and
    rin_next = bf16(down_out + rmid) as the dense bounds;
and end to end the logits against moe_step's decode on a copy of the caches within 5e-2 relative norm, unless some
layer's k-th and (k+1)-th router logits are within 2 bf16 ulps (the reference may route that layer otherwise: such
steps are reported, not failed).
Shapes: two tiny Qwen3-MoE (8 experts top-2, 16 experts top-8 renormalised) and two layers of Qwen3-30B-A3B's (128
experts, top-8, I 768, hidden 2048) with a small vocabulary; contexts 1, 17, 300; and a K = 4 burst equal to four
K = 1 launches.
"""

from __future__ import annotations

import math
import zlib

import pytest

torch = pytest.importorskip("torch")

from kernel_gpu import burst_equals_steps, close_to, context_in_caches, require_sm90_extension  # noqa: E402

from kog_backend.monokernel import Monokernel, moe_reference, synthetic  # noqa: E402
from kog_backend.reference import moe_step, torch_step  # noqa: E402

pytestmark = pytest.mark.gpu

require_sm90_extension()

DEV = torch.device("cuda", 0)
BS = 16
MAX_CTX = 1024
NUM_BLOCKS = MAX_CTX // BS + 16

SHAPES = {
    "tiny-e8": (("qwen3", 2, 256, 8, 2, 128, 512, 4096, True), moe_step.MoeShape(8, 2, 128, False)),
    "tiny-e16": (("qwen3", 4, 256, 8, 2, 128, 512, 4096, False), moe_step.MoeShape(16, 8, 128, True)),
    "30b-a3b-2l": (("qwen3", 2, 2048, 32, 4, 128, 768, 32000, False), moe_step.MoeShape(128, 8, 768, True)),
}


def _model(name, seed):
    args, moe = SHAPES[name]
    shape = synthetic.make_shape(*args, max_position=MAX_CTX + 64)
    w = synthetic.random_moe_decoder(shape, moe, DEV, seed=seed)
    caches = synthetic.paged_kv_caches(shape, NUM_BLOCKS, BS, DEV)
    return w, caches, Monokernel(w, caches, DEV, max_model_len=MAX_CTX + 16, max_tokens_per_launch=4)


def _close(errors, name, got, exp, rtol=1e-2, atol_rel=1e-2, ulps=0):
    """Elementwise only: within rtol |exp| (or `ulps` bf16 ulps) + atol_rel x the RMS of exp (kernel_gpu.close_to)."""
    close_to(errors, name, got, exp, rtol, atol_rel, norm_rtol=math.inf, ulps=ulps)


def _near_tie(probs, k):
    """The k-th and (k+1)-th probabilities distinct but within 1e-5 relative: the softmax's summation order may
    order them either way."""
    p = torch.sort(probs, descending=True, stable=True).values
    return k < p.numel() and 0 < (p[k - 1] - p[k]).item() <= 1e-5 * p[k].item()


def _close_call(logits, k):
    """The k-th and (k+1)-th router logits within 2 bf16 ulps: a reference whose logits differ from the kernel's by
    an ulp (fp32 sums in another order) may route this layer otherwise, and its decode then differs from the
    kernel's by more than rounding."""
    v = torch.sort(logits.float(), descending=True).values
    if k >= v.numel():
        return False
    ulp = 2.0 ** (math.floor(math.log2(max(abs(v[k].item()), 1e-30))) - 7)
    return (v[k - 1] - v[k]).item() <= 2 * ulp


def _check_layers(w, mk, token, errors) -> int:
    """Every layer's MoE block from the kernel's own inputs; returns the layers whose route is a close call
    (_close_call), where the end-to-end reference may route otherwise."""
    moe, s = w.moe, w.shape
    k, I = moe.top_k, moe.intermediate_size
    near = 0
    for l, (lw, b) in enumerate(zip(w.layers, mk.buffers)):
        rin = w.embed[token] if l == 0 else mk.buffers[l - 1]["rin_next"]
        x, _ = torch_step.add_rms_norm(b["o_out"], rin, lw.post_norm, s.rms_eps)
        logits = mk.moe_logits[l]
        exp = moe_reference.moe_block_stages(lw, x, moe, mk.moe_plan)
        _close(errors, f"layer {l} router logits", logits, exp.router_logits)
        route = moe_step.route(logits, moe)
        near += int(_close_call(logits, k))
        ids = mk.moe_route[l, :k].long()
        weights = mk.moe_route[l, 8 : 8 + k].view(torch.float32)
        if _near_tie(route.probs, k):
            pass
        elif not torch.equal(ids, route.experts):
            errors.append(f"layer {l} route {ids.tolist()} != {route.experts.tolist()}")
            continue
        else:
            _close(errors, f"layer {l} routing weights", weights, route.weights, 1e-5, 0)
        # the kernel's route, teacher-forced (ids and weights as the kernel published them)
        forced = moe_step.Route(ids, weights, route.probs)
        exp = moe_reference.moe_block_stages(lw, x, moe, mk.moe_plan, route=forced)
        _close(errors, f"layer {l} act", b["act"].view(k, I), exp.act, ulps=2)
        _close(errors, f"layer {l} down_out", b["down_out"], exp.out)
        rin_next = (b["down_out"].float() + b["rmid"].float()).to(torch.bfloat16)
        if not torch.equal(b["rin_next"], rin_next):
            errors.append(f"layer {l} rin_next is not bf16(down_out + rmid)")
    return near


@pytest.mark.parametrize("ctx", [1, 17, 300])
@pytest.mark.parametrize("name", list(SHAPES))
def test_moe_step_matches_reference(name, ctx):
    seed = zlib.crc32(f"{name} {ctx}".encode()) % 1000  # the same every run (hash() of a str is salted per process)
    w, caches, mk = _model(name, seed)
    pos, slot, bt = context_in_caches(w, caches, ctx, seed, NUM_BLOCKS, MAX_CTX // BS + 8, BS, extra=4)
    ref_caches = [c.clone() for c in caches]
    mk.scratch.fill_(math.nan)
    mk.moe_logits.fill_(math.nan)
    mk.moe_route.fill_(-1)
    token = int(torch.randint(0, w.shape.vocab_size, (1,), generator=torch.Generator().manual_seed(seed)))
    logits = torch.full((mk.logical_vocab,), math.nan, dtype=torch.bfloat16, device=DEV)
    tok = mk.step(torch.tensor([token], device=DEV), torch.tensor([pos], device=DEV), bt,
                  torch.tensor([slot], device=DEV), logits_out=logits)  # fmt: skip
    torch.cuda.synchronize()
    errors: list[str] = []
    diag = mk.diagnostics()
    assert diag is None, f"kernel wait timed out: {diag}"
    near = _check_layers(w, mk, token, errors)
    if int(tok.item()) != int(torch.argmax(logits.float()).item()):
        errors.append(f"token {int(tok.item())} is not the first argmax of the kernel's logits")
    hidden = moe_step.decode_hidden(w, ref_caches, w.embed[token], pos, slot, bt, pos + 1)
    ref = torch_step.logits(w, hidden).float()
    rel = ((logits.float()[: ref.numel()] - ref).norm() / ref.norm()).item()
    print(f"[{name} ctx {ctx}] logits rel err {rel:.2e}, layers whose route is a close call {near}")
    if not math.isfinite(rel) or (rel > 5e-2 and near == 0):
        errors.append(f"logits rel err {rel:.2e} against moe_step")
    assert not errors, "\n".join(errors[:20])


@pytest.mark.parametrize("name", ["tiny-e16", "30b-a3b-2l"])
def test_moe_burst_equals_single_steps(name):
    """A K = 4 launch gives four K = 1 launches' tokens and caches bit for bit. Between the K = 1 launches every
    layer's published route is overwritten with a valid wrong one (the highest experts, equal weights): a kernel that
    read a route before this token's router published it would route the K = 1 steps by it and the K = 4 burst by
    the previous token's, and differ."""
    w, caches, mk = _model(name, 7)
    pos, _, bt = context_in_caches(w, caches, 40, 7, NUM_BLOCKS, MAX_CTX // BS + 8, BS, extra=4)
    moe = w.moe
    half = mk.moe_route.shape[1] // 2  # ids, then the weights' fp32 bits
    wrong = torch.empty_like(mk.moe_route)
    wrong[:, :half] = (moe.num_experts - 1 - torch.arange(half, device=DEV)).clamp(min=0).int()
    wrong[:, half:] = torch.full((half,), 1.0 / moe.top_k, device=DEV).view(torch.int32)

    def poison_route(t, p, slot, token):  # queued after launch t, before launch t + 1
        mk.moe_route.copy_(wrong)

    errors: list[str] = []
    burst_equals_steps(mk, caches, bt, pos, 11, 4, errors, BS, on_step=poison_route)
    assert not errors, "\n".join(errors)
