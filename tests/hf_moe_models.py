"""Tiny random Hugging Face Qwen3-MoE models and their weights in vLLM 0.26's fused-MoE layout (the CPU tests of the
MoE reference step; later, its GPU kernel tests)."""

from __future__ import annotations

import torch
import transformers
from hf_models import attention_weights, vllm_cos_sin

from kog_backend.path import model_spec
from kog_backend.reference import moe_step

ROUTER_STD = 0.1  # router weights N(0, 0.1^2): logits of std ~1 at hidden 128, so routing is not a near-uniform draw


def tiny_hf_moe_model(num_experts: int, top_k: int, norm_topk_prob: bool, tied: bool, head_dim: int = 64,
                      vocab_size: int = 500, moe_intermediate_size: int = 64):
    """2 layers, hidden 128, 4 query / 2 KV heads, every layer sparse (no shared expert, no mlp_only_layers); fresh
    random weights: initializer_range 0.1 so that the experts' output moves the logits, the router drawn with
    ROUTER_STD, norm weights moved away from 1 so that a misplaced norm shows."""
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, moe_intermediate_size=moe_intermediate_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
        num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=tied,
        initializer_range=0.1, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip
    torch.manual_seed(torch.seed() % 2**31)
    hf = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, ROUTER_STD)
    return hf


def moe_weights_from_hf(hf, dtype: torch.dtype) -> moe_step.MoeDecoderWeights:
    """vLLM's layout: q|k|v rows fused; transformers 5 already holds each layer's experts as vLLM does (gate_up_proj
    [E, 2 I, H] with gate rows first = w13, down_proj [E, H, I] = w2); RoPE cache from vLLM's own get_rope."""
    cfg, m = hf.config, hf.model
    layers = []
    for layer in m.layers:
        mlp = layer.mlp
        layers.append(
            moe_step.MoeLayerWeights(
                **attention_weights(layer, dtype),
                router=mlp.gate.weight.data.to(dtype),
                w13=mlp.experts.gate_up_proj.data.to(dtype),
                w2=mlp.experts.down_proj.data.to(dtype),
            )
        )
    shape = model_spec.DecoderShape(
        arch="qwen3", num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, intermediate_size=cfg.moe_intermediate_size,
        vocab_size=cfg.vocab_size, padded_vocab_local=cfg.vocab_size, vocab_start=0, rms_eps=cfg.rms_norm_eps,
        qk_norm=True, tied_embeddings=cfg.tie_word_embeddings, max_position=cfg.max_position_embeddings,
    )  # fmt: skip
    moe = moe_step.MoeShape(num_experts=cfg.num_experts, top_k=cfg.num_experts_per_tok,
                            intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob)
    return moe_step.MoeDecoderWeights(
        shape=shape, moe=moe, embed=m.embed_tokens.weight.data.to(dtype), layers=layers,
        final_norm=m.norm.weight.data.to(dtype), lm_head=hf.lm_head.weight.data.to(dtype),
        cos_sin=vllm_cos_sin(cfg, dtype),
    )  # fmt: skip
