"""`kog bench --fp8 LAYOUT [--also-bf16]` (kog_backend/tools/bench/fp8.py): the FP8 checkpoint of each shape, stock
and kog, rows labelled by format; bytes per token those the FP8 model reads (model_bytes); --also-bf16's kog row on
the bf16 checkpoint and kog FP8 / kog bf16; refusals. Engine processes faked as in test_bench_writers.py."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import types

import pytest

from kog_backend.tools.bench import fp8 as bench_fp8
from kog_backend.tools.bench import model_bytes, offline, weights
from kog_backend.tools.bench.results import BenchReport, RunResult
from kog_backend.tools.commands import bench as bench_cmd
from kog_backend.tools.fixtures import checkpoints, fp8_checkpoints, shapes

from test_bench_writers import LLAMA_GEN, _engine_sampling

LAYOUTS = ("tensor", "channel", "block")
# kog's ms per token on the fake engines: FP8 checkpoints read about half the bytes
KOG_MS = {"fp8": 0.4, "bf16": 0.8}
STOCK_MS = 2.0


def _fp8_cfg(shape: str, layout: str) -> dict:
    return dict(shapes.get_shape(shape), quantization_config=fp8_checkpoints.quantization_config(
        fp8_checkpoints.FORMATS[layout]))


def _args(tmp_path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    return p.parse_args([*argv, "--out", str(tmp_path / "out"), "--no-chart"])


def _fake_child(kog_tokens_differ: bool = True):
    """offline.run_child's stand-in: kog twice as fast on an FP8 checkpoint (its path names the layout)."""
    calls = []

    def run_child(spec, out_dir, tag, timeout_s, verbose):
        calls.append(dict(spec, tag=tag))
        n, impl = spec["new_tokens"], spec["impl"]
        fp8 = "-fp8-" in os.path.basename(spec["model_path"])
        ms = STOCK_MS if impl == "stock" else KOG_MS["fp8" if fp8 else "bf16"]
        ids = [(7 * i) % 1000 for i in range(n + 1)]
        if impl == "kog" and kog_tokens_differ:
            ids[3] += 1
        row = RunResult(impl=impl, ok=True, copy_gbps=4290.0, times_one_s=[0.02] * spec["reps"],
                        times_full_s=[0.02 + ms * 1e-3 * n] * spec["reps"], output_token_ids=ids,
                        generated_tokens=n + 1, sampling=_engine_sampling(spec, LLAMA_GEN))
        if impl == "kog":
            row.counters = [{"kog_steps": 64, "kog_tokens": 64 * 4, "fallbacks": {}}]
        return offline.ChildResult(row, {"gpu": "FakeGPU", "gpu_count": 1, "driver": "1.0"})

    return run_child, calls


@pytest.fixture
def ckpt_root(tmp_path, monkeypatch):
    """$KOG_CHECKPOINT_DIR in tmp_path; the bench's `python -c "...write_checkpoint(...)"` runs in this process (CPU
    weights), its code recorded."""
    root = tmp_path / "ckpts"
    monkeypatch.setenv("KOG_CHECKPOINT_DIR", str(root))
    written = []
    real_run = offline.subprocess.run

    def run(cmd, *a, **kw):
        if not any("write_checkpoint(" in str(part) for part in cmd):
            return real_run(cmd, *a, **kw)  # (git, for the commit)
        written.append(cmd[2])
        exec(cmd[2], {})
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(offline.subprocess, "run", run)
    return types.SimpleNamespace(path=root, written=written)


# ---- bytes per token ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_bytes_are_one_byte_per_projection_weight_plus_fp32_scales(layout):
    cfg = shapes.get_shape("llama-3.1-8b")
    h, i, d, layers = 4096, 14336, 128, 32
    modules = [((32 + 2 * 8) * d, h), (h, 32 * d), (2 * i, h), (h, i)]  # qkv, o, gate_up, down: (N, K)
    scales = {"tensor": lambda n, k: 1, "channel": lambda n, k: n,
              "block": lambda n, k: math.ceil(n / 128) * math.ceil(k / 128)}[layout]
    bf16 = model_bytes.weight_bytes_per_token(cfg)
    want = bf16 - layers * sum(n * k for n, k in modules) + layers * sum(4 * scales(n, k) for n, k in modules)
    got = model_bytes.weight_bytes_per_token(_fp8_cfg("llama-3.1-8b", layout))
    assert got == want
    # the embedding row, the LM head and the norms stay bf16: 8.03 GB against 15.01 GB, a ceiling of 1.87x
    assert got / 1e9 == pytest.approx(8.03, abs=0.01) and bf16 / got == pytest.approx(1.87, abs=0.01)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3"])
