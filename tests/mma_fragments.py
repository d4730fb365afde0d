"""mma.m16n8k16 (row.col) from per-lane fragments as the PTX ISA defines them, in float64: the CPU replays of the
tensor-core passes (test_attention_mma_fragments.py, test_fp8_mma_fragments.py) build their lanes' registers and run
them through this."""

from __future__ import annotations

import torch

LANES = 32


def mma_m16n8k16(a, b, c):
    """D = A B + C from per-lane fragments: a[lane] = 4 (lo, hi) words, b[lane] = 2 words, c[lane] = 4 floats
    (lane 4 g + t: A rows g / g + 8, columns 2t / 2t + 8; B rows 2t / 2t + 8, column g; C rows g / g + 8, columns
    2t, 2t + 1); returns d in C's layout."""
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
