"""Two-sample chi-square test of homogeneity for token counts (used by test_sampled_distribution.py).

Tokens whose pooled expected count is below `min_expected` in either sample are merged into one bin (the usual
validity condition of the chi-square approximation); the p-value is the upper tail of chi-square with
(bins - 1) degrees of freedom, from torch.special.gammaincc (no scipy needed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


def chi2_homogeneity(a: Iterable[int], b: Iterable[int], min_expected: float = 5.0) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) for "samples a and b come from the same distribution"."""
    import torch

    ca, cb = Counter(a), Counter(b)
    na, nb = sum(ca.values()), sum(cb.values())
    if na == 0 or nb == 0:
        raise ValueError("both samples must be non-empty")
    n = na + nb
    bins: list[tuple[int, int]] = []
    rest_a = rest_b = 0
    for tok in sorted(set(ca) | set(cb)):
        x, y = ca.get(tok, 0), cb.get(tok, 0)
        if min((x + y) * na / n, (x + y) * nb / n) >= min_expected:
            bins.append((x, y))
        else:
            rest_a, rest_b = rest_a + x, rest_b + y
    if rest_a + rest_b > 0:
        bins.append((rest_a, rest_b))
    if len(bins) < 2:
        return 0.0, 0, 1.0
    stat = 0.0
    for x, y in bins:
        t = x + y
        ea, eb = t * na / n, t * nb / n
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    df = len(bins) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p