def test_fp8_bytes_agree_with_the_loaded_weights(shape, layout):
    # DecoderWeights.weight_bytes_per_token() counts the tensors the kernel reads (bench_monokernel.py's bytes);
    # it counts the embedding row of a tied model too, which the config estimate finds inside the LM head.
    from kog_backend.monokernel import synthetic
    from kog_backend.path.coverage import shape_from_config

    cfg = _fp8_cfg(shape, layout)
    w = synthetic.random_decoder(shape_from_config(cfg), "cpu", seed=0, fp8=layout)
    tied_row = 2 * cfg["hidden_size"] if cfg["tie_word_embeddings"] else 0
    assert w.weight_bytes_per_token() == model_bytes.weight_bytes_per_token(cfg) + tied_row


def test_fp8_bytes_keep_ignored_projections_bf16_and_leave_moe_unestimated():
    cfg = _fp8_cfg("tiny-llama", "block")
    all_fp8 = model_bytes.weight_bytes_per_token(cfg)
    cfg["quantization_config"]["ignored_layers"] += ["model.layers.1.mlp.down_proj"]
    h, i = 256, 512
    assert model_bytes.weight_bytes_per_token(cfg) == all_fp8 + h * i - 4 * (h // 128) * (i // 128)
    moe = dict(shapes.get_shape("tiny-qwen3-moe-e8"), quantization_config=cfg["quantization_config"])
    assert model_bytes.weight_bytes_per_token(moe) is None
    assert model_bytes.weight_bytes_per_token(shapes.get_shape("tiny-qwen3-moe-e8")) is not None


def test_fp8_checkpoint_disk_estimate():
    bf16 = weights.checkpoint_bytes("qwen3-32b")
    fp8 = weights.checkpoint_bytes("qwen3-32b", "block")
    assert bf16 / 1e9 == pytest.approx(65.5, abs=1.0) and fp8 / 1e9 == pytest.approx(33.5, abs=1.0)


# ---- arguments, labels, formats -------------------------------------------------------------------------------


def test_arguments():
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    a = p.parse_args([])
    assert a.fp8 is None and a.also_bf16 is False
    a = p.parse_args(["--fp8", "block", "--also-bf16", "--shape", "llama-3.1-8b"])
    assert (a.fp8, a.also_bf16, a.models) == ("block", True, ["llama-3.1-8b"])
    with pytest.raises(SystemExit):
        p.parse_args(["--fp8", "int8"])


@pytest.mark.parametrize("argv,message", [
    (["--also-bf16"], "--also-bf16 runs kog on the bf16 checkpoint of each --fp8 shape; give --fp8 LAYOUT"),
    (["--fp8", "block", "--url", "http://127.0.0.1:1"], "--fp8 runs the offline engines; it does not take --url"),
    (["--fp8", "block", "--also-bf16", "--only", "stock"], "--also-bf16 times kog on the bf16 checkpoint"),
    (["--fp8", "tensor", "--model", "tiny-qwen3-moe-e8"], "tiny-qwen3-moe-e8 is a mixture of experts"),
])
def test_refusals(tmp_path, ckpt_root, monkeypatch, capsys, argv, message):
    run_child, calls = _fake_child()
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, *argv)) == 2
    assert message in capsys.readouterr().err
    assert not calls and not ckpt_root.written


def test_refuses_fp8_for_a_checkpoint_directory(tmp_path, capsys):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(shapes.get_shape("tiny-llama")))
    assert bench_cmd.run(_args(tmp_path, "--fp8", "block", "--model", str(d))) == 2
    assert f"{d} is a checkpoint directory, run as it is" in capsys.readouterr().err


