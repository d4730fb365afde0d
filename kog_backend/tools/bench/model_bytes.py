"""Bytes one decode step reads, from a Hugging Face `config.json` (Llama / Qwen3 / Mistral dense).

Weights: `kog_backend.tools.fixtures.shapes.weight_bytes_per_token` (all layers, final norm, full LM head, one embedding
row), applied to any checkpoint's config after filling in Hugging Face's defaults. KV cache: attention of
step i reads K and V of every earlier position of every layer.

FP8 weights (a quantization_config that kog_backend.path.quant_format reads as an Fp8Format): each of a layer's four
projections as vLLM holds it after loading (q|k|v and gate|up fused) reads one byte per weight plus its fp32 scales,
as model_spec.fp8_projection takes them: tensor one per module (vLLM requantises a fused module's shards to their
largest scale), channel one per output row, block one per 128 x 128 block. Embedding row, LM head and norms stay
in the config's dtype. The same count as DecoderWeights.weight_bytes_per_token() on the loaded weights
(tests/test_bench_fp8.py). A mixture-of-experts config with FP8 weights has no estimate here (None).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def load_config(model_dir: str) -> dict[str, Any]:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def normalized(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config with Hugging Face's defaults for the fields a shape may leave out."""
    out = dict(cfg)
    out.setdefault("num_key_value_heads", out["num_attention_heads"])
    out.setdefault("tie_word_embeddings", False)
    out.setdefault("model_type", "llama")
    if not out.get("head_dim"):
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    return out


def element_bytes(cfg: Mapping[str, Any]) -> int:
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    return DTYPE_BYTES.get(dtype, 2)


SCALE_BYTES = 4  # vLLM holds every FP8 scale in float32 (quant_format: "vLLM copies any float dtype into its float32 parameter")


def fp8_format(cfg: Mapping[str, Any]):
    """The config's FP8 weight format (quant_format.Fp8Format), or None (bf16 weights, or another method)."""
    from kog_backend.path import quant_format

    fmt = quant_format.weight_format(cfg.get("quantization_config"))
    return fmt if isinstance(fmt, quant_format.Fp8Format) else None


def weight_bytes_per_token(cfg: Mapping[str, Any]) -> int | None:
    """Bytes of weights one decode step reads; FP8 projections at one byte each plus their scales (module
    docstring). None for a mixture-of-experts config with FP8 weights (not estimated)."""
    from kog_backend.tools.fixtures.shapes import BF16_BYTES, is_moe, weight_bytes_per_token as bf16_bytes

    c = normalized(cfg)
    elem = element_bytes(cfg)
    total = bf16_bytes(c) // BF16_BYTES * elem
    fmt = fp8_format(c)
    if fmt is None:
        return total
    if is_moe(c):
        return None
    for i in range(int(c["num_hidden_layers"])):
        for members, n, k in fused_projections(c):
            if fmt.is_quantised(f"model.layers.{i}.{members[0]}.weight"):
                total -= n * k * (elem - 1)
                total += scale_count(fmt.layout, n, k) * SCALE_BYTES
    return total


def fused_projections(cfg: Mapping[str, Any]) -> list[tuple[tuple[str, ...], int, int]]:
    """A dense decoder layer's projections as vLLM fuses them: (checkpoint module names, N rows, K inputs)."""
    c = normalized(cfg)
    h, d, i = int(c["hidden_size"]), int(c["head_dim"]), int(c["intermediate_size"])
    nh, nkv = int(c["num_attention_heads"]), int(c["num_key_value_heads"])
    return [
        (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), (nh + 2 * nkv) * d, h),
        (("self_attn.o_proj",), h, nh * d),
        (("mlp.gate_proj", "mlp.up_proj"), 2 * i, h),
        (("mlp.down_proj",), h, i),
    ]


def scale_count(layout: str, n: int, k: int) -> int:
    """Scales of one loaded FP8 module of N rows and K inputs (quant_format.Fp8Format.scale_shapes)."""
    from kog_backend.path.quant_format import BLOCK

    if layout == "tensor":
        return 1
    if layout == "channel":
        return n
    return math.ceil(n / BLOCK[0]) * math.ceil(k / BLOCK[1])


def kv_bytes_per_position(cfg: Mapping[str, Any]) -> int:
    """K and V of one context position over all layers."""
    c = normalized(cfg)
    return 2 * int(c["num_hidden_layers"]) * int(c["num_key_value_heads"]) * int(c["head_dim"]) * element_bytes(c)


def mean_kv_bytes_per_token(cfg: Mapping[str, Any], prompt_len: int, new_tokens: int) -> float:
    """KV bytes attention reads per decode step, averaged over the `new_tokens` steps after a
    `prompt_len` prompt (step i reads prompt_len + i positions, i = 1..new_tokens)."""
    mean_context = prompt_len + (new_tokens + 1) / 2
    return kv_bytes_per_position(cfg) * mean_context
