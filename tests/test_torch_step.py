"""The torch decode step (kog's oracle) against Hugging Face transformers on tiny random Llama and Qwen3 models.

Each sequence is decoded one position at a time through a paged CPU cache with a shuffled block table, and the
logits at every position are compared with HF's full-sequence forward. In float32 the only differences are
summation order, so the tolerance is tight; in bf16 the stated tolerance is a relative error of the logits.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kog_backend import model_spec, torch_step  # noqa: E402

BLOCK_SIZE = 4


def _tiny_config(arch: str, head_dim: int, gqa: int, tied: bool):
    common = dict(
        vocab_size=500,
        hidden_size=128,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4 // gqa,
        head_dim=head_dim,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
    )
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return transformers.LlamaConfig(rope_parameters=rope, **common)
    return transformers.Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common)


def _weights_from_hf(hf_model, arch: str, dtype: torch.dtype) -> model_spec.DecoderWeights:
    """vLLM's layout from HF's: q|k|v rows fused, gate|up rows fused; RoPE cache from vLLM's own get_rope."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    cfg = hf_model.config
    m = hf_model.model
    layers = []
    for layer in m.layers:
        a, mlp = layer.self_attn, layer.mlp
        layers.append(
            model_spec.LayerWeights(
                input_norm=layer.input_layernorm.weight.data.to(dtype),
                qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).data.to(dtype),
                q_norm=a.q_norm.weight.data.to(dtype) if hasattr(a, "q_norm") else None,
                k_norm=a.k_norm.weight.data.to(dtype) if hasattr(a, "k_norm") else None,
                o_proj=a.o_proj.weight.data.to(dtype),
                post_norm=layer.post_attention_layernorm.weight.data.to(dtype),
                gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).data.to(dtype),
                down=mlp.down_proj.weight.data.to(dtype),
            )
        )
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        rope = get_rope(cfg.head_dim, cfg.max_position_embeddings, True, dict(cfg.rope_parameters), torch.float32)
    shape = model_spec.DecoderShape(
        arch=arch,
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size,
        padded_vocab_local=cfg.vocab_size,
        vocab_start=0,
        rms_eps=cfg.rms_norm_eps,
        qk_norm=arch == "qwen3",
        tied_embeddings=cfg.tie_word_embeddings,
        max_position=cfg.max_position_embeddings,
    )
    return model_spec.DecoderWeights(
        shape=shape,
        embed=m.embed_tokens.weight.data.to(dtype),
        layers=layers,
        final_norm=m.norm.weight.data.to(dtype),
        lm_head=hf_model.lm_head.weight.data.to(dtype),
        cos_sin=rope.cos_sin_cache.to(dtype),
    )


def _paged_caches(shape: model_spec.DecoderShape, num_blocks: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """vLLM's flash layout: logical [blocks, kv_heads, block, 2D] over NHD memory; poisoned with NaN."""
    caches = []
    for _ in range(shape.num_layers):
        mem = torch.full((num_blocks, BLOCK_SIZE, shape.num_kv_heads, 2 * shape.head_dim), float("nan"), dtype=dtype)
        caches.append(mem.permute(0, 2, 1, 3))
    return caches


@pytest.mark.parametrize(
    "arch,head_dim,gqa,tied",
    [("llama", 64, 4, True), ("llama", 128, 1, False), ("qwen3", 128, 2, True), ("qwen3", 64, 4, False)],
)
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 2e-4), (torch.bfloat16, 3e-2)])
def test_decode_matches_hf(arch, head_dim, gqa, tied, dtype, rtol):
    torch.manual_seed(torch.seed() % 2**31)
    cfg = _tiny_config(arch, head_dim, gqa, tied)
    cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen3ForCausalLM
    hf = cls(cfg).eval()
    with torch.no_grad():  # norms away from 1 so that a dropped or misplaced weight shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    seq_len = 19  # crosses several blocks, ends mid-block
    tokens = torch.randint(0, cfg.vocab_size, (seq_len,))
    with torch.no_grad():
        ref = hf(tokens[None]).logits[0].float()  # [T, V]

    weights = _weights_from_hf(hf, arch, dtype)
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
