"""The tensor-core attention pass (csrc/include/kog/attention_mma.cuh) lane by lane, in float64 on the CPU: each
lane's loads, the register words it builds from them, mma.m16n8k16 and movmatrix as the PTX ISA defines their
fragments, and the online softmax, for one warp over a split. The result must equal attention computed directly,
which checks the dimension permutations and fragment maps without a GPU (bf16 rounding left out: exact arithmetic
isolates the index maps). GPU kernel tests then check the compiled pass against the reference."""

from __future__ import annotations

import math

import pytest
import torch

LANES = 32


def _mma(a, b, c):
    """D = A B + C for mma.m16n8k16 from per-lane fragments: a[lane] = 4 (lo, hi) words, b[lane] = 2 words,
    c[lane] = 4 floats; returns d in C's layout."""
    A = torch.zeros(16, 16, dtype=torch.float64)
    B = torch.zeros(16, 8, dtype=torch.float64)
    C = torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(LANES):
        g, t = lane >> 2, lane & 3
        for r, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[row, col], A[row, col + 1] = a[lane][r]
        for r, k in enumerate((2 * t, 2 * t + 8)):
            B[k, g], B[k + 1, g] = b[lane][r]
        C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1] = c[lane]
    D = A @ B + C
    return [[D[l >> 2, 2 * (l & 3)], D[l >> 2, 2 * (l & 3) + 1], D[(l >> 2) + 8, 2 * (l & 3)],
             D[(l >> 2) + 8, 2 * (l & 3) + 1]] for l in range(LANES)]  # fmt: skip


def _movmatrix_trans(x):
    """movmatrix.m8n8.trans.b16: lane 4g + t holds row g, columns 2t, 2t + 1 before and after."""
    M = torch.zeros(8, 8, dtype=torch.float64)
    for lane in range(LANES):
        g, t = lane >> 2, lane & 3
        M[g, 2 * t], M[g, 2 * t + 1] = x[lane]
    T = M.t()
    return [(T[l >> 2, 2 * (l & 3)], T[l >> 2, 2 * (l & 3) + 1]) for l in range(LANES)]


