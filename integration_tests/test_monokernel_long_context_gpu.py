"""The monokernel against its torch reference at long contexts and at every KV block size the gate accepts (an sm_90
GPU, no vLLM).

test_monokernel_gpu.py checks contexts up to 32,000 positions with 16-position blocks; this file covers the range
the gate admits (kog_backend.path.eligibility: MAX_TESTED_CONTEXT positions, TESTED_BLOCK_SIZES), with the same
method: fresh random weights and K/V per case, every buffer the kernel writes NaN-poisoned (scratch, partials,
logits, the new slot, every cache slot past the context), one launch, then each stage of each layer against torch
recomputed from the kernel's own inputs (bf16 within 1e-2 |ref| + 1e-2 rms(ref), 5e-3 in relative norm; the fp32
attention partials within 2e-3), the K/V written at the slot and no other cache bit changed, the token the first
argmax of the kernel's logits, and the logits end to end against reference_step within 2e-2 relative norm.

Contexts 8,192, 32,768, 65,535 and MAX_TESTED_CONTEXT (131,072); GQA 1, 4, 8; head dims 64 and 128 (two layers,
hidden 1536: the caches of the longest context take 2 GiB per copy); one HND cache; block sizes 32, 64, 128 at
5,000 and 40,000 positions. Case ids name the context (`ctx131072`), so `-k ctx131072` or `-k "not ctx131072"`
selects by length; `-k block` the block sizes.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernel_gpu import require_sm90_extension  # noqa: E402

require_sm90_extension()

from test_monokernel_gpu import _check_step, _poison  # noqa: E402

from kog_backend.monokernel import Monokernel, reference, synthetic  # noqa: E402
from kog_backend.path.eligibility import MAX_TESTED_CONTEXT, TESTED_BLOCK_SIZES  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0)
CONTEXTS = (8192, 32768, 65535, MAX_TESTED_CONTEXT)
BLOCK_CONTEXTS = (5000, 40000)
SLACK_BLOCKS = 8  # cache blocks beyond the longest context (block 0 is never used for data)


def _shape(head_dim: int, gqa: int, arch: str = "llama"):
    heads = 2048 // head_dim
    return synthetic.make_shape(arch, 2, 1536, heads, heads // gqa, head_dim, 3072, 32003, arch == "llama",
                                MAX_TESTED_CONTEXT + 256)  # fmt: skip


_MODEL: dict = {}


def _model(head_dim: int, gqa: int, block: int = 16, layout: str = "NHD", arch: str = "llama"):
    """Weights, caches for the longest context and a Monokernel; one configuration kept at a time (GPU memory)."""
    key = (head_dim, gqa, block, layout, arch)
    if key not in _MODEL:
        _MODEL.clear()
        torch.cuda.empty_cache()
        s = _shape(head_dim, gqa, arch)
        w = synthetic.random_decoder(s, DEV, seed=hash(key) % 1000)
        num_blocks = -(-MAX_TESTED_CONTEXT // block) + SLACK_BLOCKS
        caches = synthetic.paged_kv_caches(s, num_blocks, block, DEV, layout)
        mk = Monokernel(w, caches, DEV, max_model_len=MAX_TESTED_CONTEXT + 1)
        _MODEL[key] = (w, caches, mk, num_blocks)
    return _MODEL[key]


def _launch_and_check(w, caches, mk, num_blocks: int, block: int, ctx: int, seed: int) -> list[str]:
    """Fills a context of ctx - 1 positions through a shuffled block table (NaN elsewhere), launches the step at
    position ctx - 1 and returns every disagreement with the reference."""
    s = w.shape
    pos = ctx - 1
    needed = -(-ctx // block)
    bt = synthetic.shuffled_block_table(num_blocks, needed, num_blocks, DEV, seed=seed)
    for c in caches:
        c.fill_(math.nan)
    synthetic.fill_context(caches, bt, pos, s.head_dim, seed=seed)
    slot = int(bt[pos // block]) * block + pos % block
    token = (seed * 7919) % s.vocab_size
    logits_out = torch.empty(s.vocab_size, dtype=torch.bfloat16, device=DEV)
    _poison(mk, logits_out)
    pre = [c.clone() for c in caches]
    tok = mk.step(torch.tensor([token], device=DEV), torch.tensor([pos], device=DEV), bt,
                  torch.tensor([slot], device=DEV), logits_out=logits_out)
    torch.cuda.synchronize()
    errors: list[str] = []
    splits = mk.attention_splits(ctx)
    got = _check_step(w, caches, mk, token, pos, slot, bt, logits_out, errors, pre, int(tok.item()), splits, block)
    if got is None:  # a wait timed out: nothing to compare end to end
        return errors
    del got
    ref = reference.reference_step(w, pre, token, pos, slot, bt, splits)
    rel = ((logits_out.float() - ref["logits"].float()).norm() / ref["logits"].float().norm()).item()
    if rel > 2e-2:
        errors.append(f"end to end: logits relative error {rel:.2e} vs reference_step ({splits} splits)")
    return errors


_CASES = [(d, g, c) for d in (64, 128) for g in (1, 4, 8) for c in CONTEXTS]


@pytest.mark.parametrize("head_dim,gqa,ctx", _CASES, ids=[f"d{d}-gqa{g}-ctx{c}" for d, g, c in _CASES])
def test_long_context_matches_reference(head_dim, gqa, ctx):
    w, caches, mk, num_blocks = _model(head_dim, gqa)
    errors = _launch_and_check(w, caches, mk, num_blocks, 16, ctx, seed=ctx % 9973 + gqa * 131 + head_dim)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("arch,layout", [("llama", "HND"), ("qwen3", "NHD")])
def test_long_context_hnd_and_qwen3(arch, layout):
    """An HND cache and the qk-norm / untied Qwen3 variant at 32,768 positions, GQA 4, head dim 128."""
    w, caches, mk, num_blocks = _model(128, 4, layout=layout, arch=arch)
    errors = _launch_and_check(w, caches, mk, num_blocks, 16, 32768, seed=77 if arch == "llama" else 78)
    assert not errors, "\n".join(errors)


_BLOCK_CASES = [(b, c) for b in TESTED_BLOCK_SIZES if b != 16 for c in BLOCK_CONTEXTS]


@pytest.mark.parametrize("block,ctx", _BLOCK_CASES, ids=[f"block{b}-ctx{c}" for b, c in _BLOCK_CASES])
def test_block_sizes_the_gate_accepts(block, ctx):
    """Every block size in eligibility.TESTED_BLOCK_SIZES other than 16 (test_monokernel_gpu.py's), GQA 8, head dim
    128 (Llama-3.1-8B's attention shape)."""
    w, caches, mk, num_blocks = _model(128, 8, block=block)
    errors = _launch_and_check(w, caches, mk, num_blocks, block, ctx, seed=block + ctx)
    assert not errors, "\n".join(errors)


def test_cases_cover_the_gate():
    """The gate admits what this file tests: its longest context and every block size it accepts."""
    assert max(CONTEXTS) == MAX_TESTED_CONTEXT
    assert {b for b, _ in _BLOCK_CASES} | {16} == set(TESTED_BLOCK_SIZES)
