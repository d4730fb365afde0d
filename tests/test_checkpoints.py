"""Random-weight checkpoints: loadable by transformers and by vLLM's config/tokenizer machinery (CPU, offline),
exact parameter names and counts, init statistics, determinism, sharding, idempotence."""

from __future__ import annotations

import argparse
import json
import os

import pytest

torch = pytest.importorskip("torch")
from checkpoint_files import offline_hub, read_tensors  # noqa: E402,F401 (offline_hub: autouse)

from kog_backend.tools.fixtures import checkpoints, shapes  # noqa: E402

TINY = ("tiny-llama", "tiny-qwen3")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {name: checkpoints.write_checkpoint(name, str(root / name), seed=0, device="cpu") for name in TINY}


@pytest.mark.parametrize("name", TINY)
def test_files_and_marker(written, name):
    d = written[name]
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json", checkpoints.MARKER):
        assert os.path.isfile(os.path.join(d, f)), f
    with open(os.path.join(d, "config.json")) as f:
        assert json.load(f) == shapes.SHAPES[name]
    with open(os.path.join(d, "generation_config.json")) as f:
        assert json.load(f) == shapes.generation_config(name)
    marker = checkpoints.read_marker(d)
    assert marker["generation_config"] == shapes.generation_config(name)
    assert checkpoints.is_current(d, name, seed=0) and not checkpoints.is_current(d, name, seed=1)
    assert (marker["shape"], marker["seed"], marker["device_type"]) == (name, 0, "cpu")
    assert marker["param_count"] == shapes.param_count(name)
    assert marker["weight_bytes"] == 2 * shapes.param_count(name)


@pytest.mark.parametrize("name", TINY)
def test_loads_in_transformers_and_runs(written, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    d = written[name]
    cfg = shapes.SHAPES[name]
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    assert model.dtype == torch.bfloat16
    assert sum(p.numel() for p in model.parameters()) == shapes.param_count(name)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # both tiny shapes are tied
    ids = tok("The quick brown fox jumps over the lazy dog", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits.float()
    assert logits.shape == (1, ids.shape[1], cfg["vocab_size"])
    assert torch.isfinite(logits).all()
    # A realistic spread: not flat, not exploding.
    assert 0.05 < logits[0, -1].std().item() < 20
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=cfg["eos_token_id"])
    new = out[0, ids.shape[1]:].tolist()
    assert len(set(new)) > 4, f"greedy output collapsed: {new}"
    assert isinstance(tok.decode(new), str)
    gen = GenerationConfig.from_pretrained(d)
    assert cfg["eos_token_id"] in gen.eos_token_id


@pytest.mark.parametrize("name", TINY)
def test_stored_names_and_init_statistics(written, name):
    cfg = shapes.SHAPES[name]
    t = read_tensors(written[name])
    assert "lm_head.weight" not in t  # tied heads are not stored, as in the published checkpoints
    assert sum(v.numel() for v in t.values()) == shapes.param_count(name)
    assert all(v.dtype == torch.bfloat16 for v in t.values())
    qk = {"model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"}
    assert qk <= set(t) if cfg["model_type"] == "qwen3" else not qk & set(t)
    std = cfg["initializer_range"]
    emb = t["model.embed_tokens.weight"].float()
    assert abs(emb.mean().item()) < 0.05 * std and abs(emb.std().item() / std - 1) < 0.02
    down = t["model.layers.1.mlp.down_proj.weight"].float()
    assert abs(down.std().item() / std - 1) < 0.05
    norm = t["model.norm.weight"].float()
    assert abs(norm.mean().item() - 1) < 0.02 and 0.005 < norm.std().item() < 0.05
    # Each tensor has its own stream: no two tensors of one shape are equal.
    assert not torch.equal(t["model.layers.0.mlp.up_proj.weight"], t["model.layers.1.mlp.up_proj.weight"])


# The published generation_config.json of the real models (Hugging Face repos), and the family values our
# shapes take, with the ids of their own special tokens.
PUBLISHED_GENERATION = {
    "llama-3.2-1b": {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
                     "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.45.0.dev0"},
    "llama-3.1-8b": {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
                     "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"},
    "qwen3-1.7b": {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                   "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"},
    "qwen2.5-coder-7b": {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
                         "pad_token_id": 151643, "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20,
                         "top_p": 0.8, "transformers_version": "4.43.1"},
}
FAMILY_SAMPLING = {"llama": {"temperature": 0.6, "top_p": 0.9}, "qwen3": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
                   "qwen2": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05},
                   "mistral": {}}  # fmt: skip
