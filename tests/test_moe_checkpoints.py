"""Qwen3-MoE fixtures: the tiny random-weight checkpoints (`kog make-checkpoint --shape tiny-qwen3-moe-e8 / -e16`)
in the published per-expert layout, loadable by transformers; the Qwen3-30B-A3B shape as its published config, written
with `--dummy` (config, generation config, tokenizer; no weights) for vLLM's load_format="dummy"; the gate's reason
for every MoE config, as `kog doctor --model` prints it. CPU, offline."""

from __future__ import annotations

import argparse
import json
import os

import pytest

torch = pytest.importorskip("torch")
from checkpoint_files import offline_hub, read_tensors  # noqa: E402,F401 (offline_hub: autouse)

from kog_backend.path import coverage, gate  # noqa: E402
from kog_backend.tools.fixtures import checkpoints, shapes  # noqa: E402

TINY_MOE = ("tiny-qwen3-moe-e8", "tiny-qwen3-moe-e16")

# Qwen/Qwen3-30B-A3B's config.json as published (its transformers_version, 4.51.0, left out as for every shape).
PUBLISHED_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}  # fmt: skip


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {name: checkpoints.write_checkpoint(name, str(root / name), seed=0, device="cpu") for name in TINY_MOE}


def test_30b_a3b_shape_is_the_published_config():
    assert shapes.SHAPES["qwen3-30b-a3b"] == PUBLISHED_30B_A3B
    assert shapes.generation_config("qwen3-30b-a3b") == {
        "bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
        "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}  # fmt: skip
    # 30.5B parameters in total (the model card); per token: router + 8 of 128 experts per layer, attention, LM head
    assert round(shapes.param_count("qwen3-30b-a3b") / 1e9, 1) == 30.5
    per_layer_routed = 128 * 2048 + 8 * 3 * 2048 * 768
    assert shapes.layer_params("qwen3-30b-a3b", 8) - shapes.layer_params("qwen3-30b-a3b", 0) == 8 * 3 * 2048 * 768
    attention = (32 + 2 * 4) * 128 * 2048 + 32 * 128 * 2048 + 2 * 2048 + 2 * 128
    want = 48 * (attention + per_layer_routed) + 2048 + 151936 * 2048 + 2048
    assert shapes.weight_bytes_per_token("qwen3-30b-a3b") == 2 * want


@pytest.mark.parametrize("name", TINY_MOE)
def test_tiny_moe_checkpoint_stores_experts_as_published_and_loads(written, name):
    from transformers import AutoModelForCausalLM, GenerationConfig

    d, cfg = written[name], shapes.SHAPES[name]
    with open(os.path.join(d, "config.json")) as f:
        assert json.load(f) == cfg
    assert checkpoints.read_marker(d)["param_count"] == shapes.param_count(name)
    t = read_tensors(d)
    E, I, H = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
    experts = {k for k in t if ".mlp.experts." in k}
    assert len(experts) == cfg["num_hidden_layers"] * E * 3
    assert t[f"model.layers.1.mlp.experts.{E - 1}.gate_proj.weight"].shape == (I, H)
    assert t["model.layers.1.mlp.experts.0.down_proj.weight"].shape == (H, I)
    assert t["model.layers.0.mlp.gate.weight"].shape == (E, H)
    assert not any(k.endswith("gate_up_proj") for k in t)
    assert sum(v.numel() for v in t.values()) == shapes.param_count(name)

    model = AutoModelForCausalLM.from_pretrained(d).eval()
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == shapes.param_count(name)
    fused = model.model.layers[1].mlp.experts.gate_up_proj  # [E, 2I, H]: vLLM's w13 layout, gate rows first
    for e in (0, E - 1):
        assert torch.equal(fused[e, :I], t[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"])
        assert torch.equal(fused[e, I:], t[f"model.layers.1.mlp.experts.{e}.up_proj.weight"])
    ids = torch.tensor([[11, 257, 900, 31, 4000]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=cfg["eos_token_id"])
    assert len(set(out[0, ids.shape[1]:].tolist())) > 4
    gen = GenerationConfig.from_pretrained(d)
    assert (gen.temperature, gen.top_k, gen.top_p) == (0.6, 20, 0.95) and cfg["eos_token_id"] in gen.eos_token_id


def test_dummy_writes_config_and_tokenizer_only(tmp_path):
    from transformers import AutoTokenizer
    from vllm.config import ModelConfig

    d = checkpoints.write_dummy("qwen3-30b-a3b", str(tmp_path / "a3b"))
    assert sorted(os.listdir(d)) == ["config.json", "generation_config.json", "special_tokens_map.json",
                                     "tokenizer.json", "tokenizer_config.json"]
    with open(os.path.join(d, "config.json")) as f:
        assert json.load(f) == PUBLISHED_30B_A3B
    assert len(AutoTokenizer.from_pretrained(d)) == 151936
    mc = ModelConfig(model=d)  # what vLLM reads before load_format="dummy" draws the weights
    assert mc.architectures == ["Qwen3MoeForCausalLM"] and mc.max_model_len == 40960
    assert mc.get_diff_sampling_param() == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    with pytest.raises(ValueError, match="--dummy"):
        checkpoints.write_checkpoint("qwen3-30b-a3b", str(tmp_path / "full"), device="cpu")


def test_dummy_refuses_a_checkpoint_with_weights(written, tmp_path):
    with pytest.raises(FileExistsError, match="--force"):
        checkpoints.write_dummy("qwen3-30b-a3b", written["tiny-qwen3-moe-e8"])


def test_make_checkpoint_dummy_command(tmp_path, capsys):
    from kog_backend.tools.commands import make_checkpoint

    p = argparse.ArgumentParser()
    make_checkpoint.add_arguments(p)
    out = str(tmp_path / "a3b")
    assert make_checkpoint.run(p.parse_args(["--shape", "qwen3-30b-a3b", "--dummy", "--out", out])) == 0
    assert capsys.readouterr().out.strip() == out and not any(f.endswith(".safetensors") for f in os.listdir(out))
    assert make_checkpoint.run(p.parse_args(["--shape", "qwen3-30b-a3b", "--out", str(tmp_path / "w")])) == 2
    assert "--dummy" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", *TINY_MOE])
def test_gate_refuses_moe_naming_the_architecture(name):
    cfg = shapes.SHAPES[name]
    reason = coverage.verdict(cfg).reason
    assert reason == "architectures ['Qwen3MoeForCausalLM']: mixture-of-experts is not on the kog path yet"
    assert gate.reason_key(reason) == ("model", "mixture_of_experts")
    dense_named = dict(cfg, architectures=["Qwen3ForCausalLM"], model_type="qwen3")  # experts, a dense name
    assert gate.reason_key(coverage.verdict(dense_named).reason) == ("model", "mixture_of_experts")


def test_doctor_prints_the_moe_reason(capsys, tmp_path):
    from kog_backend.tools.commands import doctor as doctor_cmd

    p = argparse.ArgumentParser()
    doctor_cmd.add_arguments(p)
    assert doctor_cmd.run(p.parse_args(["--model", "qwen3-30b-a3b"])) == 1
    out = capsys.readouterr().out
    assert "[FAIL] kog path: architectures ['Qwen3MoeForCausalLM']: mixture-of-experts is not on the kog path yet" in out
    d = checkpoints.write_dummy("qwen3-30b-a3b", str(tmp_path / "a3b"))
    assert doctor_cmd.run(p.parse_args(["--model", d])) == 1
    assert "mixture-of-experts is not on the kog path yet" in capsys.readouterr().out
