"""Sampling building blocks (csrc/include/kog/sampling.cuh) against vLLM 0.26's own Triton sampling kernels and
kog_backend.reference.sampling on an sm_90 GPU, bit for bit. Every output is poisoned before each launch.

* Philox4x32-10: random counters and keys, and Random123's known-answer vectors.
* A row's stream (Gumbel key, Philox words, uniforms, fp32/fp64 noise) for several (seed, position): CUDA ==
  vLLM's tl.randint / tl_rand32 / tl_rand64 and noise expressions compiled by Triton == the torch reference.
* Every 32-bit word's clamped uniform and noise (2^31 words; the upper half folds onto them): CUDA's libdevice
  log/log1pf (no FTZ) == Triton's (FTZ) == torch's.
* CUDA's sort of bf16 rows is stable (the reference's top-p tie order relies on it).
* Temperature: vLLM's _temperature_kernel == CUDA's div.full.f32 == the reference given r = div.full.f32(1, t).
* Whole rows (greedy, temperature, min_p, top-k, top-p, fp64 noise; V up to 151936; 1 to 1000 slices): vLLM's
  temperature, min_p, apply_top_k_top_p and gumbel_sample == gumbel_argmax_test == the reference (logits after
  each stage and the token).
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from kernel_gpu import require_sm90_extension, require_test_extension  # noqa: E402

from kog_backend import ops  # noqa: E402
from kog_backend.reference import sampling as S  # noqa: E402

pytestmark = pytest.mark.gpu

require_sm90_extension()
require_test_extension()  # philox_test, ..., gumbel_argmax_test: csrc/testing/sampling_test.cu

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from vllm.triton_utils import tldevice  # noqa: E402
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p  # noqa: E402
from vllm.v1.worker.gpu.sample import gumbel, min_p  # noqa: E402

DEV = torch.device("cuda", 0)
SEED = random.randrange(2**31)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@triton.jit
def _stream_probe(seed_ptr, pos_ptr, gs_ptr, words_ptr, u_ptr, noise_ptr, u64_ptr, noise64_ptr, n,
                  BLOCK: tl.constexpr):
    """vLLM gumbel_block_argmax's random stream, with its own tl_rand32 / tl_rand64 and noise expressions."""
    block = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = block < n
    gs = tl.randint(tl.load(seed_ptr), tl.load(pos_ptr))
    tl.store(gs_ptr, gs.to(tl.int64))
    w0, w1, w2, w3 = tl.randint4x(gs, block)
    tl.store(words_ptr + block, w0.to(tl.int64), mask=mask)
    tl.store(words_ptr + n + block, w1.to(tl.int64), mask=mask)
    tl.store(words_ptr + 2 * n + block, w2.to(tl.int64), mask=mask)
    tl.store(words_ptr + 3 * n + block, w3.to(tl.int64), mask=mask)
    u = gumbel.tl_rand32(gs, block, includes_zero=False)
    tl.store(u_ptr + block, u, mask=mask)
    tl.store(noise_ptr + block, -tl.log(-tldevice.log1p(-u)), mask=mask)
    u64 = gumbel.tl_rand64(gs, block, includes_zero=False)
    tl.store(u64_ptr + block, u64, mask=mask)
    tl.store(noise64_ptr + block, -tl.log(-tl.log(u64)), mask=mask)