STOP_TOKENS = {"llama": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], "qwen3": ["<|im_end|>", "<|endoftext|>"]}
STOP_TOKENS.update(qwen2=STOP_TOKENS["qwen3"], mistral=STOP_TOKENS["llama"], qwen3_moe=STOP_TOKENS["qwen3"])
FAMILY_SAMPLING["qwen3_moe"] = FAMILY_SAMPLING["qwen3"]  # Qwen3-MoE publishes Qwen3's generation config


def test_real_shapes_have_the_published_generation_config():
    for name, published in PUBLISHED_GENERATION.items():
        assert shapes.generation_config(name) == published
        assert checkpoints.expected_generation_config(name) == published


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    """Every shape's files but the weights, written as write_checkpoint writes them."""
    root = tmp_path_factory.mktemp("meta")
    out = {}
    for name in shapes.SHAPES:
        d = str(root / name)
        checkpoints.write_metadata(d, shapes.get_shape(name), checkpoints.expected_generation_config(name))
        out[name] = d
    return out


@pytest.mark.parametrize("name", shapes.shape_names())
def test_every_shape_writes_its_family_generation_config(metadata, name):
    """make-checkpoint's generation_config.json for every shape: the family's sampling defaults, the ids of the
    tokenizer the project builds, config.json's EOS among them; and what vLLM 0.26 makes of it."""
    from transformers import AutoTokenizer, GenerationConfig
    from vllm.config import ModelConfig
    from vllm.sampling_params import SamplingParams

    d, cfg = metadata[name], shapes.SHAPES[name]
    with open(os.path.join(d, "generation_config.json")) as f:
        gen = json.load(f)
    assert gen == shapes.generation_config(name)
    family = cfg["model_type"]
    assert {k: gen[k] for k in FAMILY_SAMPLING[family]} == FAMILY_SAMPLING[family]
    assert gen.get("do_sample", False) is bool(FAMILY_SAMPLING[family])
    assert not ({"min_p", "repetition_penalty", "max_new_tokens"} - set(FAMILY_SAMPLING[family])) & set(gen)
    tok = AutoTokenizer.from_pretrained(d)
    assert gen["eos_token_id"] == tok.convert_tokens_to_ids(STOP_TOKENS[family])
    assert gen["bos_token_id"] == cfg["bos_token_id"] == tok.convert_tokens_to_ids(tok.special_tokens_map.get("bos_token") or "<|endoftext|>")
    assert tok.eos_token_id == cfg["eos_token_id"] == gen["eos_token_id"][0]
    if family in ("qwen3", "qwen2"):
        assert gen["pad_token_id"] == tok.convert_tokens_to_ids("<|endoftext|>")
    assert GenerationConfig.from_pretrained(d).eos_token_id == gen["eos_token_id"]

    # vLLM: the defaults a request that sets nothing gets (LLM.get_default_sampling_params builds them from
    # get_diff_sampling_param), and the stop ids every request gets from the generation config.
    mc = ModelConfig(model=d, skip_tokenizer_init=True)
    diff = mc.get_diff_sampling_param()
    assert diff == FAMILY_SAMPLING[family]
    default = SamplingParams.from_optional(**diff)
    assert (default.temperature, default.top_p, default.top_k) == (
        gen.get("temperature", 1.0), gen.get("top_p", 1.0), gen.get("top_k", 0))
    sp = SamplingParams(max_tokens=8)
    sp.update_from_generation_config(mc.try_get_generation_config(), cfg["eos_token_id"])
    assert sp.all_stop_token_ids == set(gen["eos_token_id"])
    assert set(sp.stop_token_ids) == set(gen["eos_token_id"]) - {cfg["eos_token_id"]}


def test_generation_config_ids_are_checked_against_the_tokenizer(monkeypatch):
    bad = dict(shapes.GENERATION_CONFIGS["tiny-llama"], eos_token_id=[4081, 4082])
    monkeypatch.setitem(shapes.GENERATION_CONFIGS, "tiny-llama", bad)
    with pytest.raises(ValueError, match="tokenizer"):
        checkpoints.expected_generation_config("tiny-llama")


