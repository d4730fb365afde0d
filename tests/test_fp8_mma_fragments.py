"""The FP8 kernel's tensor-core GEMV (csrc/include/kog/fp8.cuh gemv_mma_fp8) lane by lane, in float64 on the CPU:
each lane's vectors of one part of a row, the mma.m16n8k16 fragments it builds from them (weights as B's column
g = lane / 4, 8 inputs as A's rows g and g + 8), the diagonals it keeps and the scales it applies, for one warp.
The result must equal the part's dot product computed directly, for every scaling mode, parts whose first vector
is not a multiple of 4 and stale NaN bytes around the part, which checks the fragment maps and the masking without
a GPU. GPU kernel tests then check the compiled GEMV against the reference."""

from __future__ import annotations

import math

import pytest
import torch
from mma_fragments import LANES
from mma_fragments import mma_m16n8k16

BLOCK, PER_TENSOR, PER_ROW = "block", "tensor", "row"


def _diagonal(d, e, lane):
    """fp8.cuh mma_diagonal: D_d[g][g] and D_e[g + 8][g] on lane 4 g + g / 2, elements g % 2 and 2 + g % 2."""
    g = lane >> 2
    if (lane & 3) != (g >> 1):
        return 0.0
    return float(d[lane][g & 1] + e[lane][2 + (g & 1)])


def _mma_dot16(d, e, w, x):
    """fp8.cuh mma_dot16_e4m3 over every lane: w[lane], x[lane] = 16 values. A = 8 inputs as loaded (words
    (0, 1), (2, 3), (4, 5), (6, 7) of the half); d takes weights {0, 1, 4, 5} of the half, e {2, 3, 6, 7}."""
    for h in range(2):
        a = [[(x[l][8 * h + 2 * i], x[l][8 * h + 2 * i + 1]) for i in range(4)] for l in range(LANES)]
        bd = [((w[l][8 * h], w[l][8 * h + 1]), (w[l][8 * h + 4], w[l][8 * h + 5])) for l in range(LANES)]
        be = [((w[l][8 * h + 2], w[l][8 * h + 3]), (w[l][8 * h + 6], w[l][8 * h + 7])) for l in range(LANES)]
        d = mma_m16n8k16(a, bd, d)
        e = mma_m16n8k16(a, be, e)
    return d, e


def _lane_vectors(a, base, v0, v1):
    """Each lane's 16 values of vector base + lane where it lies in [v0, v1), zeros elsewhere (the kernel's masking)."""
    out = []
    for lane in range(LANES):
        v = base + lane
        out.append(a[16 * v : 16 * v + 16].tolist() if v0 <= v < v1 else [0.0] * 16)
    return out


def _warp_gemv(w_row, x, scales, mode, v0, v1, unit=0):
    """gemv_mma_fp8 for one warp and one row: w_row, x [K] (K = 16 x vectors), scales per mode; returns the warp's
    sum (the value every lane holds after warp_sum)."""
    zeros = [[0.0] * 4 for _ in range(LANES)]
    acc = [0.0] * LANES
    d, e = zeros, zeros
    for base in range(v0 & ~3, v1, 32):
        w, xs = _lane_vectors(w_row, base, v0, v1), _lane_vectors(x, base, v0, v1)
        if mode == BLOCK:  # fresh accumulators per step, each group's diagonal entry weighed by its block's scale
            d, e = _mma_dot16(zeros, zeros, w, xs)
            for lane in range(LANES):
                vg = base + (lane & ~3)
                if vg + 4 > v0 and vg < v1:
                    acc[lane] += float(scales[vg >> 3]) * _diagonal(d, e, lane)
        else:
            d, e = _mma_dot16(d, e, w, xs)
    if mode != BLOCK:
        s = float(scales[unit if mode == PER_ROW else 0])
        acc = [_diagonal(d, e, lane) * s for lane in range(LANES)]
    return sum(acc)


@pytest.mark.parametrize("mode", [BLOCK, PER_TENSOR, PER_ROW])
@pytest.mark.parametrize("K,v0,v1", [(2048, 0, 128), (4096, 32, 64), (2560, 20, 40), (8960, 70, 140), (896, 7, 56)])
def test_fragment_maps_give_the_dot_product(mode, K, v0, v1):
    g = torch.Generator().manual_seed(K + v0 + {BLOCK: 0, PER_TENSOR: 1, PER_ROW: 2}[mode])
    # e4m3 values are small integers times powers of two; any float64 exercises the index maps equally.
    w_row = torch.randn(K, generator=g, dtype=torch.float64)
    x = torch.randn(K, generator=g, dtype=torch.float64)
    # Stale NaN bytes outside the part: the warp must never multiply them.
    w_row[: 16 * v0] = math.nan
    w_row[16 * v1 :] = math.nan
    nblocks = (K + 127) // 128
    scales = torch.rand(max(nblocks, 8), generator=g, dtype=torch.float64) + 0.5
    got = _warp_gemv(w_row, x, scales, mode, v0, v1, unit=3)
    part = slice(16 * v0, 16 * v1)
    prod = w_row[part] * x[part]
    if mode == BLOCK:
        cols = torch.arange(16 * v0, 16 * v1)
        want = float((prod * scales[cols // 128]).sum())
    else:
        want = float(prod.sum()) * float(scales[3 if mode == PER_ROW else 0])
    assert got == pytest.approx(want, rel=1e-12, abs=1e-9)


def test_every_group_lies_in_one_scale_block():
    """From v0 rounded down to a multiple of 4, a group's 4 vectors (64 columns) never straddle a 128-column block:
    the block scale taken from the group's first vector is every member's."""
    for v0 in range(0, 40):
        for base in range(v0 & ~3, v0 + 96, 32):
            for g in range(8):
                vg = base + 4 * g
                assert len({(vg + t) >> 3 for t in range(4)}) == 1
