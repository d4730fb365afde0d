"""integration_tests/stats.py: the chi-square homogeneity test used by the sampled-distribution GPU test."""

from __future__ import annotations

import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration_tests"))

from stats import chi2_homogeneity  # noqa: E402


def _draw(rng, weights, n):
    return rng.choices(range(len(weights)), weights=weights, k=n)


def test_same_distribution_is_not_rejected_and_a_shifted_one_is():
    rng = random.Random(7)
    w = [rng.random() ** 3 for _ in range(200)]
    stat, df, p = chi2_homogeneity(_draw(rng, w, 5000), _draw(rng, w, 5000))
    assert df > 10 and p > 1e-3, (stat, df, p)
    hotter = [x**0.5 for x in w]  # logits halved: temperature doubled
    stat, df, p = chi2_homogeneity(_draw(rng, w, 5000), _draw(rng, hotter, 5000))
    assert p < 1e-6, (stat, df, p)


def test_known_statistic():
    # Two bins, counts (30, 10) vs (20, 20): expected 25/15 and 25/15; statistic = 2 * (25/25 + 25/15).
    a = [0] * 30 + [1] * 10
    b = [0] * 20 + [1] * 20
    stat, df, p = chi2_homogeneity(a, b)
    assert df == 1 and stat == pytest.approx(2 * (25 / 25 + 25 / 15))
    assert p == pytest.approx(0.0209, abs=2e-4)  # chi2(1) upper tail at 5.333


def test_rare_tokens_are_merged_and_empty_samples_refused():
    a = [0] * 100 + list(range(1, 11))
    b = [0] * 100 + list(range(11, 21))
    stat, df, _ = chi2_homogeneity(a, b)
    assert df == 1  # token 0, and one bin for the twenty rare tokens
    with pytest.raises(ValueError):
        chi2_homogeneity([], [1])