def test_a_checkpoint_without_the_current_generation_config_is_brought_up_to_date(tmp_path):
    """A checkpoint written before its shape had sampling defaults (ids only, no generation_config in the marker)
    gets the current file; the weights stay."""
    d = str(tmp_path / "old")
    checkpoints.write_checkpoint("tiny-qwen3", d, seed=0, device="cpu")
    marker = checkpoints.read_marker(d)
    del marker["generation_config"]
    with open(os.path.join(d, checkpoints.MARKER), "w") as f:
        json.dump(marker, f)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 4032, "eos_token_id": [4034, 4032]}, f)
    assert not checkpoints.is_current(d, "tiny-qwen3")
    st = os.path.join(d, "model.safetensors")
    before = os.stat(st).st_mtime_ns
    logs: list[str] = []
    assert checkpoints.write_checkpoint("tiny-qwen3", d, seed=0, device="cpu", log=logs.append) == d
    assert os.stat(st).st_mtime_ns == before and "weights kept" in logs[0]
    with open(os.path.join(d, "generation_config.json")) as f:
        assert json.load(f) == shapes.generation_config("tiny-qwen3")
    assert checkpoints.is_current(d, "tiny-qwen3")


def test_idempotent_and_refuses_another_checkpoint(written, tmp_path):
    d = written["tiny-llama"]
    st = os.path.join(d, "model.safetensors")
    before = os.stat(st).st_mtime_ns
    assert checkpoints.write_checkpoint("tiny-llama", d, seed=0, device="cpu") == d
    assert os.stat(st).st_mtime_ns == before
    with pytest.raises(FileExistsError, match="tiny-llama seed 0"):
        checkpoints.write_checkpoint("tiny-llama", d, seed=1, device="cpu")
    with pytest.raises(FileExistsError):
        checkpoints.write_checkpoint("tiny-qwen3", d, seed=0, device="cpu")

    # Same seed elsewhere: identical weights. force=True replaces with another seed: different weights.
    other = str(tmp_path / "copy")
    checkpoints.write_checkpoint("tiny-llama", other, seed=0, device="cpu")
    a, b = read_tensors(d), read_tensors(other)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    checkpoints.write_checkpoint("tiny-llama", other, seed=1, device="cpu", force=True)
    c = read_tensors(other)
    assert checkpoints.read_marker(other)["seed"] == 1
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_concurrent_writers_take_turns(tmp_path):
    import threading

    d = str(tmp_path / "shared")
    logs: list[str] = []
    threads = [threading.Thread(target=checkpoints.write_checkpoint, args=("tiny-llama", d),
                                kwargs=dict(seed=0, device="cpu", log=logs.append)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum("nothing to do" in m for m in logs) == 1 and sum("wrote" in m for m in logs) == 1
    assert checkpoints.read_marker(d)["shape"] == "tiny-llama"
    assert sum(v.numel() for v in read_tensors(d).values()) == shapes.param_count("tiny-llama")


def test_partial_write_is_redone(tmp_path):
    d = str(tmp_path / "partial")
    checkpoints.write_checkpoint("tiny-qwen3", d, seed=0, device="cpu")
    os.remove(os.path.join(d, checkpoints.MARKER))
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(b"truncated")
    with open(os.path.join(d, "unrelated.txt"), "w") as f:
        f.write("kept")
    checkpoints.write_checkpoint("tiny-qwen3", d, seed=0, device="cpu")
    assert checkpoints.read_marker(d)["shape"] == "tiny-qwen3"
    assert sum(v.numel() for v in read_tensors(d).values()) == shapes.param_count("tiny-qwen3")
    assert os.path.isfile(os.path.join(d, "unrelated.txt"))


def test_sharded_untied_checkpoint(tmp_path, monkeypatch, written):
    """Above the shard size: model-0000k-of-0000n files plus an index; untied: lm_head.weight stored."""
    from transformers import AutoModelForCausalLM

    untied = dict(shapes.SHAPES["tiny-llama"], tie_word_embeddings=False)
    monkeypatch.setitem(shapes.SHAPES, "tiny-llama-untied", untied)
    monkeypatch.setattr(checkpoints, "MAX_SHARD_BYTES", 1_500_000)
    d = checkpoints.write_checkpoint("tiny-llama-untied", str(tmp_path / "sharded"), seed=0, device="cpu")
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    n = len(files)
    assert n >= 3 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    t = read_tensors(d)
    assert set(index["weight_map"]) == set(t) and "lm_head.weight" in t
    assert index["metadata"]["total_size"] == 2 * shapes.param_count(untied)
    for name in files:  # at most the shard size, unless one tensor alone is larger (the 2 MB embedding)
        held = [k for k, f in index["weight_map"].items() if f == name]
        assert len(held) == 1 or sum(2 * t[k].numel() for k in held) <= 1_500_000
    # Per-tensor streams: sharding does not change the values shared with the tied checkpoint.
    tied = read_tensors(written["tiny-llama"])
    assert torch.equal(t["model.layers.0.self_attn.q_proj.weight"], tied["model.layers.0.self_attn.q_proj.weight"])
    model = AutoModelForCausalLM.from_pretrained(d)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, t["lm_head.weight"])
    assert sum(p.numel() for p in model.parameters()) == shapes.param_count(untied)


def test_default_checkpoint_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("KOG_CHECKPOINT_DIR", str(tmp_path))
    assert checkpoints.default_checkpoint_dir("qwen3-1.7b", 3) == os.path.join(str(tmp_path), "qwen3-1.7b-seed3")
    monkeypatch.delenv("KOG_CHECKPOINT_DIR")
    assert checkpoints.default_checkpoint_dir("llama-3.2-1b").endswith(
        os.path.join(".cache", "kog_backend", "checkpoints", "llama-3.2-1b-seed0"))


def test_make_checkpoint_command(tmp_path, capsys):
    from kog_backend.tools.commands import make_checkpoint

    p = argparse.ArgumentParser()
    make_checkpoint.add_arguments(p)
    out = str(tmp_path / "cli")
    assert make_checkpoint.run(p.parse_args(["--shape", "tiny-qwen3", "--out", out, "--device", "cpu"])) == 0
    assert capsys.readouterr().out.strip() == out
    assert checkpoints.read_marker(out)["shape"] == "tiny-qwen3"
    assert make_checkpoint.run(p.parse_args(["--shape", "tiny-llama", "--out", out, "--device", "cpu"])) == 2
    assert "--force" in capsys.readouterr().err
    assert make_checkpoint.run(p.parse_args(["--list"])) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in shapes.SHAPES)
    assert p.parse_args([]).shape == "llama-3.2-1b"