@triton.jit
def _word_noise_probe(first_word, u_ptr, noise_ptr, n, BLOCK: tl.constexpr):
    """tl_rand32's conversion and clamp, and vLLM's fp32 noise, of the words first_word + i."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = (first_word + offs).to(tl.uint32)
    u = tl.maximum(tl.uint_to_uniform_float(w), gumbel._TL_RAND_MIN)
    tl.store(u_ptr + offs, u, mask=mask)
    tl.store(noise_ptr + offs, -tl.log(-tldevice.log1p(-u)), mask=mask)


def _bits(t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():
        return t
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16}[t.dtype])


def _assert_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    bad = (_bits(a) != _bits(b)).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.shape[0]} of {a.numel()} differ; first at {bad[0].tolist()}: "
        f"{a[tuple(bad[0])].item()!r} vs {b[tuple(bad[0])].item()!r} (seed {SEED})"
    )


def test_philox():
    g = torch.Generator(device=DEV).manual_seed(SEED)
    n = 1 << 20
    for key in (0, 2**64 - 1, random.Random(SEED).randrange(2**64)):
        c = torch.randint(0, 2**32, (4, n), device=DEV, dtype=torch.int64, generator=g)
        out = torch.full_like(c, -1)
        ops.kog_test_ops().philox_test(c, key - 2**64 if key >= 2**63 else key, out)
        k0 = torch.full_like(c[0], key & S.MASK32)
        k1 = torch.full_like(c[0], key >> 32)
        _assert_bits(out, torch.stack(S.philox4x32(c[0], c[1], c[2], c[3], k0, k1)), f"philox key {key:#x}")
    for ctr, key, expected in S.PHILOX_KAT:
        c = torch.tensor(ctr, dtype=torch.int64, device=DEV).view(4, 1)
        out = torch.full_like(c, -1)
        k = key[0] | (key[1] << 32)
        ops.kog_test_ops().philox_test(c, k - 2**64 if k >= 2**63 else k, out)
        assert tuple(int(w) for w in out[:, 0]) == expected


@pytest.mark.parametrize("seed,position", [(0, 0), (-1, 1), (INT64_MIN, 2**32 + 5), (INT64_MAX, 2**40 + 3),
                                           (12345, 77), (-987654321987, 131071)])
def test_stream(seed, position):
    n = 151936
    mine = {
        "key": torch.full((1,), -1, dtype=torch.int64, device=DEV),
        "words": torch.full((4, n), -1, dtype=torch.int64, device=DEV),
        "u": torch.full((n,), float("nan"), device=DEV),
        "noise": torch.full((n,), float("nan"), device=DEV),
        "u64": torch.full((n,), float("nan"), dtype=torch.float64, device=DEV),
        "noise64": torch.full((n,), float("nan"), dtype=torch.float64, device=DEV),
    }
    ops.kog_test_ops().philox_uniform_test(seed, position, *mine.values())
    theirs = {k: torch.full_like(v, -1 if v.dtype == torch.int64 else float("nan")) for k, v in mine.items()}
    _stream_probe[(triton.cdiv(n, 1024),)](
        torch.tensor([seed], dtype=torch.int64, device=DEV), torch.tensor([position], dtype=torch.int64, device=DEV),
        *theirs.values(), n, BLOCK=1024,
    )
    key = S.gumbel_seed(seed, position)
    cols = torch.arange(n, dtype=torch.int64, device=DEV)
    ref = {
        "key": torch.tensor([key], dtype=torch.int64, device=DEV),
        "words": torch.stack(S.randint4x(key, cols)),
        "u": S.rand32(key, cols),
        "noise": S.gumbel_noise(seed, position, n, DEV),
        "u64": S.rand64(key, cols),
        "noise64": S.gumbel_noise(seed, position, n, DEV, use_fp64=True),
    }
    for name, got in mine.items():
        _assert_bits(got, theirs[name], f"{name}: CUDA vs vLLM/Triton")
        _assert_bits(got, ref[name], f"{name}: CUDA vs reference")


def test_noise_of_every_word():
    chunk = 1 << 27
    u_mine = torch.empty(chunk, device=DEV)
    n_mine = torch.empty(chunk, device=DEV)
    u_theirs = torch.empty(chunk, device=DEV)
    n_theirs = torch.empty(chunk, device=DEV)
    for first in range(0, 1 << 31, chunk):
        for t in (u_mine, n_mine, u_theirs, n_theirs):
            t.fill_(float("nan"))
        ops.kog_test_ops().gumbel_noise_words_test(first, u_mine, n_mine)
        _word_noise_probe[(triton.cdiv(chunk, 1024),)](first, u_theirs, n_theirs, chunk, BLOCK=1024)
        _assert_bits(u_mine, u_theirs, f"uniform of words {first:#x}+")
        _assert_bits(n_mine, n_theirs, f"noise of words {first:#x}+: CUDA vs Triton")
        _assert_bits(S.gumbel_from_uniform(u_mine), n_mine, f"noise of words {first:#x}+: reference vs CUDA")


@pytest.mark.parametrize("v", [33, 1000, 4096, 4097, 32000, 128256, 151936])
def test_cuda_sort_is_stable(v):
    g = torch.Generator(device=DEV).manual_seed(SEED + v)
    for scale in (0.5, 4.0):
        x = (torch.randint(-6, 7, (1, v), device=DEV, generator=g).float() * scale).to(torch.bfloat16)
        x[0, torch.randint(0, v, (v // 10,), device=DEV, generator=g)] = -0.0
        got = x.sort(dim=-1, descending=False).indices
        assert torch.equal(got, x.sort(dim=-1, stable=True).indices), v
        # CPU's stable sort compares values: -0 == +0, ties by index (the order sampling.cuh's keys encode)
        assert torch.equal(got.cpu(), x.cpu().sort(dim=-1, stable=True).indices), v


def _div_full_reciprocal(t: float) -> float:
    """div.full.f32(1, t) as vLLM's own _temperature_kernel computes it on this GPU (fp32 row of ones)."""
    ones = torch.ones(1, 1, device=DEV)
    gumbel.apply_temperature(ones, torch.zeros(1, dtype=torch.int32, device=DEV),
                             torch.tensor([t], dtype=torch.float32, device=DEV))
    return float(ones[0, 0])