def test_variants_and_weight_formats():
    assert bench_fp8.variants(None, False) == [bench_fp8.Variant(None, "")]
    assert bench_fp8.variants("block", True) == [bench_fp8.Variant("block", " fp8-block"),
                                                 bench_fp8.Variant(None, " bf16", ("kog",))]
    text = bench_fp8.weight_format_text
    assert text(shapes.get_shape("tiny-llama")) == "bf16"
    assert text(_fp8_cfg("tiny-llama", "block")) == ("FP8 e4m3 projections, block 128x128 scales fp32 (fp8); "
                                                     "embedding, LM head and norms bf16")
    assert text(_fp8_cfg("tiny-llama", "channel")).startswith("FP8 e4m3 projections, channel scales fp32 "
                                                              "(compressed-tensors)")
    assert text(_fp8_cfg("tiny-llama", "tensor")).startswith("FP8 e4m3 projections, tensor scales fp32 (fp8)")
    assert text(dict(shapes.get_shape("tiny-llama"), quantization_config={"quant_method": "awq"})) == "awq quantised"


# ---- the command end to end ----------------------------------------------------------------------------------


def test_fp8_also_bf16_rows_bytes_header_and_ratio(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child()
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--fp8", "block", "--also-bf16", "--model", "tiny-llama", "--new-tokens", "64", "--greedy")
    assert bench_cmd.run(args) == 0
    fp8_dir = checkpoints.default_checkpoint_dir("tiny-llama", fp8="block")
    bf16_dir = checkpoints.default_checkpoint_dir("tiny-llama")
    # both checkpoints written as `kog make-checkpoint [--fp8 block]` writes them
    assert ckpt_root.written == [
        f"from kog_backend.tools.fixtures.checkpoints import write_checkpoint; write_checkpoint('tiny-llama', "
        f"{fp8_dir!r}, seed=0, fp8='block')",
        f"from kog_backend.tools.fixtures.checkpoints import write_checkpoint; write_checkpoint('tiny-llama', "
        f"{bf16_dir!r}, seed=0, fp8=None)"]
    assert checkpoints.is_current(fp8_dir, "tiny-llama", fp8="block") and checkpoints.is_current(bf16_dir, "tiny-llama")
    # stock and kog on the FP8 checkpoint, then kog alone on the bf16 one: three engine starts
    assert [(c["impl"], c["model_path"]) for c in calls] == [("stock", fp8_dir), ("kog", fp8_dir), ("kog", bf16_dir)]
    assert [c["tag"] for c in calls] == ["tiny-llama_fp8-block-stock", "tiny-llama_fp8-block-kog", "tiny-llama_bf16-kog"]
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert rep.settings["fp8"] == "block" and rep.settings["also_bf16"] is True
    fp8, bf16 = rep.models
    assert (fp8.model, bf16.model) == ("tiny-llama fp8-block", "tiny-llama bf16")
    assert (fp8.bf16_of, bf16.bf16_of) == (None, "tiny-llama fp8-block")
    assert fp8.weight_bytes_per_token == model_bytes.weight_bytes_per_token(_fp8_cfg("tiny-llama", "block"))
    assert bf16.weight_bytes_per_token == shapes.weight_bytes_per_token("tiny-llama")
    kog = fp8.row("kog")
    assert kog.gbps == pytest.approx((fp8.weight_bytes_per_token + fp8.kv_bytes_per_token) * kog.tok_s / 1e9)
    assert kog.bw_share == pytest.approx(kog.gbps / 4290.0)
    assert fp8.speedup == pytest.approx(STOCK_MS / KOG_MS["fp8"]) and bf16.speedup is None
    assert fp8.kog_fp8_over_bf16 == pytest.approx(KOG_MS["bf16"] / KOG_MS["fp8"])
    assert fp8.tokens_match is False
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert (f"weights, tiny-llama fp8-block: FP8 e4m3 projections, block 128x128 scales fp32 (fp8); embedding, LM "
            f"head and norms bf16; {fp8.weight_bytes_per_token / 1e9:.3f} GB of weights per token") in lines
    assert f"weights, tiny-llama bf16: bf16; {bf16.weight_bytes_per_token / 1e9:.3f} GB of weights per token" in lines
    assert "kog FP8 / kog bf16, tiny-llama fp8-block / tiny-llama bf16: 2.00x (2500.0 / 1250.0 tok/s, same run)" in lines
    assert any(line.startswith("tiny-llama bf16") and " kog " in line for line in lines)
    assert not any(line.startswith("tiny-llama bf16") and " stock " in line for line in lines)
    assert "stock quantises the activations to FP8 as well, kog keeps them bf16" in out


def test_plain_bf16_run_header_is_unchanged(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child(kog_tokens_differ=False)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", "tiny-llama", "--new-tokens", "64")) == 0
    out = capsys.readouterr().out
    assert "weights, " not in out and "kog FP8" not in out
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert "fp8" not in rep.settings and "also_bf16" not in rep.settings
    assert rep.models[0].model == "tiny-llama" and rep.models[0].weight_format == "bf16"


def test_fp8_dummy_weights_write_the_fp8_config_only(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child()
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--fp8", "channel", "--dummy-weights", "--model", "tiny-qwen3", "--new-tokens", "64")
    assert bench_cmd.run(args) == 0
    want = str(ckpt_root.path / "tiny-qwen3-fp8-channel-dummy")
    assert [c["model_path"] for c in calls] == [want, want] and not ckpt_root.written
    assert all(c["engine_args"] == {"load_format": "dummy"} for c in calls)
    cfg = json.load(open(os.path.join(want, "config.json")))
    assert cfg["quantization_config"] == fp8_checkpoints.quantization_config(fp8_checkpoints.FORMATS["channel"])
    assert not [f for f in os.listdir(want) if f.endswith(".safetensors")]
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert rep.models[0].model == "tiny-qwen3 fp8-channel"
    assert rep.models[0].weight_bytes_per_token == model_bytes.weight_bytes_per_token(cfg)
    assert "tiny-qwen3: vLLM dummy weights (load_format=dummy): FP8 channel config and tokenizer only" in \
        capsys.readouterr().err


def test_fp8_with_also_greedy_pairs_the_greedy_rows_too(tmp_path, ckpt_root, monkeypatch, capsys):
    from test_bench_also_greedy import _fake_child_also_greedy

    run_child, calls = _fake_child_also_greedy()
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--fp8", "tensor", "--also-bf16", "--also-greedy", "--dummy-weights", "--model",
                 "tiny-llama", "--new-tokens", "64")
    assert bench_cmd.run(args) == 0
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert [m.model for m in rep.models] == ["tiny-llama fp8-tensor", "tiny-llama fp8-tensor greedy",
                                             "tiny-llama bf16", "tiny-llama bf16 greedy"]
    assert [m.bf16_of for m in rep.models] == [None, None, "tiny-llama fp8-tensor", "tiny-llama fp8-tensor greedy"]
    assert rep.models[0].kog_fp8_over_bf16 == pytest.approx(1.0)  # the fake runs every checkpoint alike
    assert rep.models[1].kog_fp8_over_bf16 == pytest.approx(1.0)
    out = capsys.readouterr().out
    assert "kog FP8 / kog bf16, tiny-llama fp8-tensor greedy / tiny-llama bf16 greedy: 1.00x" in out
    assert "weights, tiny-llama fp8-tensor greedy" not in out  # one line per checkpoint


def test_fp8_sweep_labels_and_reuse(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child()
    monkeypatch.setattr(offline, "run_child", run_child)
    argv = ["--fp8", "block", "--also-bf16", "--dummy-weights", "--model", "tiny-llama", "--prompt-lens", "32,64",
            "--new-tokens", "64", "--commit", "abc"]
    assert bench_cmd.run(_args(tmp_path, *argv)) == 0
    assert len(calls) == 6
    out = capsys.readouterr().out
    assert "kog FP8 / kog bf16, tiny-llama fp8-block prompt 32: 2.00x" in out
    assert "kog FP8 / kog bf16, tiny-llama fp8-block prompt 64: 2.00x" in out
    calls.clear()
    assert bench_cmd.run(_args(tmp_path, *argv)) == 0
    assert not calls  # both lengths reused: the labels match the earlier run's


def test_fp8_checkpoint_too_large_is_refused_with_also_bf16_only(tmp_path, ckpt_root, monkeypatch, capsys):
    monkeypatch.setattr(weights, "free_bytes", lambda path: 40 * 10**9)
    assert weights.checkpoint_refusal("qwen3-32b", checkpoints.default_checkpoint_dir("qwen3-32b", fp8="block"),
                                      "block") is None  # ~33.5 GB fits
    run_child, calls = _fake_child()
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--fp8", "block", "--also-bf16", "--model", "qwen3-32b")) == 2
    err = capsys.readouterr().err
    assert "qwen3-32b: its random-weight checkpoint needs ~" in err and "--dummy-weights" in err
    assert not calls and not ckpt_root.written
