"""Bytes one decode step reads, from a Hugging Face `config.json` (Llama / Qwen3 / Mistral dense).

Counts what the kog path and stock vLLM both stream per token (bf16 unless the config says otherwise):
every layer's QKV, O, gate/up, down and norms (Qwen3: q_norm and k_norm), the final norm, the LM head
(vocabulary padded to a multiple of 64 as vLLM pads it; a tied head is read once, as the LM head) and one
embedding row. Same convention as `model_spec.DecoderWeights.weight_bytes_per_token`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

VOCAB_PAD = 64  # vLLM's vocab_parallel_embedding pads the vocabulary to this multiple
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def load_config(model_dir: str) -> dict[str, Any]:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def _dims(cfg: Mapping[str, Any]) -> dict[str, int]:
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    return {
        "layers": int(cfg["num_hidden_layers"]),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or hidden // heads),
        "ffn": int(cfg["intermediate_size"]),
        "vocab": int(cfg["vocab_size"]),
    }


def element_bytes(cfg: Mapping[str, Any]) -> int:
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    return DTYPE_BYTES.get(dtype, 2)


def has_qk_norm(cfg: Mapping[str, Any]) -> bool:
    return any(a.startswith("Qwen3") for a in cfg.get("architectures") or []) or cfg.get("model_type") == "qwen3"


def weight_bytes_per_token(cfg: Mapping[str, Any]) -> int:
    d = _dims(cfg)
    h, dh = d["hidden"], d["head_dim"]
    per_layer = (
        (d["heads"] + 2 * d["kv_heads"]) * dh * h  # qkv
        + h * d["heads"] * dh  # o_proj
        + 2 * d["ffn"] * h  # gate_up
        + h * d["ffn"]  # down
        + 2 * h  # input and post-attention norms
        + (2 * dh if has_qk_norm(cfg) else 0)
    )
    vocab_padded = -(-d["vocab"] // VOCAB_PAD) * VOCAB_PAD
    params = d["layers"] * per_layer + h + vocab_padded * h + h  # + final norm, LM head, one embedding row
    return params * element_bytes(cfg)


def kv_bytes_per_position(cfg: Mapping[str, Any]) -> int:
    """K and V of one context position over all layers."""
    d = _dims(cfg)
    return 2 * d["layers"] * d["kv_heads"] * d["head_dim"] * element_bytes(cfg)


def mean_kv_bytes_per_token(cfg: Mapping[str, Any], prompt_len: int, new_tokens: int) -> float:
    """KV bytes attention reads per decode step, averaged over the `new_tokens` steps after a
    `prompt_len` prompt (step i reads prompt_len + i positions, i = 1..new_tokens)."""
    mean_context = prompt_len + (new_tokens + 1) / 2
    return kv_bytes_per_position(cfg) * mean_context