def _words(vec):
    """A lane's loaded bf16 values as 32-bit words (lo, hi)."""
    return [(vec[2 * i], vec[2 * i + 1]) for i in range(len(vec) // 2)]


def _warp_pass(q, k, v, start, end, hp, warp=0, warps=1):
    """attend_positions_mma for one warp (tiles base = start + warp 16 kTiles, step warps 16 kTiles) and
    store_mma_state for each group of 4 heads: q [hp, D] (hp <= 8, the mma's columns), k / v [T, D] (one KV head).
    Returns (m [hp], l [hp], acc [hp, D]) as the warp writes them (log2 units)."""
    D = q.shape[1]
    KS, kTiles = D // 16, 2 if D == 64 else 1
    scale = D**-0.5 * math.log2(math.e)
    qb = []
    for lane in range(LANES):
        g, t = lane >> 2, lane & 3
        row = []
        for s in range(KS):
            base = (D // 4) * t + 4 * s
            qv = q[g] if g < hp else torch.zeros(D, dtype=torch.float64)
            row.append(((qv[base], qv[base + 1]), (qv[base + 2], qv[base + 3])))
        qb.append(row)
    o = [[[0.0] * 4 for _ in range(KS)] for _ in range(LANES)]
    mrow = [[-math.inf, -math.inf] for _ in range(LANES)]
    lrow = [[0.0, 0.0] for _ in range(LANES)]
    for base in range(start + warp * 16 * kTiles, end, warps * 16 * kTiles):
        for u in range(kTiles):
            tile = base + 16 * u
            kw, kok, vw = [], [], []
            for lane in range(LANES):
                g, t = lane >> 2, lane & 3
                rows, oks = [], []
                for h in range(2):
                    # load_mma_tile: a row past the split's end reads the tile's first row (masked by ok); a tile
                    # wholly past the end is zeros.
                    p = tile + g + 8 * h
                    ok = p < end
                    seg = (
                        k[p if ok else tile, (D // 4) * t : (D // 4) * (t + 1)]
                        if tile < end
                        else torch.zeros(D // 4, dtype=torch.float64)
                    )
                    rows.append(_words(seg))
                    oks.append(ok)
                kw.append(rows)
                kok.append(oks)
                vs = []
                for i in range(4):
                    p = tile + 2 * t + (i & 1) + 8 * (i >> 1)
                    seg = (
                        v[p if p < end else tile, (D // 8) * g : (D // 8) * (g + 1)]
                        if tile < end
                        else torch.zeros(D // 8, dtype=torch.float64)
                    )
                    vs.append(_words(seg))
                vw.append(vs)
            sc = [[0.0] * 4 for _ in range(LANES)]
            for s in range(KS):
                a = [[kw[l][0][2 * s], kw[l][1][2 * s], kw[l][0][2 * s + 1], kw[l][1][2 * s + 1]] for l in range(LANES)]
                sc = _mma(a, [qb[l][s] for l in range(LANES)], sc)
            sc = [[float(sc[l][i]) * scale if kok[l][i >> 1] else -math.inf for i in range(4)] for l in range(LANES)]
            p = [[0.0] * 4 for _ in range(LANES)]
            corr = [[1.0, 1.0] for _ in range(LANES)]
            for c in range(2):
                for t in range(4):  # lanes of equal t: the shuffle max over g
                    group = [4 * g + t for g in range(8)]
                    mx = max(max(sc[l][c], sc[l][2 + c]) for l in group)
                    for l in group:
                        mn = max(mrow[l][c], mx)
                        corr[l][c] = 0.0 if mrow[l][c] == -math.inf else 2.0 ** (mrow[l][c] - mn)
                        p[l][c] = 0.0 if sc[l][c] == -math.inf else 2.0 ** (sc[l][c] - mn)
                        p[l][2 + c] = 0.0 if sc[l][2 + c] == -math.inf else 2.0 ** (sc[l][2 + c] - mn)
                        lrow[l][c] = lrow[l][c] * corr[l][c] + p[l][c] + p[l][2 + c]
                        mrow[l][c] = mn
            pb0 = _movmatrix_trans([(p[l][0], p[l][1]) for l in range(LANES)])
            pb1 = _movmatrix_trans([(p[l][2], p[l][3]) for l in range(LANES)])
            for m in range(KS):
                a = []
                for l in range(LANES):
                    o[l][m] = [o[l][m][0] * corr[l][0], o[l][m][1] * corr[l][1], o[l][m][2] * corr[l][0],
                               o[l][m][3] * corr[l][1]]  # fmt: skip
                    w0, w1, w2, w3 = (vw[l][i][m] for i in range(4))
                    # __byte_perm(x, y, 0x5410): low halves (x.lo, y.lo); 0x7632: high halves (x.hi, y.hi)
                    a.append([(w0[0], w1[0]), (w0[1], w1[1]), (w2[0], w3[0]), (w2[1], w3[1])])
                d = _mma(a, [(pb0[l], pb1[l]) for l in range(LANES)], [o[l][m] for l in range(LANES)])
                for l in range(LANES):
                    o[l][m] = [float(x) for x in d[l]]
    for c in range(2):
        for t in range(4):
            group = [4 * g + t for g in range(8)]
            total = sum(lrow[l][c] for l in group)
            for l in group:
                lrow[l][c] = total
    m_out = torch.full((hp,), -math.inf, dtype=torch.float64)
    l_out = torch.zeros(hp, dtype=torch.float64)
    acc = torch.full((hp, D), math.nan, dtype=torch.float64)
    for h0 in range(0, hp, 4):  # store_mma_state: heads [h0, h0 + 4) into slots 0..3, then the next group
        n = min(4, hp - h0)
        for l in range(LANES):
            g, t = l >> 2, l & 3
            for c in range(2):
                i = 2 * t + c - h0
                if i < 0 or i >= n:
                    continue
                if g == 0:
                    m_out[h0 + i], l_out[h0 + i] = mrow[l][c], lrow[l][c]
                for m in range(KS):
                    acc[h0 + i, (D // 8) * g + 2 * m] = o[l][m][c]
                    acc[h0 + i, (D // 8) * g + 2 * m + 1] = o[l][m][2 + c]
    return m_out, l_out, acc


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("hp", [1, 2, 4, 5, 8])
@pytest.mark.parametrize("start,end", [(0, 16), (3, 40), (5, 5 + 96), (48, 48 + 33), (0, 1)])
def test_fragment_maps_give_attention(head_dim, hp, start, end):
    gen = torch.Generator().manual_seed(head_dim * 100 + hp * 10 + end)
    T = end + 64  # positions past `end` hold values the pass must not read
    q = torch.randn(hp, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(T, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(T, head_dim, generator=gen, dtype=torch.float64)
    k[end:] = math.nan
    v[end:] = math.nan
    m, l, acc = _warp_pass(q, k, v, start, end, hp)
    s2 = (q @ k[start:end].t()) * (head_dim**-0.5 * math.log2(math.e))  # [hp, n]
    m_ref = s2.max(dim=1).values
    p = torch.exp2(s2 - m_ref[:, None])
    torch.testing.assert_close(m, m_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(l, p.sum(dim=1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(acc, p @ v[start:end], rtol=1e-10, atol=1e-10)
