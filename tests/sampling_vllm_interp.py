"""Runs vLLM 0.26's own V2 sampling kernels on the CPU through Triton's interpreter (child of
tests/test_sampling_reference.py): `python tests/sampling_vllm_interp.py CASES.pt RESULTS.pt`.

Four gaps of the interpreter are filled here, each with what the GPU does:
  * libdevice calls are not supported (`tldevice.log1p` in gumbel.py raises): log1p is torch's;
  * `tl.log` is numpy's, whose float32 log differs from ATen's in the last bits: routed to torch's (the
    "streams_numpy" results keep numpy's log and use numpy's log1p, for a closeness check);
  * fp32 <-> bf16 casts truncate instead of rounding to nearest even (the GPU stores with cvt.rn.bf16.f32):
    done with torch's conversion, which rounds to nearest even;
  * a bf16 scalar constant (`tl.where(mask, float("-inf"), bf16)` in min_p.py) has no builder method.
Every other operation (Philox, uint->float conversion, clamps, temperature division, min_p, block argmax and
the cross-block argmax) is vLLM's and Triton's own code. vLLM disables Triton when no GPU driver is active unless
CUDA_VISIBLE_DEVICES is set and empty, which this script sets.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import types  # noqa: E402
from unittest import mock  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as tri_interp  # noqa: E402

from vllm.triton_utils import HAS_TRITON  # noqa: E402
from vllm.v1.sample.ops import topk_topp_sampler  # noqa: E402
from vllm.v1.worker.gpu.sample import gumbel, min_p, penalties  # noqa: E402

_MATH = {"numpy": False}


def _torch_unary(fn):
    def run(a: np.ndarray) -> np.ndarray:
        return fn(torch.from_numpy(np.ascontiguousarray(a))).numpy()

    return run


def _interp_log1p(x):
    """Stand-in for triton.language.extra.libdevice.log1p on interpreter tensors."""
    data = x.handle.data
    out = np.log1p(data) if _MATH["numpy"] else _torch_unary(torch.log1p)(data)
    return tl.core.tensor(tri_interp.TensorHandle(out.astype(data.dtype), x.handle.dtype), x.type)


_ORIG_CAST = tri_interp.InterpreterBuilder.cast_impl
_BF16_F32 = {(tl.bfloat16, tl.float32): (np.uint16, torch.bfloat16, torch.float32, np.float32),
             (tl.float32, tl.bfloat16): (np.float32, torch.float32, torch.bfloat16, np.uint16)}


def _cast_impl(self, src, dst_type):
    key = (src.dtype.scalar, dst_type.scalar)
    if key not in _BF16_F32:
        return _ORIG_CAST(self, src, dst_type)
    np_in, t_in, t_out, np_out = _BF16_F32[key]
    data = np.ascontiguousarray(src.data).view(np_in)
    as_in = torch.from_numpy(data.view(np.int16) if t_in is torch.bfloat16 else data)
    if t_in is torch.bfloat16:
        as_in = as_in.view(torch.bfloat16)
    out = as_in.to(t_out)
    out = out.view(torch.int16).numpy().view(np.uint16) if t_out is torch.bfloat16 else out.numpy()
    return tri_interp.TensorHandle(out.view(np_out), dst_type.scalar)


def _get_bf16(self, value):
    bits = torch.tensor([value], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return tri_interp.TensorHandle(bits, tl.bfloat16)


def _log(a: np.ndarray) -> np.ndarray:
    return np.log(a) if _MATH["numpy"] else _torch_unary(torch.log)(a)


tri_interp.InterpreterBuilder.cast_impl = _cast_impl
tri_interp.InterpreterBuilder.get_bf16 = _get_bf16
tri_interp.InterpreterBuilder.create_log = lambda self, arg: self.unary_op(arg, _log)
_TLDEVICE = types.SimpleNamespace(log1p=_interp_log1p)
gumbel.tldevice = _TLDEVICE


@triton.jit
def _philox_probe(c_ptr, out_ptr, seed, n, BLOCK: tl.constexpr):
    """tl.philox with per-lane counters c[4, n] (uint32 bits in int32) and a 64-bit seed key."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c0 = tl.load(c_ptr + offs, mask=mask).to(tl.uint32, bitcast=True)
    c1 = tl.load(c_ptr + n + offs, mask=mask).to(tl.uint32, bitcast=True)
    c2 = tl.load(c_ptr + 2 * n + offs, mask=mask).to(tl.uint32, bitcast=True)
    c3 = tl.load(c_ptr + 3 * n + offs, mask=mask).to(tl.uint32, bitcast=True)
    o0, o1, o2, o3 = tl.philox(seed, c0, c1, c2, c3)
    tl.store(out_ptr + offs, o0.to(tl.int32, bitcast=True), mask=mask)
    tl.store(out_ptr + n + offs, o1.to(tl.int32, bitcast=True), mask=mask)
    tl.store(out_ptr + 2 * n + offs, o2.to(tl.int32, bitcast=True), mask=mask)
    tl.store(out_ptr + 3 * n + offs, o3.to(tl.int32, bitcast=True), mask=mask)


