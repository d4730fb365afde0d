"""Embedded model shapes: published config values, parameter counts against transformers' own classes,
bytes per decoded token."""

from __future__ import annotations

import pytest

from kog_backend.tools.fixtures import shapes

REAL = ("llama-3.2-1b", "qwen3-1.7b", "llama-3.1-8b")


def test_llama_3_2_1b_matches_published_config():
    c = shapes.get_shape("llama-3.2-1b")
    assert c["architectures"] == ["LlamaForCausalLM"] and c["model_type"] == "llama"
    assert (c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"]) == (16, 2048, 8192)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (32, 8, 64)
    assert (c["vocab_size"], c["tie_word_embeddings"], c["max_position_embeddings"]) == (128256, True, 131072)
    assert (c["rope_theta"], c["rms_norm_eps"], c["torch_dtype"]) == (500000.0, 1e-5, "bfloat16")
    assert c["rope_scaling"] == {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert (c["bos_token_id"], c["eos_token_id"]) == (128000, 128001)


def test_qwen3_and_8b_match_published_configs():
    q = shapes.get_shape("qwen3-1.7b")
    assert q["architectures"] == ["Qwen3ForCausalLM"] and q["model_type"] == "qwen3"
    assert (q["num_hidden_layers"], q["hidden_size"], q["intermediate_size"]) == (28, 2048, 6144)
    assert (q["num_attention_heads"], q["num_key_value_heads"], q["head_dim"]) == (16, 8, 128)
    assert (q["vocab_size"], q["tie_word_embeddings"], q["max_position_embeddings"]) == (151936, True, 40960)
    assert (q["rope_theta"], q["rms_norm_eps"], q["rope_scaling"]) == (1000000, 1e-6, None)
    assert (q["bos_token_id"], q["eos_token_id"]) == (151643, 151645)
    e = shapes.get_shape("llama-3.1-8b")
    assert (e["num_hidden_layers"], e["hidden_size"], e["intermediate_size"]) == (32, 4096, 14336)
    assert (e["num_attention_heads"], e["num_key_value_heads"], e["head_dim"]) == (32, 8, 128)
    assert (e["vocab_size"], e["tie_word_embeddings"]) == (128256, False)
    assert e["rope_scaling"]["factor"] == 8.0 and e["rope_scaling"]["rope_type"] == "llama3"


def test_get_shape_returns_a_copy_and_rejects_unknown_names():
    c = shapes.get_shape("tiny-llama")
    c["rope_scaling"]["factor"] = -1
    assert shapes.SHAPES["tiny-llama"]["rope_scaling"]["factor"] == 32.0
    with pytest.raises(KeyError, match="unknown shape"):
        shapes.get_shape("llama-7b")
    assert shapes.DEFAULT_SHAPE in shapes.shape_names()


@pytest.mark.parametrize("name", shapes.shape_names())
def test_param_count_matches_transformers_model(name):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = shapes.get_shape(name)
    model_type = cfg.pop("model_type")
    hf = AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    assert sum(p.numel() for p in model.parameters()) == shapes.param_count(name)  # tied: shared tensor once
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == cfg["tie_word_embeddings"]
    if cfg.get("rope_scaling"):
        assert hf.rope_parameters["rope_type"] == "llama3"
        assert hf.rope_parameters["factor"] == cfg["rope_scaling"]["factor"]
        assert hf.rope_parameters["rope_theta"] == cfg["rope_theta"]


def test_published_parameter_counts():
    assert shapes.param_count("llama-3.2-1b") == 1_235_814_400
    assert shapes.param_count("qwen3-1.7b") == 1_720_574_976
    assert shapes.param_count("llama-3.1-8b") == 8_030_261_248


def test_weight_bytes_per_token():
    # Tied: every stored parameter is read once per token (the embedding row lies inside the LM head).
    for name in ("llama-3.2-1b", "qwen3-1.7b", "llama-2b-16l", "tiny-llama", "tiny-qwen3"):
        assert shapes.weight_bytes_per_token(name) == 2 * shapes.param_count(name)
    # Untied: the LM head plus one embedding row instead of the whole embedding.
    e = shapes.SHAPES["llama-3.1-8b"]
    emb = e["vocab_size"] * e["hidden_size"]
    assert shapes.weight_bytes_per_token("llama-3.1-8b") == 2 * (shapes.param_count("llama-3.1-8b") - emb + e["hidden_size"])
    # The numbers the performance notes use (2.47 GB and 3.44 GB).
    assert round(shapes.weight_bytes_per_token("llama-3.2-1b") / 1e9, 2) == 2.47
    assert round(shapes.weight_bytes_per_token("qwen3-1.7b") / 1e9, 2) == 3.44
    # A dict works as well as a name.
    assert shapes.weight_bytes_per_token(shapes.get_shape("tiny-qwen3")) == shapes.weight_bytes_per_token("tiny-qwen3")


def test_layer_params_by_hand():
    # tiny-qwen3: qkv (4 + 2*2) * 128 * 256, o 4*128*256, mlp 3*256*512, norms 2*256, q/k norms 2*128.
    assert shapes.layer_params("tiny-qwen3") == 8 * 128 * 256 + 4 * 128 * 256 + 3 * 256 * 512 + 2 * 256 + 2 * 128


@pytest.mark.parametrize("name", shapes.shape_names())
def test_every_shape_has_its_family_generation_config(name):
    """The family's published sampling defaults; BOS and end-of-generation ids laid out from bos_token_id as the
    project's tokenizer lays them out (tests/test_checkpoints.py checks them against the built tokenizer)."""
    cfg, gen = shapes.SHAPES[name], shapes.generation_config(name)
    bos = cfg["bos_token_id"]
    assert gen["bos_token_id"] == bos and gen["eos_token_id"][0] == cfg["eos_token_id"]
    if cfg["model_type"] == "mistral":  # Mistral-7B-Instruct-v0.3: ids only, no sampling default
        assert set(gen) == {"bos_token_id", "eos_token_id", "transformers_version"}
        assert gen["eos_token_id"] == [bos + 1, bos + 8, bos + 9]  # our tokenizer's layout (shapes.py)
        return
    assert gen["do_sample"] is True
    if cfg["model_type"] == "llama":
        assert (gen["temperature"], gen["top_p"]) == (0.6, 0.9) and "top_k" not in gen
        assert gen["eos_token_id"] == [bos + 1, bos + 8, bos + 9]  # <|end_of_text|>, <|eom_id|>, <|eot_id|>
    elif cfg["model_type"] == "qwen2":  # Qwen2.5(-Coder) Instruct
        assert (gen["temperature"], gen["top_k"], gen["top_p"], gen["repetition_penalty"]) == (0.7, 20, 0.8, 1.05)
        assert gen["eos_token_id"] == [bos + 2, bos] and gen["pad_token_id"] == bos
    else:
        assert (gen["temperature"], gen["top_k"], gen["top_p"]) == (0.6, 20, 0.95)
        assert gen["eos_token_id"] == [bos + 2, bos] and gen["pad_token_id"] == bos  # <|im_end|>, <|endoftext|>
    assert max(gen["eos_token_id"]) < cfg["vocab_size"]
    # a fresh copy; a config dict of the family gives the same sampling defaults
    gen["eos_token_id"].append(-1)
    assert -1 not in shapes.generation_config(name)["eos_token_id"]
    computed = shapes.generation_config(shapes.get_shape(name))
    assert {k: v for k, v in computed.items() if k != "transformers_version"} == {
        k: v for k, v in shapes.generation_config(name).items() if k != "transformers_version"}
