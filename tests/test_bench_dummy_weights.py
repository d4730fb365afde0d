"""`kog bench --dummy-weights` (kog_backend/tools/bench/weights.py): config and tokenizer only, both engines with
vLLM's load_format="dummy", the header and JSON say so, no token comparison; shapes whose checkpoint cannot be
written are refused naming the flag. Engine processes faked as in test_bench_writers.py."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from kog_backend.tools.bench import offline, weights
from kog_backend.tools.bench.offline_child import engine_kwargs
from kog_backend.tools.bench.results import BenchReport
from kog_backend.tools.commands import bench as bench_cmd
from kog_backend.tools.fixtures import checkpoints, shapes

from test_bench_also_greedy import _fake_child_also_greedy
from test_bench_writers import _fake_child

DUMMY_LINE = "weights: vLLM dummy (load_format=dummy): bytes as the real model, tokens meaningless"


def _args(tmp_path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    return p.parse_args([*argv, "--out", str(tmp_path / "out"), "--no-chart"])


@pytest.fixture
def ckpt_root(tmp_path, monkeypatch):
    """$KOG_CHECKPOINT_DIR in tmp_path; writing a checkpoint with weights fails the test."""
    root = tmp_path / "ckpts"
    monkeypatch.setenv("KOG_CHECKPOINT_DIR", str(root))

    def no_weights(*a, **kw):
        raise AssertionError(f"a checkpoint with weights was to be written: {a}")

    real_run = offline.subprocess.run

    def run(cmd, *a, **kw):  # offline.resolve_model writes a checkpoint in `python -c "...write_checkpoint(...)"`
        if any("write_checkpoint" in str(part) for part in cmd):
            no_weights(cmd)
        return real_run(cmd, *a, **kw)

    monkeypatch.setattr(offline.subprocess, "run", run)
    monkeypatch.setattr(checkpoints, "write_checkpoint", no_weights)
    return root


def test_dummy_engine_args():
    assert weights.dummy_engine_args({}) == {"load_format": "dummy"}
    assert weights.dummy_engine_args({"enforce_eager": True, "load_format": "dummy"}) == {
        "enforce_eager": True, "load_format": "dummy"}
    with pytest.raises(ValueError, match="load_format='safetensors'"):
        weights.dummy_engine_args({"load_format": "safetensors"})
    assert weights.wants_dummy(False, {"load_format": "dummy"}) and not weights.wants_dummy(False, {})
    # the child passes it to vllm.LLM on both sides
    for impl in ("stock", "kog"):
        spec = {"impl": impl, "model_path": "/d", "tp": 1, "max_model_len": 816, "engine_args": {"load_format": "dummy"}}
        assert engine_kwargs(spec)["load_format"] == "dummy"


def test_command_dummy_weights_writes_no_weights_and_says_so(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child(kog_steps=4 * 64, kog_tokens_differ=True)
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--model", "tiny-llama", "--new-tokens", "64", "--greedy", "--dummy-weights",
                 "--engine-args", '{"enforce_eager": true}')
    assert bench_cmd.run(args) == 0
    want_dir = str(ckpt_root / "tiny-llama-dummy")
    assert [c["impl"] for c in calls] == ["stock", "kog"]
    assert all(c["model_path"] == want_dir for c in calls)
    assert all(c["engine_args"] == {"enforce_eager": True, "load_format": "dummy"} for c in calls)
    files = sorted(os.listdir(want_dir))
    assert "config.json" in files and "tokenizer.json" in files
    assert not [f for f in files if f.endswith((".safetensors", ".bin"))] and checkpoints.MARKER not in files
    captured = capsys.readouterr()
    assert DUMMY_LINE in captured.out.splitlines()
    assert "tiny-llama: vLLM dummy weights (load_format=dummy)" in captured.err
    # greedy tokens differ at position 5 in the fake: not reported as a mismatch, said to be not compared
    assert "differ from stock's" not in captured.out
    assert "! tiny-llama: greedy tokens not compared: vLLM dummy weights make them meaningless" in captured.out
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert rep.settings["dummy_weights"] is True
    assert rep.settings["weights"] == weights.DUMMY_TEXT
    assert rep.settings["engine_args"] == {"enforce_eager": True, "load_format": "dummy"}
    assert rep.models[0].tokens_match is None and rep.models[0].path == want_dir
    assert rep.models[0].weight_bytes_per_token == shapes.weight_bytes_per_token("tiny-llama")  # same bytes as real


def test_command_dummy_weights_with_also_greedy(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child_also_greedy(greedy_tokens_differ=True)
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--model", "tiny-llama", "--new-tokens", "64", "--dummy-weights", "--also-greedy")
    assert bench_cmd.run(args) == 0
    out = capsys.readouterr().out
    assert "! tiny-llama greedy: greedy tokens not compared" in out and "differ from stock's" not in out
    assert "sampled kog / greedy kog, tiny-llama:" in out
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert [m.tokens_match for m in rep.models] == [None, None]


def test_engine_args_load_format_dummy_is_a_dummy_run(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child(kog_steps=4 * 64)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", "tiny-llama", "--new-tokens", "64",
                               "--engine-args", '{"load_format": "dummy"}')) == 0
    assert all(c["model_path"].endswith("tiny-llama-dummy") for c in calls)
    assert DUMMY_LINE in capsys.readouterr().out


def test_command_refuses_a_conflicting_load_format(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child(kog_steps=1)
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--model", "tiny-llama", "--dummy-weights", "--engine-args", '{"load_format": "auto"}')
    assert bench_cmd.run(args) == 2
    err = capsys.readouterr().err
    assert "--dummy-weights runs both engines with load_format='dummy'" in err and "load_format='auto'" in err
    assert not calls and not ckpt_root.exists()


def test_command_refuses_dummy_weights_over_http(tmp_path, capsys):
    assert bench_cmd.run(_args(tmp_path, "--dummy-weights", "--url", "http://127.0.0.1:1")) == 2
    assert "--dummy-weights runs the offline engines" in capsys.readouterr().err


def test_dummy_only_shape_is_refused_naming_the_flag(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child(kog_steps=1)
    monkeypatch.setattr(offline, "run_child", run_child)
    # the DUMMY_ONLY shape second: the first one's checkpoint is not written either
    args = _args(tmp_path, "--model", "tiny-llama", "--model", shapes.DUMMY_ONLY[0])
    assert bench_cmd.run(args) == 2
    err = capsys.readouterr().err
    assert f"{shapes.DUMMY_ONLY[0]}: its ~" in err and "--dummy-weights" in err and "DUMMY_ONLY" in err
    assert not calls and not ckpt_root.exists()


def test_shape_larger_than_the_free_disk_is_refused_naming_the_flag(tmp_path, ckpt_root, monkeypatch, capsys):
    need = weights.checkpoint_bytes("qwen3-32b")
    assert need / 1e9 == pytest.approx(65.5, abs=1.0)  # the checkpoint that does not fit the device's 64 GB disk
    monkeypatch.setattr(weights, "free_bytes", lambda path: 40 * 10**9)
    run_child, calls = _fake_child(kog_steps=1)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", "qwen3-32b")) == 2
    err = capsys.readouterr().err
    assert f"qwen3-32b: its random-weight checkpoint needs ~{need / 1e9:.1f} GB" in err and "40.0 GB free" in err
    assert "--dummy-weights" in err and not calls
    # a shape that fits is not refused
    assert weights.checkpoint_refusal("tiny-llama", checkpoints.default_checkpoint_dir("tiny-llama")) is None


def test_free_bytes_of_a_directory_not_made_yet(tmp_path):
    assert weights.free_bytes(str(tmp_path / "a" / "b")) > 0


def test_dummy_weights_in_a_sweep(tmp_path, ckpt_root, monkeypatch, capsys):
    run_child, calls = _fake_child(kog_steps=4 * 64)
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--model", "tiny-llama", "--prompt-lens", "32,64", "--new-tokens", "64", "--dummy-weights")
    assert bench_cmd.run(args) == 0
    assert len(calls) == 4 and all(c["engine_args"] == {"load_format": "dummy"} for c in calls)
    assert DUMMY_LINE in capsys.readouterr().out
    point = json.load(open(tmp_path / "out" / "prompt-32" / "bench.json"))
    assert point["settings"]["weights"] == weights.DUMMY_TEXT