@triton.jit
def _uniform_probe(w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Triton's uint_to_uniform_float on given 32-bit words (uint32 bits in int32)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(w_ptr + offs, mask=mask).to(tl.uint32, bitcast=True)
    tl.store(out_ptr + offs, tl.uint_to_uniform_float(w), mask=mask)


@triton.jit
def _gumbel_probe(seed_ptr, pos_ptr, gs_ptr, words_ptr, u_ptr, noise_ptr, u64_ptr, noise64_ptr, n,
                  BLOCK: tl.constexpr):
    """The gumbel kernel's random stream, piece by piece, with vLLM's own tl_rand32 / tl_rand64 and its noise
    expressions (gumbel.py gumbel_block_argmax)."""
    block = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = block < n
    seed = tl.load(seed_ptr)
    pos = tl.load(pos_ptr)
    gs = tl.randint(seed, pos)
    tl.store(gs_ptr, gs.to(tl.int32, bitcast=True))
    w0, w1, w2, w3 = tl.randint4x(gs, block)
    tl.store(words_ptr + block, w0.to(tl.int32, bitcast=True), mask=mask)
    tl.store(words_ptr + n + block, w1.to(tl.int32, bitcast=True), mask=mask)
    tl.store(words_ptr + 2 * n + block, w2.to(tl.int32, bitcast=True), mask=mask)
    tl.store(words_ptr + 3 * n + block, w3.to(tl.int32, bitcast=True), mask=mask)
    u = gumbel.tl_rand32(gs, block, includes_zero=False)
    tl.store(u_ptr + block, u, mask=mask)
    tl.store(noise_ptr + block, -tl.log(-_TLDEVICE.log1p(-u)), mask=mask)
    u64 = gumbel.tl_rand64(gs, block, includes_zero=False)
    tl.store(u64_ptr + block, u64, mask=mask)
    tl.store(noise64_ptr + block, -tl.log(-tl.log(u64)), mask=mask)


def _as_i32(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.int64)
    return x.where(x < 2**31, x - 2**32).to(torch.int32).contiguous()


def uniforms(words: torch.Tensor) -> torch.Tensor:
    out = torch.empty(words.shape[0], dtype=torch.float32)
    _uniform_probe[(triton.cdiv(words.shape[0], 4096),)](_as_i32(words), out, words.shape[0], BLOCK=4096)
    return out


def philox_words(counters: torch.Tensor, key: int) -> torch.Tensor:
    """counters: int64 [4, n] of uint32 values; key: uint64. Returns int64 [4, n]."""
    n = counters.shape[1]
    c = _as_i32(counters)
    out = torch.empty_like(c)
    seed = key - 2**64 if key >= 2**63 else key
    _philox_probe[(triton.cdiv(n, 256),)](c, out, seed, n, BLOCK=256)
    return out.to(torch.int64) & 0xFFFFFFFF


def gumbel_stream(seed: int, pos: int, n: int) -> dict:
    gs = torch.zeros(1, dtype=torch.int32)
    words = torch.empty(4, n, dtype=torch.int32)
    u = torch.empty(n, dtype=torch.float32)
    noise = torch.empty(n, dtype=torch.float32)
    u64 = torch.empty(n, dtype=torch.float64)
    noise64 = torch.empty(n, dtype=torch.float64)
    _gumbel_probe[(triton.cdiv(n, 1024),)](
        torch.tensor([seed], dtype=torch.int64), torch.tensor([pos], dtype=torch.int64), gs, words, u, noise,
        u64, noise64, n, BLOCK=1024,
    )
    return {
        "gumbel_seed": int(gs.to(torch.int64)[0]) & 0xFFFFFFFF, "words": words.to(torch.int64) & 0xFFFFFFFF,
        "u": u, "noise": noise, "u64": u64, "noise64": noise64,
    }


def _stable_sort(self, *args, **kwargs):
    kwargs["stable"] = True
    return _ORIG_SORT(self, *args, **kwargs)


_ORIG_SORT = torch.Tensor.sort


def vllm_sample(case: dict) -> dict:
    """Sampler.sample's non-FlashInfer path for one row, with SamplingStates' gating, on a [1, V] batch."""
    logits = case["logits"].clone().unsqueeze(0)
    v = logits.shape[1]
    idx = torch.zeros(1, dtype=torch.int32)
    temp = torch.tensor([case["temperature"]], dtype=torch.float32)
    seeds = torch.tensor([case["seed"]], dtype=torch.int64)
    pos = torch.tensor([case["position"]], dtype=torch.int64)
    mp = torch.tensor([case["min_p"]], dtype=torch.float32)
    top_k = case["top_k"]
    top_k = v if top_k <= 0 or top_k > v else top_k
    top_p = torch.tensor([case["top_p"]], dtype=torch.float32)
    out = {}
    if "prompt_ids" in case:  # PenaltiesState: bincount of prompt + outputs, then the penalties kernel
        prompt, outputs = case["prompt_ids"], case["output_ids"]
        all_ids = torch.cat([prompt, outputs]).to(torch.int32).unsqueeze(0)
        mask = torch.zeros(1, triton.cdiv(v, 32), dtype=torch.int32)
        counts = torch.zeros(1, v, dtype=torch.int32)
        penalties.bincount(idx, all_ids, torch.tensor([prompt.numel()], dtype=torch.int32),
                           torch.tensor([all_ids.shape[1]], dtype=torch.int32), mask, counts, all_ids.shape[1])
        values = [torch.tensor([case[k]], dtype=torch.float32)
                  for k in ("repetition_penalty", "frequency_penalty", "presence_penalty")]
        penalties.apply_penalties(logits, idx, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                                  *values, mask, counts)
    out["after_penalties"] = logits[0].clone()
    if not bool(((temp == 0.0) | (temp == 1.0)).all()):
        gumbel.apply_temperature(logits, idx, temp)
    out["after_temperature"] = logits[0].clone()
    if not bool((mp == 0.0).all()):
        min_p.apply_min_p(logits, idx, mp)
    out["after_min_p"] = logits[0].clone()
    k = torch.tensor([top_k], dtype=torch.int32) if top_k != v else None
    p = top_p if bool((top_p != 1.0).any()) else None
    with mock.patch.object(torch.Tensor, "sort", _stable_sort):
        logits = topk_topp_sampler.apply_top_k_top_p_pytorch(logits, k, p)
    out["after_top_k_top_p"] = logits[0].clone()
    out["token"] = int(
        gumbel.gumbel_sample(logits, idx, temp, seeds, pos, apply_temperature=False, use_fp64=case["use_fp64"])[0]
    )
    return out


def main() -> int:
    assert HAS_TRITON, "vLLM disabled Triton"
    cases_path, results_path = sys.argv[1], sys.argv[2]
    spec = torch.load(cases_path)
    results = {
        "philox": [philox_words(c["counters"], c["key"]) for c in spec["philox"]],
        "uniforms": uniforms(spec["uniform_words"]),
        "streams": [gumbel_stream(s["seed"], s["position"], s["n"]) for s in spec["streams"]],
        "samples": [vllm_sample(c) for c in spec["samples"]],
    }
    _MATH["numpy"] = True
    results["streams_numpy"] = [gumbel_stream(s["seed"], s["position"], s["n"]) for s in spec["streams"]]
    torch.save(results, results_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
