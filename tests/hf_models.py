"""Tiny random Hugging Face Llama / Qwen3 / Qwen2 models and their weights in vLLM's layout (shared by the CPU tests of
the torch step and of the monokernel's reference schedule)."""

from __future__ import annotations

import torch
import transformers

from kog_backend.path import model_spec


def tiny_hf_model(arch: str, head_dim: int, gqa: int, tied: bool, vocab_size: int, intermediate_size: int):
    """2 layers, hidden 128, 4 query heads; Llama with llama3 RoPE scaling, Qwen3 with qk-norm, Qwen2 with its QKV
    bias (no qk-norm, rope_theta 1e6). Norm weights are moved away from 1 and the biases (zero at init) drawn
    N(0, 0.5^2), so that a dropped or misplaced norm or bias shows."""
    common = dict(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=intermediate_size, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4 // gqa, head_dim=head_dim, max_position_embeddings=256,
        rms_norm_eps=1e-5, tie_word_embeddings=tied,
    )  # fmt: skip
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
        cfg, cls = transformers.LlamaConfig(rope_parameters=rope, **common), transformers.LlamaForCausalLM
    elif arch == "qwen2":
        del common["head_dim"]  # Qwen2Config has no field: Qwen2Attention reads config.head_dim when it is set
        cfg = transformers.Qwen2Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                       use_sliding_window=False, **common)
        cfg.head_dim = head_dim
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common)
        cls = transformers.Qwen3ForCausalLM
    torch.manual_seed(torch.seed() % 2**31)
    hf = cls(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
            elif name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.5)
    return hf


def attention_weights(layer, dtype: torch.dtype) -> dict[str, torch.Tensor | None]:
    """One HF decoder layer's norms and attention projections in vLLM's layout (q|k|v rows fused), as the
    LayerWeights fields of the same names; q_norm / k_norm None where the model has no qk-norm."""
    a = layer.self_attn
    return {
        "input_norm": layer.input_layernorm.weight.data.to(dtype),
        "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).data.to(dtype),
        "q_norm": a.q_norm.weight.data.to(dtype) if hasattr(a, "q_norm") else None,
        "k_norm": a.k_norm.weight.data.to(dtype) if hasattr(a, "k_norm") else None,
        "o_proj": a.o_proj.weight.data.to(dtype),
        "post_norm": layer.post_attention_layernorm.weight.data.to(dtype),
    }


def vllm_cos_sin(cfg, dtype: torch.dtype) -> torch.Tensor:
    """The RoPE cos/sin cache [max_position, head_dim] from vLLM's own get_rope for an HF config."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        rope = get_rope(cfg.head_dim, cfg.max_position_embeddings, True, dict(cfg.rope_parameters), torch.float32)
    return rope.cos_sin_cache.to(dtype)


def weights_from_hf(hf, arch: str, dtype: torch.dtype) -> model_spec.DecoderWeights:
    """vLLM's layout (q|k|v and gate|up rows fused) with the RoPE cache from vLLM's own get_rope."""
    cfg, m = hf.config, hf.model
    layers = []
    for layer in m.layers:
        a, mlp = layer.self_attn, layer.mlp
        layers.append(
            model_spec.LayerWeights(
                **attention_weights(layer, dtype),
                gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).data.to(dtype),
                down=mlp.down_proj.weight.data.to(dtype),
                qkv_bias=torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).data.to(dtype)
                if a.q_proj.bias is not None else None,
            )
        )
    shape = model_spec.DecoderShape(
        arch=arch, num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size, padded_vocab_local=cfg.vocab_size, vocab_start=0, rms_eps=cfg.rms_norm_eps,
        qk_norm=arch == "qwen3", tied_embeddings=cfg.tie_word_embeddings, max_position=cfg.max_position_embeddings,
        qkv_bias=arch == "qwen2",
    )  # fmt: skip
    return model_spec.DecoderWeights(
        shape=shape, embed=m.embed_tokens.weight.data.to(dtype), layers=layers,
        final_norm=m.norm.weight.data.to(dtype), lm_head=hf.lm_head.weight.data.to(dtype),
        cos_sin=vllm_cos_sin(cfg, dtype),
    )  # fmt: skip