def _vllm_row(x, temperature, top_k, top_p, mp, seed, position, use_fp64):
    """Sampler.sample's non-FlashInfer path on a [1, V] bf16 batch, with SamplingStates' gating."""
    logits = x.clone().unsqueeze(0)
    v = logits.shape[1]
    idx = torch.zeros(1, dtype=torch.int32, device=DEV)
    temp = torch.tensor([temperature], dtype=torch.float32, device=DEV)
    out = {}
    if float(temp) not in (0.0, 1.0):
        gumbel.apply_temperature(logits, idx, temp)
    out["after_temperature"] = logits[0].clone()
    if mp != 0.0:
        min_p.apply_min_p(logits, idx, torch.tensor([mp], dtype=torch.float32, device=DEV))
    out["after_min_p"] = logits[0].clone()
    k, p = S.normalize_top_k_top_p(top_k, top_p, v)
    logits = apply_top_k_top_p(
        logits,
        torch.tensor([k], dtype=torch.int32, device=DEV) if k is not None else None,
        torch.tensor([p], dtype=torch.float32, device=DEV) if p is not None else None,
    )
    out["after_top_k_top_p"] = logits[0].clone()
    out["token"] = int(gumbel.gumbel_sample(
        logits, idx, temp, torch.tensor([seed], dtype=torch.int64, device=DEV),
        torch.tensor([position], dtype=torch.int64, device=DEV), apply_temperature=False, use_fp64=use_fp64,
    )[0])
    return out


def _cut_from(after_min_p: torch.Tensor, after_cut: torch.Tensor) -> tuple[int, int]:
    """(key, column) of the first kept position in the stable ascending order of the row top-k/top-p saw."""
    order = after_min_p.sort(stable=True).indices
    newly_masked = (after_cut.float() == float("-inf")) & (after_min_p.float() != float("-inf"))
    masked_sorted = newly_masked[order].nonzero()
    first = int(masked_sorted[-1]) + 1 if masked_sorted.numel() else 0
    col = int(order[first])
    return int(S.bf16_order_key(after_min_p[col : col + 1])[0]), col


