"""csrc/include/kog/fp8_act.cuh replayed lane by lane on the CPU: the tensor-core FP8 GEMV's fragment maps (which
products reach D[g][g], on which lane and register), its steps over a warp's part of a row (whole steps, partial
first and last steps, the scale of each 128-column block), and the in-place input quantisation's pass schedule (no
pass reads a byte an earlier write replaced; bytes and scales land where the GEMV reads them).

The mma is emulated from PTX's fragment layout of mma.m16n8k32 with 8-bit A / B (A: lane 4g + t, register i, byte b
at row g + 8 (i % 2), column 4t + b + 16 (i // 2); B: register j, byte b at row 4t + b + 16 j, column g; C: register
r at row g + 8 (r // 2), column 2t + r % 2), independently of the kernel's reasoning in its header.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from kog_backend.reference import fp8_linear  # noqa: E402

LANES = 32


def _mma(a_regs, b_regs):
    """D = A B for one warp: a_regs[lane] = 4 registers of 4 values, b_regs[lane] = 2 registers of 4 values; returns
    c[lane] = 4 values. Every element of A and B is owned by exactly one (lane, register, byte)."""
    A = [[None] * 32 for _ in range(16)]
    B = [[None] * 8 for _ in range(32)]
    for lane in range(LANES):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            for b in range(4):
                r, c = g + 8 * (i % 2), 4 * t + b + 16 * (i // 2)
                assert A[r][c] is None
                A[r][c] = a_regs[lane][i][b]
        for j in range(2):
            for b in range(4):
                r, c = 4 * t + b + 16 * j, g
                assert B[r][c] is None
                B[r][c] = b_regs[lane][j][b]
    D = [[sum(A[r][k] * B[k][c] for k in range(32)) for c in range(8)] for r in range(16)]
    out = []
    for lane in range(LANES):
        g, t = lane >> 2, lane & 3
        out.append([D[g + 8 * (r // 2)][2 * t + r % 2] for r in range(4)])
    return out


def _words(vec16):
    """A 16-byte vector as its four 32-bit words' values (element b of word i = vec16[4 i + b])."""
    return [vec16[4 * i: 4 * i + 4] for i in range(4)]


def _group_dot64(w_lanes, x_lanes):
    """fp8_act.cuh group_dot64 for the whole warp: per lane the value it returns (D[g][g] on lane 4g + g/2)."""
    w = [_words(v) for v in w_lanes]
    x = [_words(v) for v in x_lanes]
    d1 = _mma([[x[L][0], x[L][0], x[L][1], x[L][1]] for L in range(LANES)], [[w[L][0], w[L][1]] for L in range(LANES)])
    d2 = _mma([[x[L][2], x[L][2], x[L][3], x[L][3]] for L in range(LANES)], [[w[L][2], w[L][3]] for L in range(LANES)])
    res = []
    for L in range(LANES):
        odd = ((L >> 2) & 1) == 1
        res.append(d1[L][1] + d2[L][1] if odd else d1[L][0] + d2[L][0])
    return res


def _gemv_partial_mma(wrow, x, sw, sx, v0, v1, block):
    """gemv_partial_fp8_mma's steps for one warp and one row: wrow / x the row's and the input's values per column,
    sw / sx the scales per 128-column block (block) or a single one each; returns the warp_sum of the diagonal
    lanes' accumulators."""
    acc = [0.0] * LANES
    zero = [0] * 16

    def vec(a, v):
        return a[16 * v: 16 * v + 16]

    def step(base, predicated):
        lanes_w, lanes_x, blks = [], [], []
        for L in range(LANES):
            v = base + L
            ok = (v0 <= v < v1) if predicated else True
            assert predicated or v0 <= v < v1
            lanes_w.append(vec(wrow, v) if ok else zero)
            lanes_x.append(vec(x, v) if ok else zero)
            blks.append(min(base + (L & ~3), v1 - 1) >> 3 if predicated else v >> 3)
        d = _group_dot64(lanes_w, lanes_x)
        for L in range(LANES):
            acc[L] += d[L] * (sw[blks[L]] * sx[blks[L]] if block else 1.0)

    base = v0 & ~3
    if base == v0:
        while base + 32 <= v1:
            step(base, False)
            base += 32
    while base < v1:
        step(base, True)
        base += 32
    total = 0.0
    for L in range(LANES):
        g = L >> 2
        if (L & 3) == (g >> 1):
            total += acc[L] if block else acc[L] * sw[0] * sx[0]
    return total


