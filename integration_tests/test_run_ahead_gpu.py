"""The monokernel's run-ahead inputs on an sm_90 GPU (no vLLM): `launch_gate` and `cancel` (kog_backend/path/run_ahead.py).

A burst of K tokens followed, on the same stream and without a host synchronisation, by a gated launch of the
next K (input: the burst's last token, read on the GPU) gives the tokens, logits and caches of one launch of 2K
tokens bit for bit. A closed gate (the burst stopped early) leaves every cache bit and the epoch as they were, so
the next launch is still right. A cancel word at or past the launch's id ends it after one token, stored as
-1 - id, with no wait timing out. Fresh random weights (untied LM head, so greedy tokens vary) and context per
case; caches past the context are NaN.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernel_gpu import require_sm90_extension  # noqa: E402

from kog_backend.monokernel import Monokernel, synthetic  # noqa: E402

pytestmark = pytest.mark.gpu

require_sm90_extension()

DEV = torch.device("cuda", 0)
BS = 16
MAX_CTX = 2048
NUM_BLOCKS = MAX_CTX // BS + 16
K = 4


@pytest.fixture(scope="module")
def model():
    s = synthetic.make_shape("llama", 2, 1536, 16, 4, 128, 3072, 32003, False, MAX_CTX + 64)
    w = synthetic.random_decoder(s, DEV, seed=31)
    caches = synthetic.paged_kv_caches(s, NUM_BLOCKS, BS, DEV)
    return w, caches, Monokernel(w, caches, DEV, max_model_len=MAX_CTX)


def _fresh_context(w, caches, ctx, seed):
    """Block table over MAX_CTX, context [0, ctx - 1) of random K/V, NaN elsewhere; (pos, block_table)."""
    bt = synthetic.shuffled_block_table(NUM_BLOCKS, MAX_CTX // BS, MAX_CTX // BS, DEV, seed=seed)
    for c in caches:
        c.fill_(math.nan)
    synthetic.fill_context(caches, bt, ctx - 1, w.shape.head_dim, seed=seed)
    return ctx - 1, bt


def _slot(bt, p):
    return torch.tensor([int(bt[p // BS]) * BS + p % BS], device=DEV)


def _bits(caches):
    return [c.view(torch.int16).clone() for c in caches]


def _launch_pair(mk, token, pos, bt, stop=None, cancel=None, cancel_id=0):
    """A K-token burst and its gated successor, queued back to back; returns both (tokens, count)."""
    ids = torch.tensor([token], device=DEV)
    logits = torch.full((2 * K, mk.logical_vocab), math.nan, dtype=torch.bfloat16, device=DEV)
    a = mk.generate(ids, torch.tensor([pos], device=DEV), bt, _slot(bt, pos), K, stop_ids=stop, logits_out=logits[:K])
    # The successor's inputs come from the GPU: the burst's last token and count; nothing waits on the host.
    positions = torch.tensor([pos], device=DEV) + K
    b = mk.generate(a[0][K - 1 : K], positions, bt, _slot(bt, pos + K), K, stop_ids=stop, logits_out=logits[K:],
                    launch_gate=a[1], gate_min=K, cancel=cancel, cancel_id=cancel_id)  # fmt: skip
    return a, b, logits


@pytest.mark.parametrize("ctx", [17, 300])
def test_gated_successor_equals_one_long_launch(model, ctx):
    w, caches, mk = model
    pos, bt = _fresh_context(w, caches, ctx, seed=ctx)
    init = [c.clone() for c in caches]
    long_logits = torch.full((2 * K, mk.logical_vocab), math.nan, dtype=torch.bfloat16, device=DEV)
    tokens, count = mk.generate(torch.tensor([5], device=DEV), torch.tensor([pos], device=DEV), bt, _slot(bt, pos),
                                2 * K, logits_out=long_logits)  # fmt: skip
    want, want_caches = tokens.tolist(), _bits(caches)
    assert int(count.item()) == 2 * K
    for c, c0 in zip(caches, init):
        c.copy_(c0)
    (ta, ca), (tb, cb), logits = _launch_pair(mk, 5, pos, bt)
    torch.cuda.synchronize()
    assert mk.diagnostics() is None, mk.diagnostics()
    assert (int(ca.item()), int(cb.item())) == (K, K)
    assert ta.tolist() + tb.tolist() == want
    assert torch.equal(logits.view(torch.int16), long_logits.view(torch.int16)), "logits differ"
    assert all(torch.equal(a, b) for a, b in zip(_bits(caches), want_caches)), "caches differ"


def test_closed_gate_does_nothing(model):
    """The burst stops at its second token; the successor then writes no token, no count, no cache bit, and
    does not advance the epoch: a launch after it continues correctly."""
    w, caches, mk = model
    pos, bt = _fresh_context(w, caches, 200, seed=7)
    init = [c.clone() for c in caches]
    free, _ = mk.generate(torch.tensor([9], device=DEV), torch.tensor([pos], device=DEV), bt, _slot(bt, pos), 2 * K)
    free = free.tolist()
    assert free[1] not in free[:1], "the random model repeats its first token; pick another seed"
    for c, c0 in zip(caches, init):
        c.copy_(c0)
    stop = torch.tensor([free[1]], device=DEV)
    (ta, ca), (tb, cb), _ = _launch_pair(mk, 9, pos, bt, stop=stop)
    torch.cuda.synchronize()
    after_burst = _bits(caches)
    assert mk.diagnostics() is None, mk.diagnostics()
    assert int(ca.item()) == 2 and ta.tolist()[:2] == free[:2]
    assert int(cb.item()) == 0
    # Caches: exactly the burst's two positions written (compare with the burst alone).
    for c, c0 in zip(caches, init):
        c.copy_(c0)
    mk.generate(torch.tensor([9], device=DEV), torch.tensor([pos], device=DEV), bt, _slot(bt, pos), K, stop_ids=stop)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(after_burst, _bits(caches))), "the closed launch wrote the cache"
    # The epoch did not move: the next position's launch gives the free-running tokens.
    nxt, n = mk.generate(torch.tensor([free[1]], device=DEV), torch.tensor([pos + 2], device=DEV), bt,
                         _slot(bt, pos + 2), K)  # fmt: skip
    assert int(n.item()) == K and nxt.tolist() == free[2 : 2 + K]
    assert mk.diagnostics() is None, mk.diagnostics()


def test_cancel_word(model):
    """Word below the id: no effect. Word at the id, written before the launch starts: the successor ends after
    its first token, stored as -1 - id. Later launches are unaffected."""
    w, caches, mk = model
    pos, bt = _fresh_context(w, caches, 64, seed=3)
    init = [c.clone() for c in caches]
    free, _ = mk.generate(torch.tensor([11], device=DEV), torch.tensor([pos], device=DEV), bt, _slot(bt, pos), 2 * K)
    free = free.tolist()
    word = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    for c, c0 in zip(caches, init):
        c.copy_(c0)
    word[0] = 6
    (ta, _), (tb, cb), _ = _launch_pair(mk, 11, pos, bt, cancel=word, cancel_id=7)
    torch.cuda.synchronize()
    assert int(cb.item()) == K and ta.tolist() + tb.tolist() == free
    for c, c0 in zip(caches, init):
        c.copy_(c0)
    word[0] = 0
    torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time ahead of both launches: the write below comes first
    (ta, _), (tb, cb), _ = _launch_pair(mk, 11, pos, bt, cancel=word, cancel_id=8)
    word[0] = 8
    torch.cuda.synchronize()
    assert mk.diagnostics() is None, mk.diagnostics()
    assert int(cb.item()) == 1, tb.tolist()
    assert tb.tolist()[0] == -1 - free[K]
    # An uncancelled launch afterwards (ids only grow; 9 > 8) runs in full from where the cancelled one stopped.
    nxt, n = mk.generate(torch.tensor([free[K]], device=DEV), torch.tensor([pos + K + 1], device=DEV), bt,
                         _slot(bt, pos + K + 1), K - 1, cancel=word, cancel_id=9)  # fmt: skip
    assert int(n.item()) == K - 1 and nxt.tolist() == free[K + 1 :]
    assert mk.diagnostics() is None, mk.diagnostics()


def test_launcher_checks(model):
    w, caches, mk = model
    pos, bt = _fresh_context(w, caches, 20, seed=1)
    ids, p = torch.tensor([1], device=DEV), torch.tensor([pos], device=DEV)
    with pytest.raises(RuntimeError, match="cancel must be a pinned CPU int64"):
        mk.generate(ids, p, bt, _slot(bt, pos), 2, cancel=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="launch_gate must be int32"):
        mk.generate(ids, p, bt, _slot(bt, pos), 2, launch_gate=torch.zeros(1, dtype=torch.int64, device=DEV))