def _rows():
    rng = random.Random(SEED)
    rows = []
    for v in (1000, 4097, 32000, 128256, 151936):
        for _ in range(6):
            rows.append((v, rng.choice(["normal", "ties"]), rng.choice([0.0, 1.0, 0.01, 0.6, 0.8, 1.3, 2.0]),
                         rng.choice([0, 0, 1, 5, 50]), rng.choice([1.0, 1.0, 0.9, 0.5, 1e-6]),
                         rng.choice([0.0, 0.0, 0.05, 0.3]), rng.random() < 0.2, rng.choice([1, 7, 132, 1000])))
    rows.append((151936, "normal", 0.8, 0, 0.9, 0.0, False, 132))
    rows.append((128256, "normal", 0.0, 0, 1.0, 0.0, False, 132))
    return rows


@pytest.mark.parametrize("row", _rows(), ids=lambda r: "-".join(map(str, r)))
def test_row_matches_vllm(row):
    v, kind, temperature, top_k, top_p, mp, use_fp64, slices = row
    g = torch.Generator(device=DEV).manual_seed(SEED + v)
    if kind == "ties":
        x = (torch.randint(-6, 7, (v,), device=DEV, generator=g).float() * 0.5).to(torch.bfloat16)
    else:
        x = (torch.randn(v, device=DEV, generator=g) * 4).to(torch.bfloat16)
    seed = random.Random(SEED + v).randrange(INT64_MIN, INT64_MAX)
    position = random.Random(SEED - v).randrange(2**31)
    where = f"{row}, seed {SEED}"

    theirs = _vllm_row(x, temperature, top_k, top_p, mp, seed, position, use_fp64)
    rcp = _div_full_reciprocal(temperature) if temperature not in (0.0, 1.0) else None
    ref = S.sample(x, temperature=temperature, seed=seed, position=position, top_k=top_k, top_p=top_p, min_p=mp,
                   use_fp64=use_fp64, div_full_reciprocal=rcp)
    _assert_bits(ref.after_temperature, theirs["after_temperature"], f"temperature: reference vs vLLM, {where}")
    _assert_bits(ref.after_min_p, theirs["after_min_p"], f"min_p: reference vs vLLM, {where}")
    _assert_bits(ref.after_top_k_top_p, theirs["after_top_k_top_p"], f"top-k/top-p: reference vs vLLM, {where}")
    assert ref.token == theirs["token"], where

    k, p = S.normalize_top_k_top_p(top_k, top_p, v)
    cut_key, cut_col = _cut_from(theirs["after_min_p"], theirs["after_top_k_top_p"]) if p is not None else (-1, 0)
    params = torch.full((8,), -1, dtype=torch.int32, device=DEV)
    processed = torch.full((v,), float("nan"), device=DEV)
    slice_best = torch.full((slices, 3), -1, dtype=torch.int64, device=DEV)
    token = torch.full((1,), -1, dtype=torch.int64, device=DEV)
    ops.kog_test_ops().gumbel_argmax_test(x, temperature, mp, k if (k is not None and p is None) else 0, cut_key,
                                          cut_col, seed, position, use_fp64, slices, params, processed, slice_best,
                                          token)
    _assert_bits(processed, theirs["after_top_k_top_p"].float(), f"processed logits: CUDA vs vLLM, {where}")
    if k is not None and p is None:  # the kernel's own radix select: the k-th largest value's key
        kth = theirs["after_min_p"].sort(descending=True, stable=True).values[k - 1 : k]
        assert int(params[2]) == int(S.bf16_order_key(kth)[0]) and int(params[4]) == 1, where
    if mp != 0.0:
        thr = theirs["after_temperature"].float().max() + torch.log(torch.tensor(mp, dtype=torch.float32, device=DEV))
        assert int(params[1]) == int(thr.view(torch.int32)), where
    assert int(params[5]) & S.MASK32 == S.gumbel_seed(seed, position), where
    assert int(token) == theirs["token"], where
