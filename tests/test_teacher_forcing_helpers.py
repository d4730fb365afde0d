"""integration_tests/teacher_forcing.py on CPU: the sampler proxy records (and forces) only the steps whose token
vLLM keeps, also when a prompt is prefilled in chunks, and parity_failures / fp8_parity_failures apply
test_teacher_forcing's checks."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration_tests"))

from teacher_forcing import Recording, _SamplerProxy, fp8_parity_failures, parity_failures  # noqa: E402


def _batch(computed: int, scheduled: int, prompt: int):
    return SimpleNamespace(num_computed_tokens_np=np.array([computed]), num_scheduled_tokens=np.array([scheduled]),
                           prefill_len_np=np.array([prompt]))


class _Sampler:
    def __call__(self, logits, input_batch):
        return SimpleNamespace(sampled_token_ids=torch.tensor([[int(logits.argmax())]]))


def test_proxy_skips_prefill_chunks_before_the_last():
    proxy = _SamplerProxy(_Sampler(), vocab=8, force=[5, 6, 7])
    logits = torch.zeros(1, 10)
    logits[0, 2] = 1.0
    steps = [(0, 256, 600), (256, 256, 600), (512, 88, 600), (600, 1, 600), (601, 1, 600)]  # 3 chunks, 2 decodes
    out = [int(proxy(logits, _batch(*s)).sampled_token_ids) for s in steps]
    assert out == [2, 2, 5, 6, 7]  # the partial chunks' discarded tokens untouched; kept steps forced in order
    assert len(proxy.rows) == 3 and proxy.rows[0].shape == (8,)
    # A last chunk of one token (the prompt's last position) is a kept step.
    proxy = _SamplerProxy(_Sampler(), vocab=8, force=None)
    proxy(logits, _batch(599, 1, 600))
    assert len(proxy.rows) == 1


def _rec(tokens, rows):
    return Recording(tokens, torch.tensor(rows, dtype=torch.float32), None)


def test_parity_failures():
    stock = _rec([0, 1], [[3.0, 1.0, 0.0], [0.0, 3.0, 2.95]])
    same = _rec([0, 1], [[3.0, 1.0, 0.0], [0.0, 3.0, 2.95]])
    assert parity_failures(stock, same, same, atol=0.1)[1] == []
    near_tie = _rec([0, 2], [[3.0, 1.0, 0.0], [0.0, 2.97, 2.99]])  # flips at step 1, margin 0.05 <= 2 atol
    c, failures = parity_failures(stock, near_tie, near_tie, atol=0.1)
    assert failures == [] and [i for i, _ in c.flips] == [1] and c.first_free_mismatch == 1
    far = _rec([0, 1], [[3.0, 1.0, 0.0], [0.0, 3.0, 3.5]])  # 0.55 off
    assert any("max |dlogit|" in f for f in parity_failures(stock, same, far, atol=0.1)[1])
    wrong_free = _rec([1, 1], [[3.0, 1.0, 0.0], [0.0, 3.0, 2.95]])  # free run differs where nothing flipped
    assert any("not a flip step" in f for f in parity_failures(stock, wrong_free, same, atol=0.1)[1])


def test_fp8_parity_failures_bound_kog_by_the_reference_and_by_the_measured_stock_spread():
    stock = _rec([0, 1], [[3.0, 1.0, 0.0], [0.0, 3.0, 2.0]])
    reference = _rec([0, 1], [[3.4, 1.0, 0.0], [0.0, 2.8, 2.0]])  # FP8 activations moved stock by d = 0.4
    near_ref = _rec([0, 1], [[3.45, 1.05, 0.0], [0.0, 2.75, 2.0]])  # 0.05 from the reference, 0.45 from stock
    p, failures = fp8_parity_failures(stock, reference, near_ref, near_ref, atol=0.1)
    assert failures == []
    assert p.stock_vs_reference == pytest.approx(0.4) and p.kog_stock_bound == pytest.approx(1.25 * 0.4 + 0.1)
    assert p.vs_reference.max_abs_diff == pytest.approx(0.05) and p.vs_stock.max_abs_diff == pytest.approx(0.45)
    # as far from stock, but not the reference's computation: 0.3 from the reference > atol
    off_ref = _rec([0, 1], [[3.1, 1.0, 0.0], [0.0, 3.1, 2.0]])
    failures = fp8_parity_failures(stock, reference, off_ref, off_ref, atol=0.1)[1]
    assert [f for f in failures if f.startswith("kog vs reference: max |dlogit| 0.3")]
    # kog at the reference's argmax flip beyond 2 atol
    flipped = _rec([0, 2], [[3.4, 1.0, 0.0], [0.0, 2.8, 2.9]])
    failures = fp8_parity_failures(stock, reference, flipped, flipped, atol=0.1)[1]
    assert any(f.startswith("kog vs reference: flips beyond 2 x atol") for f in failures)
    assert any(f.startswith("kog vs stock (bound 1.25 x 0.4000 + 0.1): max |dlogit| 0.9") for f in failures)
    # a reference unrelated to stock (a scale applied wrongly) fails the guard even when kog agrees with it
    wrong = _rec([2, 0], [[0.0, 1.0, 3.0], [3.0, 0.0, 1.0]])
    failures = fp8_parity_failures(stock, wrong, wrong, wrong, atol=0.1)[1]
    assert any(f.startswith("reference vs stock: relative distance") for f in failures)
