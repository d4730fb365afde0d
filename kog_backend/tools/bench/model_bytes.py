"""Bytes one decode step reads, from a Hugging Face `config.json` (Llama / Qwen3 / Mistral dense).

Weights: `kog_backend.tools.fixtures.shapes.weight_bytes_per_token` (all layers, final norm, full LM head, one embedding
row), applied to any checkpoint's config after filling in Hugging Face's defaults. KV cache: attention of
step i reads K and V of every earlier position of every layer.
"""

from __future__ import annotations

import json
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


def weight_bytes_per_token(cfg: Mapping[str, Any]) -> int:
    from kog_backend.tools.fixtures.shapes import BF16_BYTES, weight_bytes_per_token as bf16_bytes

    return bf16_bytes(normalized(cfg)) // BF16_BYTES * element_bytes(cfg)


def kv_bytes_per_position(cfg: Mapping[str, Any]) -> int:
    """K and V of one context position over all layers."""
    c = normalized(cfg)
    return 2 * int(c["num_hidden_layers"]) * int(c["num_key_value_heads"]) * int(c["head_dim"]) * element_bytes(c)


def mean_kv_bytes_per_token(cfg: Mapping[str, Any], prompt_len: int, new_tokens: int) -> float:
    """KV bytes attention reads per decode step, averaged over the `new_tokens` steps after a
    `prompt_len` prompt (step i reads prompt_len + i positions, i = 1..new_tokens)."""
    mean_context = prompt_len + (new_tokens + 1) / 2
    return kv_bytes_per_position(cfg) * mean_context