def test_vllm_accepts_checkpoints(written):
    """vLLM's own config, tokenizer and chat-template machinery on the written directories (CPU, offline)."""
    pytest.importorskip("vllm")
    from tokenizers.decoders import DecodeStream
    from vllm.config import ModelConfig
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template
    from vllm.tokenizers import get_tokenizer
    from vllm.transformers_utils.config import get_config

    for name, d in written.items():
        cfg = shapes.SHAPES[name]
        hf = get_config(d, trust_remote_code=False)
        assert hf.architectures == cfg["architectures"] and hf.vocab_size == cfg["vocab_size"]
        mc = ModelConfig(model=d)
        assert mc.architectures == cfg["architectures"]
        assert mc.dtype == torch.bfloat16
        assert mc.max_model_len == cfg["max_position_embeddings"]
        assert mc.get_vocab_size() == cfg["vocab_size"] and mc.get_head_size() == cfg["head_dim"]
        # vLLM applies the family's sampling defaults to requests that set none (--generation-config auto).
        gen = shapes.generation_config(name)
        want = {k: gen[k] for k in ("temperature", "top_k", "top_p") if k in gen}
        assert mc.get_diff_sampling_param() == want
        if cfg.get("rope_scaling"):
            assert hf.rope_parameters["rope_type"] == "llama3"

        tok = get_tokenizer(d)
        assert len(tok) == cfg["vocab_size"] and tok.max_token_id == cfg["vocab_size"] - 1
        assert tok.eos_token_id == cfg["eos_token_id"]
        assert resolve_chat_template_content_format(None, None, "auto", tok, model_config=mc) == "string"
        conv = [{"role": "user", "content": "Hello"}]
        prompt = safe_apply_chat_template(mc, tok, conv, tokenize=False, add_generation_prompt=True)
        assert "Hello" in prompt and prompt.endswith("\n")
        # The fast incremental detokenizer's stream over ids a random model may emit, top id included.
        stream = DecodeStream(skip_special_tokens=True)
        for i in [0, 7, cfg["bos_token_id"], cfg["vocab_size"] - 1, 255, 300]:
            piece = stream.step(tok._tokenizer, i)
            assert piece is None or isinstance(piece, str)
