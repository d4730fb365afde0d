"""The torch decode step (kog's oracle) against Hugging Face transformers on tiny random Llama, Qwen3 and Qwen2
models (Qwen2: QKV bias).

Each sequence is decoded one position at a time through a paged CPU cache with a shuffled block table, and the
logits at every position are compared with HF's full-sequence forward. In float32 the only differences are
summation order, so the tolerance is tight; in bf16 the stated tolerance is a relative error of the logits.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_models import tiny_hf_model, weights_from_hf  # noqa: E402
from kog_backend.path import model_spec  # noqa: E402
from kog_backend.reference import torch_step  # noqa: E402

BLOCK_SIZE = 16  # the smallest of the gate's tested KV block sizes (kv_cache.TESTED_BLOCK_SIZES)


def _paged_caches(shape: model_spec.DecoderShape, num_blocks: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """vLLM's flash layout: logical [blocks, kv_heads, block, 2D] over NHD memory; poisoned with NaN."""
    caches = []
    for _ in range(shape.num_layers):
        mem = torch.full((num_blocks, BLOCK_SIZE, shape.num_kv_heads, 2 * shape.head_dim), float("nan"), dtype=dtype)
        caches.append(mem.permute(0, 2, 1, 3))
    return caches


@pytest.mark.parametrize(
    "arch,head_dim,gqa,tied",
    [("llama", 64, 4, True), ("llama", 128, 1, False), ("qwen3", 128, 2, True), ("qwen3", 64, 4, False),
     ("qwen2", 128, 2, True), ("qwen2", 64, 4, False)],
)
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 2e-4), (torch.bfloat16, 3e-2)])
def test_decode_matches_hf(arch, head_dim, gqa, tied, dtype, rtol):
    hf = tiny_hf_model(arch, head_dim, gqa, tied, vocab_size=500, intermediate_size=192)
    cfg = hf.config
    seq_len = 19  # crosses several blocks, ends mid-block
    tokens = torch.randint(0, cfg.vocab_size, (seq_len,))
    with torch.no_grad():
        ref = hf(tokens[None]).logits[0].float()  # [T, V]

    weights = weights_from_hf(hf, arch, dtype)
    num_blocks = 16
    caches = _paged_caches(weights.shape, num_blocks, dtype)
    used = (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE
    block_table = torch.zeros(num_blocks, dtype=torch.int32)  # vLLM's rows are padded to max blocks per request
    block_table[:used] = torch.randperm(num_blocks - 1)[:used] + 1
    got = []
    with torch.no_grad():
        for pos in range(seq_len):
            slot = int(block_table[pos // BLOCK_SIZE]) * BLOCK_SIZE + pos % BLOCK_SIZE
            h = torch_step.decode_hidden(
                weights, caches, torch_step.embed(weights, int(tokens[pos])), pos, slot, block_table, pos + 1 + 3
            )
            got.append(torch_step.logits(weights, h).float())
    got = torch.stack(got)
    assert torch.isfinite(got).all()
    rel = (got - ref).norm() / ref.norm()
    assert rel < rtol, f"relative error {rel:.2e} >= {rtol:.0e}"
    if dtype == torch.float32:
        assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_append_kv_writes_only_its_slot():
    shape = model_spec.DecoderShape("llama", 1, 8, 2, 2, 64, 8, 10, 10, 0, 1e-5, False, True, 8)
    caches = _paged_caches(shape, 4, torch.float32)
    view = model_spec.kv_cache_view(caches[0], 64)
    k, v = torch.randn(2, 64), torch.randn(2, 64)
    torch_step.append_kv(view, k, v, slot=2 * BLOCK_SIZE + 3)
    assert torch.equal(view.k[2, 3], k) and torch.equal(view.v[2, 3], v)
    written = ~torch.isnan(caches[0])
    assert written.sum() == 2 * 2 * 64


def test_greedy_breaks_ties_to_lowest_index():
    row = torch.tensor([0.5, 2.0, -1.0, 2.0], dtype=torch.bfloat16)
    assert int(torch_step.greedy(row)) == 1
