"""`kog bench --prompt-len N` up to the model's context and the `--prompt-lens` sweep, with the engine processes
faked as in test_bench_writers: argument handling, vLLM's max_model_len per length, the one table, JSON and chart."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from kog_backend.tools.bench import model_bytes, offline
from kog_backend.tools.bench.results import BenchReport
from kog_backend.tools.bench.sweep import SweepReport, format_sweep_table, parse_prompt_lens
from kog_backend.tools.commands import bench as bench_cmd
from kog_backend.tools.fixtures import shapes

from test_bench_writers import PNG_MAGIC, _fake_child, _png_pixels  # noqa: E402


def _args(tmp_path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    return p.parse_args([*argv, "--out", str(tmp_path / "out")])


def _ckpt(tmp_path, max_positions: int, name: str = "ckpt") -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(shapes.get_shape("tiny-llama"), max_position_embeddings=max_positions)))
    return str(d)


# ---- arguments and max_model_len ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text,want", [("2000,8000,16000", [2000, 8000, 16000]), ("2k, 64k,2000", [2000, 64000]),
                                       ("32", [32])])
def test_parse_prompt_lens(text, want):
    assert parse_prompt_lens(text) == want


@pytest.mark.parametrize("text", ["", "0", "2000,-5", "8k5", "abc", "1.5k"])
def test_bad_prompt_lens_are_refused(text, capsys):
    with pytest.raises(ValueError):
        parse_prompt_lens(text)
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--prompt-lens", text])
    assert e.value.code == 2


def test_sweep_does_not_take_urls(tmp_path, capsys):
    args = _args(tmp_path, "--prompt-lens", "2000", "--url", "http://127.0.0.1:1")
    assert bench_cmd.run(args) == 2
    assert "--prompt-lens" in capsys.readouterr().err


def _settings(**kw) -> offline.Settings:
    return offline.Settings(models=["x"], **kw)


@pytest.mark.parametrize(
    "prompt,new,limit,want,note",
    [
        (32, 512, 131072, 816, "slack"),  # 32 + 512 + 1 + 256 = 801, rounded up to 816
        (16000, 512, 131072, 16784, "slack"),
        (64000, 512, 131072, 64784, "slack"),
        (130400, 512, 131072, 131072, "capped at the model's max_position_embeddings 131072"),
        (40300, 512, 40960, 40960, "capped"),
        (40447, 512, 40960, 40960, "capped"),  # exactly fits: prompt + new + 1 = 40960
    ],
)
def test_max_model_len_follows_the_prompt_up_to_the_model(prompt, new, limit, want, note):
    cfg = dict(shapes.get_shape("llama-3.2-1b"), max_position_embeddings=limit)
    s = _settings(prompt_len=prompt, new_tokens=new)
    n = offline.max_model_len(cfg, s)
    assert n == want and n >= prompt + new + 1
    assert note in offline.max_model_len_note(cfg, s, n)


def test_max_model_len_refuses_a_request_longer_than_the_model():
    cfg = dict(shapes.get_shape("qwen3-1.7b"))  # 40960 positions
    with pytest.raises(ValueError, match="exceed the model's 40960 positions"):
        offline.max_model_len(cfg, _settings(prompt_len=40448, new_tokens=512))


def test_max_model_len_from_engine_args():
    cfg = shapes.get_shape("llama-3.2-1b")
    s = _settings(prompt_len=1000, new_tokens=100, engine_args={"max_model_len": 4096})
    assert offline.max_model_len(cfg, s) == 4096 and offline.max_model_len_note(cfg, s, 4096) == "from --engine-args"
    with pytest.raises(ValueError, match="max_model_len 1024"):
        offline.max_model_len(cfg, _settings(prompt_len=1000, new_tokens=100, engine_args={"max_model_len": 1024}))


def test_single_run_sets_and_reports_max_model_len(tmp_path, monkeypatch, capsys):
    ckpt = _ckpt(tmp_path, 131072)
    run_child, calls = _fake_child(kog_steps=4 * 64)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--prompt-len", "20000", "--new-tokens", "64",
                               "--no-chart")) == 0
    assert [c["max_model_len"] for c in calls] == [20336, 20336]  # 20000 + 64 + 1 + 256 = 20321 -> 20336
    assert len(calls[0]["prompt_token_ids"]) == 20000
    captured = capsys.readouterr()
    assert "ckpt: vLLM max_model_len 20336 (prompt 20000 + 64 new tokens + 1 + 256 slack" in captured.out
    assert "vLLM max_model_len 20336" in captured.err  # logged before the engines start
    from kog_backend.tools.bench.results import BenchReport

    assert BenchReport.load(str(tmp_path / "out" / "bench.json")).models[0].max_model_len == 20336


def test_single_run_longer_than_the_model_is_a_usage_error(tmp_path, monkeypatch, capsys):
    ckpt = _ckpt(tmp_path, 4096)
    run_child, calls = _fake_child(kog_steps=1)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--prompt-len", "4000", "--new-tokens", "512")) == 2
    assert not calls and "exceed the model's 4096 positions" in capsys.readouterr().err


# ---- the sweep ---------------------------------------------------------------------------------------------------


def _run_sweep(tmp_path, monkeypatch, lens: str, *extra: str, kog_steps: int = 4 * 64):
    run_child, calls = _fake_child(kog_steps=kog_steps)
    monkeypatch.setattr(offline, "run_child", run_child)
    code = bench_cmd.run(_args(tmp_path, "--prompt-lens", lens, "--new-tokens", "64", "--greedy", *extra))
    return code, calls


def test_sweep_runs_stock_and_kog_per_length(tmp_path, monkeypatch, capsys):
    big, small = _ckpt(tmp_path, 131072, "big"), _ckpt(tmp_path, 10000, "small")
    code, calls = _run_sweep(tmp_path, monkeypatch, "2000,8000,16000", "--model", big, "--model", small)
    assert code == 0
    # Every length fits `big`; 16000 does not fit `small` (10000 positions) and is skipped, not failed.
    ran = [(os.path.basename(c["model_path"]), len(c["prompt_token_ids"]), c["impl"], c["max_model_len"]) for c in calls]
    assert ran == [
        ("big", 2000, "stock", 2336), ("big", 2000, "kog", 2336), ("small", 2000, "stock", 2336),
        ("small", 2000, "kog", 2336), ("big", 8000, "stock", 8336), ("big", 8000, "kog", 8336),
        ("small", 8000, "stock", 8336), ("small", 8000, "kog", 8336), ("big", 16000, "stock", 16336),
        ("big", 16000, "kog", 16336),
    ]
    out = tmp_path / "out"
    sweep = SweepReport.load(str(out / "sweep.json"))
    assert [int(p.settings["prompt_len"]) for p in sweep.points] == [2000, 8000, 16000]
    assert [(x.model, x.prompt_len) for x in sweep.skipped] == [("small", 16000)]
    for n in (2000, 8000, 16000):
        assert (out / f"prompt-{n}" / "bench.json").is_file()
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln.startswith(("big ", "small "))]
    assert len(lines) == 5  # one row per (model, length) that ran: stock and kog side by side
    assert "stock tok/s" in text and "kog tok/s" in text and "kog % copy BW" in text
    assert "small prompt 16000: skipped" in text and "sweep.png" in text
    # The fake engines take the same time per token at every length, so the bytes per token (weights + the KV,
    # which grows with the prompt) make the share of copy bandwidth grow with the length.
    by = sweep.by_model()["big"]
    shares = [m.row("kog").bw_share for _, m in by]
    kv = [m.kv_bytes_per_token for _, m in by]
    assert shares == sorted(shares) and shares[0] < shares[-1]
    cfg = model_bytes.load_config(big)
    assert kv[-1] == pytest.approx(model_bytes.mean_kv_bytes_per_token(cfg, 16000, 64))
    assert by[-1][1].row("kog").bw_share == pytest.approx(
        (by[-1][1].weight_bytes_per_token + kv[-1]) * by[-1][1].row("kog").tok_s / (4290.0e9))


def test_sweep_chart_shows_stock_and_kog(tmp_path, monkeypatch):
    from kog_backend.tools.bench.chart import COLORS

    code, _ = _run_sweep(tmp_path, monkeypatch, "2000,8000,32000", "--model", _ckpt(tmp_path, 131072))
    assert code == 0
    path = tmp_path / "out" / "sweep.png"
    assert path.read_bytes()[:8] == PNG_MAGIC
    (w, h), pixels = _png_pixels(str(path))
    assert w > 1000 and h > 400
    for impl in ("stock", "kog"):
        rgb = tuple(int(COLORS[impl][i : i + 2], 16) for i in (1, 3, 5))
        assert int((pixels == rgb).all(axis=1).sum()) > 200, impl


def test_sweep_exit_status_when_kog_never_ran(tmp_path, monkeypatch, capsys):
    code, _ = _run_sweep(tmp_path, monkeypatch, "2000,8000", "--model", _ckpt(tmp_path, 131072), "--no-chart",
                         kog_steps=0)
    assert code == 1
    assert "kog steps = 0" in capsys.readouterr().out


def test_sweep_where_nothing_fits_is_a_usage_error(tmp_path, monkeypatch, capsys):
    code, calls = _run_sweep(tmp_path, monkeypatch, "8000,16000", "--model", _ckpt(tmp_path, 4096))
    assert code == 2 and not calls
    assert "no prompt length fits" in capsys.readouterr().err


def test_sweep_table_from_a_saved_json(tmp_path, monkeypatch, capsys):
    """The table is a function of the JSON alone (a reader can re-render it); slower kog rows are flagged."""
    code, _ = _run_sweep(tmp_path, monkeypatch, "2000,8000", "--model", _ckpt(tmp_path, 131072), "--no-chart")
    assert code == 0
    printed = capsys.readouterr().out
    sweep = SweepReport.load(str(tmp_path / "out" / "sweep.json"))
    assert format_sweep_table(sweep) in printed
    m = sweep.points[1].models[0]
    m.row("kog").tok_s, m.speedup = 100.0, 0.2
    assert "ckpt prompt 8000: kog is slower than stock (0.20x)" in format_sweep_table(sweep)
    with pytest.raises(ValueError):
        SweepReport.from_dict({"schema": "kog-bench/1"})


def test_sweep_reuses_lengths_measured_earlier(tmp_path, monkeypatch, capsys):
    """A long sweep in several invocations: lengths already in OUT (same models, settings and commit) are reused;
    the last invocation over every length measures only what is missing and prints the one table."""
    ckpt = _ckpt(tmp_path, 131072)
    code, calls = _run_sweep(tmp_path, monkeypatch, "2000", "--model", ckpt, "--no-chart", "--commit", "c1")
    assert code == 0 and len(calls) == 2
    code, calls = _run_sweep(tmp_path, monkeypatch, "2000,8000", "--model", ckpt, "--no-chart", "--commit", "c1")
    assert code == 0 and [len(c["prompt_token_ids"]) for c in calls] == [8000, 8000]
    out = capsys.readouterr()
    assert "prompt 2000 tokens: reusing" in out.err
    sweep = SweepReport.load(str(tmp_path / "out" / "sweep.json"))
    assert [int(p.settings["prompt_len"]) for p in sweep.points] == [2000, 8000]
    # Other settings, or another commit: measured again.
    for extra in (("--new-tokens", "32", "--commit", "c1"), ("--new-tokens", "64", "--commit", "c2")):
        run_child, calls = _fake_child(kog_steps=4 * 64)
        monkeypatch.setattr(offline, "run_child", run_child)
        args = _args(tmp_path, "--prompt-lens", "2000", "--greedy", "--model", ckpt, "--no-chart", *extra)
        assert bench_cmd.run(args) == 0 and len(calls) == 2, extra


def test_sweep_measures_again_a_length_with_a_failed_row(tmp_path, monkeypatch, capsys):
    """A length whose earlier bench.json holds a failed engine is not reused: it is measured again."""
    ckpt = _ckpt(tmp_path, 131072)
    code, calls = _run_sweep(tmp_path, monkeypatch, "2000", "--model", ckpt, "--no-chart", "--commit", "c1")
    assert code == 0 and len(calls) == 2
    path = str(tmp_path / "out" / "prompt-2000" / "bench.json")
    point = BenchReport.load(path)
    point.models[0].row("kog").ok = False
    point.save(path)
    code, calls = _run_sweep(tmp_path, monkeypatch, "2000", "--model", ckpt, "--no-chart", "--commit", "c1")
    assert code == 0 and len(calls) == 2
    assert "prompt 2000 tokens: reusing" not in capsys.readouterr().err
