"""Embedded model shapes: name -> the model's Hugging Face `config.json`, as data.

The real models' published config.json values (LlamaConfig / Qwen3Config field names, the pre-5.x layout
with `rope_theta` + `rope_scaling` and `torch_dtype`, which both transformers 5 and vLLM read). Token ids
follow the tokenizer that `kog_backend.tokenizer_builder` builds for the shape: ids [0, bos_token_id) are
byte-level BPE tokens, [bos_token_id, vocab_size) are special tokens, so every id a random-weight model can
emit decodes.

The small shapes are ours (no published model): `tiny-*` for fast tests and small-vocabulary sampling
statistics, `llama-2b-16l` for a 2B-class per-layer size with few layers.

Each shape also has the family's published `generation_config.json` (`generation_config`): the sampling
defaults that vLLM (`--generation-config auto`, its default) applies to every request that does not set those
fields, and the end-of-generation ids. Our shapes take their family's file, so a request that sets nothing
samples on every shape as it would on the family's real checkpoint; a test or benchmark that wants greedy
decoding asks for it (temperature 0).

Only the standard library is imported here: the CLI imports this module at argument-parsing time.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

BF16_BYTES = 2

# Llama 3 tokenizer layout: 128000 BPE tokens, then 256 special tokens from <|begin_of_text|> = 128000.
_LLAMA3_VOCAB = 128256
_LLAMA3_BOS = 128000
_LLAMA3_EOS = 128001

_LLAMA_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": _LLAMA3_VOCAB,
    "bos_token_id": _LLAMA3_BOS,
    "eos_token_id": _LLAMA3_EOS,
    "max_position_embeddings": 131072,
}

_QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}


# The generation_config.json of each family, as published (keys sorted, as transformers writes them). Llama 3.x
# Instruct (meta-llama/Llama-3.2-1B-Instruct, Llama-3.1-8B-Instruct; the base models publish the same sampling
# defaults with eos 128001 alone): EOS ids <|end_of_text|>, <|eom_id|>, <|eot_id|> = bos + 1, + 8, + 9.
# Qwen3 (Qwen/Qwen3-1.7B): <|im_end|> = bos + 2, then <|endoftext|> = bos; pad = <|endoftext|>.
# kog_backend.tokenizer_builder lays the special tokens out the same way from bos_token_id, so the ids hold for
# our shapes too (checked when a checkpoint is written).
def _llama3_generation(bos: int, transformers_version: str = "4.45.0.dev0") -> dict[str, Any]:
    return {
        "bos_token_id": bos,
        "do_sample": True,
        "eos_token_id": [bos + 1, bos + 8, bos + 9],
        "temperature": 0.6,
        "top_p": 0.9,
        "transformers_version": transformers_version,
    }


def _qwen3_generation(bos: int, transformers_version: str = "4.51.0") -> dict[str, Any]:
    return {
        "bos_token_id": bos,
        "do_sample": True,
        "eos_token_id": [bos + 2, bos],
        "pad_token_id": bos,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": transformers_version,
    }


_FAMILY_GENERATION = {"llama": _llama3_generation, "qwen3": _qwen3_generation}


def _llama3_rope(factor: float) -> dict[str, Any]:
    return {
        "factor": factor,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }


def _llama(**fields: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(_LLAMA_COMMON)
    cfg.update(fields)
    return dict(sorted(cfg.items()))


def _qwen3(**fields: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(_QWEN3_COMMON)
    cfg.update(fields)
    cfg.setdefault("max_window_layers", cfg["num_hidden_layers"])
    return dict(sorted(cfg.items()))


SHAPES: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.2-1B
    "llama-3.2-1b": _llama(
        num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        intermediate_size=8192, tie_word_embeddings=True, rope_scaling=_llama3_rope(32.0),
    ),
    # Qwen/Qwen3-1.7B. Its tokenizer has 151669 entries; the embedding is padded to 151936 and our tokenizer
    # fills the padding with reserved special tokens.
    "qwen3-1.7b": _qwen3(
        num_hidden_layers=28, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
        bos_token_id=151643, eos_token_id=151645,
    ),
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": _llama(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=14336, tie_word_embeddings=False, rope_scaling=_llama3_rope(8.0),
    ),
    # Ours: 2B-class layer (hidden 2560, FFN 10240) with 16 layers and the Llama 3 vocabulary.
    "llama-2b-16l": _llama(
        num_hidden_layers=16, hidden_size=2560, num_attention_heads=20, num_key_value_heads=4, head_dim=128,
        intermediate_size=10240, tie_word_embeddings=True, rope_scaling=_llama3_rope(32.0),
    ),
    # Ours: small vocabulary for statistical sampling tests; the 1B's rope settings so the same rope path runs.
    # 16 special tokens at [4080, 4096). initializer_range (the random checkpoint's weight std) is 0.1, not
    # 0.02: at hidden 256 and 2 layers, std 0.02 leaves the tied input embedding dominant and greedy decoding
    # repeats the current token; 0.1 gives varied greedy output (measured: ~30 distinct tokens in 32).
    # Generation config: Llama 3.x Instruct's (temperature 0.6, top-p 0.9), as for the real Llama shapes.
    "tiny-llama": _llama(
        num_hidden_layers=2, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        intermediate_size=512, vocab_size=4096, bos_token_id=4080, eos_token_id=4081, tie_word_embeddings=True,
        rope_scaling=_llama3_rope(32.0), initializer_range=0.1,
    ),
    # Ours: qk-norm with q size (4 x 128) != hidden (256), as Qwen3 allows. 64 special tokens at [4032, 4096).
    # initializer_range 0.1 as for tiny-llama. Generation config: Qwen3's (temperature 0.6, top-k 20, top-p 0.95).
    "tiny-qwen3": _qwen3(
        num_hidden_layers=2, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
        intermediate_size=512, vocab_size=4096, tie_word_embeddings=True, max_position_embeddings=40960,
        bos_token_id=4032, eos_token_id=4034, initializer_range=0.1,
    ),
}

DEFAULT_SHAPE = "llama-3.2-1b"

# generation_config.json per shape. Ours take their family's file (the test fixtures included: the tests that
# need greedy decoding ask for temperature 0, as a client would).
GENERATION_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": _llama3_generation(_LLAMA3_BOS, "4.45.0.dev0"),  # meta-llama/Llama-3.2-1B-Instruct
    "qwen3-1.7b": _qwen3_generation(151643, "4.51.0"),  # Qwen/Qwen3-1.7B
    "llama-3.1-8b": _llama3_generation(_LLAMA3_BOS, "4.42.3"),  # meta-llama/Llama-3.1-8B-Instruct
    "llama-2b-16l": _llama3_generation(_LLAMA3_BOS),  # ours: Llama 3.x Instruct's
    "tiny-llama": _llama3_generation(4080),  # ours: Llama 3.x Instruct's, ids of its 16 special tokens
    "tiny-qwen3": _qwen3_generation(4032),  # ours: Qwen3's, ids of its 64 special tokens
}


def shape_names() -> list[str]:
    return list(SHAPES)


def get_shape(name: str) -> dict[str, Any]:
    """A fresh copy of the config dict of shape `name`."""
    try:
        return copy.deepcopy(SHAPES[name])
    except KeyError:
        raise KeyError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}") from None


def generation_config(shape: str | Mapping[str, Any]) -> dict[str, Any]:
    """A fresh copy of the generation_config.json of shape `shape` (a name, or a config dict of a known family:
    its family's file with the ids of its bos_token_id)."""
    if isinstance(shape, str) and shape in GENERATION_CONFIGS:
        return copy.deepcopy(GENERATION_CONFIGS[shape])
    cfg = _as_config(shape)
    return _FAMILY_GENERATION[cfg["model_type"]](int(cfg["bos_token_id"]))


def _as_config(shape: str | Mapping[str, Any]) -> Mapping[str, Any]:
    return SHAPES[shape] if isinstance(shape, str) else shape


def _head_dim(cfg: Mapping[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def layer_params(shape: str | Mapping[str, Any]) -> int:
    """Parameters of one decoder layer: qkv, o_proj, gate/up/down, two RMSNorms (+ q/k norms for Qwen3)."""
    cfg = _as_config(shape)
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], _head_dim(cfg)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    n = (nh + 2 * nkv) * d * h + nh * d * h + 3 * h * i + 2 * h
    if cfg["model_type"] == "qwen3":
        n += 2 * d
    return n


def param_count(shape: str | Mapping[str, Any]) -> int:
    """Stored parameters: embedding, layers, final norm, and the LM head when it is not tied."""
    cfg = _as_config(shape)
    emb = cfg["vocab_size"] * cfg["hidden_size"]
    n = emb + cfg["num_hidden_layers"] * layer_params(cfg) + cfg["hidden_size"]
    return n if cfg["tie_word_embeddings"] else n + emb


def weight_bytes_per_token(shape: str | Mapping[str, Any]) -> int:
    """Bytes of bf16 weights one decoded token reads at batch 1 (the memory-bandwidth floor's numerator).

    All layers, the final norm and the full LM head [vocab, hidden]; the input embedding costs one row
    (tied: that row lies inside the LM head already read, so it is not counted again).
    Llama-3.2-1B: 2.47e9 B; Qwen3-1.7B: 3.44e9 B.
    """
    cfg = _as_config(shape)
    h = cfg["hidden_size"]
    n = cfg["num_hidden_layers"] * layer_params(cfg) + h + cfg["vocab_size"] * h
    if not cfg["tie_word_embeddings"]:
        n += h
    return n * BF16_BYTES