@pytest.mark.parametrize("block", [True, False])
@pytest.mark.parametrize("k,v0,v1", [
    (4096, 0, 256),     # a whole row, whole steps
    (14336, 224, 448),  # a part of a down row (wpu 4): whole steps from a 4-aligned start
    (3584, 56, 112),    # hidden 3584 over 4 parts: a part of 56 vectors, a partial last step
    (2560, 40, 80),     # hidden 2560 over 4 parts
    (1536, 5, 43),      # an unaligned part: the first group straddles its start
    (896, 0, 56),       # shorter than one step
])
def test_gemv_partial_mma_sums_its_part(block, k, v0, v1):
    rng = random.Random(k * 31 + v0 * 7 + v1 + block)
    # small integers: every product and sum is exact, so the mapping is checked exactly
    wrow = [rng.randint(-7, 7) for _ in range(k)]
    x = [rng.randint(-7, 7) for _ in range(k)]
    blocks = -(-k // 128)
    sw = [rng.choice([0.5, 1.0, 2.0, 4.0]) for _ in range(blocks)] if block else [0.25]
    sx = [rng.choice([0.5, 1.0, 2.0]) for _ in range(blocks)] if block else [2.0]
    got = _gemv_partial_mma(wrow, x, sw, sx, v0, v1, block)
    cols = range(16 * v0, 16 * v1)
    if block:
        want = sum(wrow[c] * x[c] * sw[c // 128] * sx[c // 128] for c in cols)
    else:
        want = sum(wrow[c] * x[c] for c in cols) * sw[0] * sx[0]
    assert got == want


def test_lanes_outside_a_part_contribute_nothing():
    """A NaN-free but huge value outside [v0, v1) would show in the sum if any lane outside the part passed it."""
    k, v0, v1 = 1024, 3, 37
    wrow = [1] * k
    x = [1] * k
    for c in list(range(0, 16 * v0)) + list(range(16 * v1, k)):
        wrow[c] = x[c] = 10**6
    got = _gemv_partial_mma(wrow, x, [1.0] * 8, [1.0] * 8, v0, v1, True)
    assert got == 16 * (v1 - v0)


# ---- quantise_input_e4m3's in-place pass schedule -----------------------------------------------------------------

THREADS, PER_THREAD = 256, 8
PER_PASS = THREADS * PER_THREAD


def _quantise_in_place(x_bf16: torch.Tensor, layout: str):
    """The kernel's schedule on a byte image of x_s: per pass every thread reads its 16 bytes (checked against the
    untouched input), then every thread writes its 8; the scales after the last pass. Returns the image."""
    k = x_bf16.numel()
    img = bytearray(x_bf16.contiguous().view(torch.uint8).numpy().tobytes())
    orig = bytes(img)
    q_ref, s_ref = fp8_linear.quantise_input(x_bf16, layout)
    q_bytes = q_ref.view(torch.uint8).numpy().tobytes()
    passes = -(-k // PER_PASS)
    for p in range(passes):
        writes = []
        for tid in range(THREADS):
            e = p * PER_PASS + tid * PER_THREAD
            if e >= k:
                continue
            lo, hi = 2 * e, 2 * e + 16
            assert img[lo:hi] == orig[lo:hi], f"pass {p} thread {tid} reads bytes an earlier pass replaced"
            writes.append((e, q_bytes[e: e + PER_THREAD]))
        for e, b in writes:  # after the pass's barrier
            img[e: e + PER_THREAD] = b
    off = (k + 15) // 16 * 16
    s = s_ref.float().numpy().astype("<f4").tobytes()
    assert off + len(s) <= 2 * k, "the scales fit inside the bf16 vector"
    img[off: off + len(s)] = s
    return img, q_bytes, s, off


@pytest.mark.parametrize("layout", ["block", "channel"])
@pytest.mark.parametrize("k", [896, 1536, 2064, 3584, 4096, 14336, 27648])
def test_quantisation_passes_read_before_they_are_overwritten(layout, k):
    g = torch.Generator().manual_seed(k)
    x = (torch.randn(k, generator=g) * 2).bfloat16()
    img, q_bytes, s, off = _quantise_in_place(x, layout)
    assert bytes(img[:k]) == q_bytes
    assert bytes(img[off: off + len(s)]) == s


def test_quantise_input_matches_an_independent_formula():
    """quantise_input against a loop over groups with Python floats for the scale and torch for the rounding."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 300, generator=g) * torch.tensor([1e-3, 1.0, 50.0]).unsqueeze(1)).bfloat16()
    x[1, 128:256] = 0  # an all-zero group takes the floor scale
    q, s = fp8_linear.quantise_input(x, "block")
    for r in range(3):
        for gi, lo in enumerate(range(0, 300, 128)):
            grp = x[r, lo: lo + 128].float()
            want_s = max(grp.abs().max().item() / 448.0, 1.0 / (448.0 * 512.0))
            assert s[r, gi].item() == pytest.approx(want_s, rel=1e-7)
            want_q = (grp / s[r, gi]).clamp(-448, 448).to(torch.float8_e4m3fn)
            assert torch.equal(q[r, lo: lo + 128].view(torch.uint8), want_q.view(torch.uint8))
    qt, st = fp8_linear.quantise_input(x, "tensor")
    assert st.shape == (3, 1)
    assert torch.equal(qt.view(torch.uint8),
                       (x.float() * (1.0 / st)).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))


def test_quantised_linear_is_close_to_the_bf16_input_one():
    """The quantised input changes y by about e4m3's rounding (2^-4 relative per element), not more."""
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(64, 512, generator=g) * 0.05).to(torch.float8_e4m3fn)
    s = torch.rand(1, 4, generator=g) + 0.5
    x = torch.randn(512, generator=g).bfloat16()
    y0 = fp8_linear.linear_fp32(x, w, s, "block")
    y1 = fp8_linear.linear_fp32(x, w, s, "block", quantise_x=True)
    rel = ((y1 - y0).norm() / y0.norm()).item()
    assert 1e-4 < rel < 0.05
