"""`kog bench` writers on fake results: JSON round trip, the table, the PNG, and the command end to end with
the engine processes replaced by fakes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
from datetime import datetime, timedelta, timezone

import pytest

from kog_backend.config import DEFAULT_TOKENS_PER_STEP
from kog_backend.tools.bench import offline
from kog_backend.tools.bench.results import SCHEMA, BenchReport, ModelResult, RunResult
from kog_backend.tools.bench.table import format_table, markdown_table
from kog_backend.tools.commands import bench as bench_cmd

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPORT_DATE = datetime(2026, 12, 2, 12, tzinfo=timezone.utc)  # fake_report's run


def _row(impl: str, tok_s: float, rng: random.Random, **kw) -> RunResult:
    return RunResult(
        impl=impl, ok=True, tok_s=tok_s, ms_per_token=1e3 / tok_s, ttft_ms=rng.uniform(10, 40),
        gbps=2.48 * tok_s, copy_gbps=4290.0, bw_share=2.48 * tok_s / 4290.0, floor_tok_s=4290 / 2.48,
        times_one_s=[rng.uniform(0.01, 0.04) for _ in range(3)], times_full_s=[rng.uniform(0.5, 1.0) for _ in range(3)],
        output_token_ids=[rng.randrange(128256) for _ in range(9)], **kw,
    )


def fake_report(seed: int = 0) -> BenchReport:
    rng = random.Random(seed)
    stock_tok, kog_tok = rng.uniform(450, 600), rng.uniform(1200, 1500)
    m1 = ModelResult(
        model="llama-3.2-1b", path="/ckpt/llama", weight_bytes_per_token=2471628800, kv_bytes_per_token=9.45e6,
        rows=[
            _row("stock", stock_tok, rng),
            _row("kog", kog_tok, rng, counters=[{"kog_steps": 2048, "kog_tokens": 2048, "fallback_steps": 8, "fallbacks": {"prefill": 8}}],
                 kog_token_share=1.0),
        ],
        speedup=kog_tok / stock_tok, tokens_match=True,
    )
    m2 = ModelResult(
        model="qwen3-1.7b", path="/ckpt/qwen", weight_bytes_per_token=3441149952,
        rows=[_row("stock", 466.0, rng), RunResult(impl="kog", ok=False, error="RuntimeError: launch failed")],
    )
    return BenchReport(
        kind="offline", date=REPORT_DATE.isoformat(), commit="abc123def456", kog_version="0.1.0",
        host={"gpu": "NVIDIA H200", "gpu_count": 1, "driver": "580.159.03", "torch": "2.11.0+cu130", "vllm": "0.26.0"},
        settings={"prompt_len": 32, "new_tokens": 512, "tokens_per_step": 8, "temperature": 0.0, "tp": 1, "reps": 3,
                  "warmup": 1, "stat": "best"},
        models=[m1, m2],
    )


def test_json_round_trip(tmp_path):
    rep = fake_report(seed=random.randrange(1 << 30))
    path = str(tmp_path / "bench.json")
    rep.save(path)
    with open(path) as f:
        raw = json.load(f)
    assert raw["schema"] == SCHEMA
    assert [r["impl"] for r in raw["models"][0]["rows"]] == ["stock", "kog"]
    back = BenchReport.load(path)
    assert back == rep
    assert back.models[0].row("kog").counters[0]["kog_steps"] == 2048
    assert back.models[1].row("kog").error == "RuntimeError: launch failed"
    # every RunResult field survives
    assert set(raw["models"][0]["rows"][0]) == {f.name for f in dataclasses.fields(RunResult)}


def test_json_rejects_other_schemas():
    d = fake_report().to_dict()
    d["schema"] = "something-else/1"
    with pytest.raises(ValueError, match="schema"):
        BenchReport.from_dict(d)
    # other JSON under benchmarks/results/ (a list of rows, a latency dict) is refused the same way, so the
    # renderer skips it instead of crashing
    for other in ([{"shape": "llama-3.2-1b", "ctx": 32}], {"avg_latency": 0.5}):
        with pytest.raises(ValueError, match="schema"):
            BenchReport.from_dict(other)


def test_table_lists_every_row_with_its_figures():
    rep = fake_report()
    text = format_table(rep)
    m1 = rep.models[0]
    stock, kog = m1.rows
    assert "NVIDIA H200" in text and "abc123def456" in text and "K=8" in text and "greedy" in text
    lines = text.splitlines()
    stock_line = next(l for l in lines if l.startswith("llama-3.2-1b") and " stock " in l)
    kog_line = next(l for l in lines if l.startswith("llama-3.2-1b") and " kog " in l)
    assert f"{stock.tok_s:.1f}" in stock_line and f"{stock.ms_per_token:.3f}" in stock_line
    assert f"{kog.tok_s:.1f}" in kog_line and f"{100 * kog.bw_share:.1f}%" in kog_line and "2048" in kog_line
    assert f"{m1.speedup:.2f}x" in kog_line
    assert "FAILED" in next(l for l in lines if l.startswith("qwen3-1.7b") and " kog " in l)
    assert "! qwen3-1.7b kog: RuntimeError: launch failed" in text
    # columns line up: the header's tok/s column ends where every row's tok/s value ends
    header = next(l for l in lines if l.startswith("model"))
    end = header.index("tok/s") + len("tok/s")
    assert stock_line[:end].endswith(f"{stock.tok_s:.1f}")


def test_table_and_chart_name_non_default_engine_arguments(tmp_path):
    rep = fake_report()
    assert "engine arguments" not in format_table(rep)
    rep.settings["engine_args"] = {"enforce_eager": True}
    rep.settings["kog_options"] = {"step_impl": "monokernel"}
    text = format_table(rep)
    assert 'engine arguments on both sides: {"enforce_eager": true}' in text
    assert 'kog options: {"step_impl": "monokernel"}' in text
    from kog_backend.tools.bench.chart import write_chart

    path = str(tmp_path / "eager.png")
    assert write_chart(rep, path) == path and os.path.getsize(path) > 5000


def test_table_shows_warnings_and_token_mismatch():
    rep = fake_report()
    rep.models[0].rows[1].warnings.append("kog steps = 0: this row measured stock vLLM")
    rep.models[0].tokens_match, rep.models[0].first_mismatch = False, 17
    text = format_table(rep)
    assert "! llama-3.2-1b kog: kog steps = 0" in text
    assert "differ from stock's from position 17" in text


def test_markdown_table():
    md = markdown_table(fake_report().models[0])
    rows = md.splitlines()
    assert rows[0].startswith("| path | tok/s") and len(rows) == 4
    assert all(r.count("|") == rows[0].count("|") for r in rows)


def _png_pixels(path):
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"))
    return (rgb.shape[1], rgb.shape[0]), rgb.reshape(-1, 3)


def test_chart_png(tmp_path):
    from kog_backend.tools.bench.chart import COLORS, write_chart

    path = str(tmp_path / "bench.png")
    assert write_chart(fake_report(), path) == path
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert os.path.getsize(path) > 5000
    (w, h), pixels = _png_pixels(path)
    assert w > 600 and h > 300
    # both bar colours are drawn
    for impl in ("stock", "kog"):
        rgb = tuple(int(COLORS[impl][i : i + 2], 16) for i in (1, 3, 5))
        assert int((pixels == rgb).all(axis=1).sum()) > 500, impl


def test_chart_png_without_results(tmp_path):
    from kog_backend.tools.bench.chart import write_chart

    empty = BenchReport(kind="offline", date=REPORT_DATE.date().isoformat(), commit="x")
    write_chart(empty, str(tmp_path / "empty.png"))
    assert os.path.getsize(tmp_path / "empty.png") > 1000


# ---- the command, with the engine processes faked ------------------------------------------------------


def _args(tmp_path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    return p.parse_args([*argv, "--out", str(tmp_path / "out")])


LLAMA_GEN = {"temperature": 0.6, "top_p": 0.9}  # get_diff_sampling_param() of a Llama 3.x checkpoint
QWEN_GEN = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


def _engine_sampling(spec, gen: dict) -> dict:
    """What an engine process reports of its sampling (offline_child.sampling_record), with vLLM's SamplingParams."""
    from vllm import SamplingParams

    from kog_backend.tools.bench.offline_child import sampling_kwargs
    from kog_backend.tools.bench.sampling import FIELDS, NEUTRAL

    defaults = {k: v for k, v in {**NEUTRAL, **gen}.items() if k in FIELDS}  # LLM.get_default_sampling_params()
    sp = SamplingParams(**sampling_kwargs(spec, spec["new_tokens"] + 1, defaults))
    return {"params": {k: getattr(sp, k) for k in FIELDS}, "seed": sp.seed, "generation_config": dict(gen)}


def _fake_child(kog_steps: int, kog_tokens_differ: bool = False, gen_of=lambda path: LLAMA_GEN):
    calls = []

    def run_child(spec, out_dir, tag, timeout_s, verbose):
        calls.append(spec)
        n = spec["new_tokens"]
        per_token = 0.002 if spec["impl"] == "stock" else 0.0008
        ids = [(7 * i) % 1000 for i in range(n + 1)]
        if spec["impl"] == "kog" and kog_tokens_differ:
            ids[5] += 1
        row = RunResult(
            impl=spec["impl"], ok=True, copy_gbps=4290.0, times_one_s=[0.02] * spec["reps"],
            times_full_s=[0.02 + per_token * n] * spec["reps"], output_token_ids=ids, generated_tokens=n + 1,
            sampling=_engine_sampling(spec, gen_of(spec["model_path"])),
        )
        if spec["impl"] == "kog":
            row.counters = [{"kog_steps": kog_steps, "kog_tokens": kog_steps, "fallbacks": {}}]
        return offline.ChildResult(row, {"gpu": "FakeGPU", "gpu_count": 1, "driver": "1.0"})

    return run_child, calls


def test_command_end_to_end(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    from kog_backend.tools.fixtures import shapes

    (ckpt / "config.json").write_text(json.dumps(shapes.get_shape("tiny-llama")))
    run_child, calls = _fake_child(kog_steps=4 * 64)
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--model", str(ckpt), "--new-tokens", "64", "--prompt-len", "8", "-K", "4", "--no-chart",
                 "--greedy")
    assert bench_cmd.run(args) == 0
    assert [c["impl"] for c in calls] == ["stock", "kog"]
    assert calls[0]["prompt_token_ids"] == calls[1]["prompt_token_ids"] and len(calls[0]["prompt_token_ids"]) == 8
    assert calls[1]["tokens_per_step"] == 4
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    m = rep.models[0]
    assert m.row("stock").ms_per_token == pytest.approx(2.0) and m.row("kog").ms_per_token == pytest.approx(0.8)
    assert m.speedup == pytest.approx(2.5) and m.tokens_match is True
    assert rep.host["gpu"] == "FakeGPU" and rep.settings["tokens_per_step"] == 4
    # The main job measures kog's speed path unless told otherwise; options given on the command line win.
    assert calls[1]["kog_options"] == {"step_impl": "monokernel"}
    assert rep.settings["kog_options"] == {"step_impl": "monokernel"}
    calls.clear()
    args = _args(tmp_path, "--model", str(ckpt), "--new-tokens", "64", "--kog-options", '{"step_impl": "torch"}',
                 "--only", "kog", "--no-chart")
    assert bench_cmd.run(args) == 0
    assert calls[0]["kog_options"] == {"step_impl": "torch"} and calls[0]["tokens_per_step"] == DEFAULT_TOKENS_PER_STEP
    # K from the kog options when -K is not given; -K wins over it.
    for extra, k in (([], 16), (["-K", "4"], 4)):
        calls.clear()
        args = _args(tmp_path, "--model", str(ckpt), "--new-tokens", "64", "--kog-options", '{"tokens_per_step": 16}',
                     "--only", "kog", "--no-chart", *extra)
        assert bench_cmd.run(args) == 0
        assert calls[0]["tokens_per_step"] == k
        assert BenchReport.load(str(tmp_path / "out" / "bench.json")).settings["tokens_per_step"] == k


def test_command_exit_status_when_kog_never_ran(tmp_path, monkeypatch, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    from kog_backend.tools.fixtures import shapes

    (ckpt / "config.json").write_text(json.dumps(shapes.get_shape("tiny-llama")))
    run_child, _ = _fake_child(kog_steps=0, kog_tokens_differ=True)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", str(ckpt), "--new-tokens", "16", "--no-chart", "--greedy")) == 1
    out = capsys.readouterr().out
    assert "kog steps = 0" in out and "differ from stock's from position 5" in out


def _ckpt(tmp_path, name: str = "ckpt", shape: str = "tiny-llama"):
    from kog_backend.tools.fixtures import shapes

    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(shapes.get_shape(shape)))
    return str(d)


def test_args_sampling_defaults():
    args = argparse.ArgumentParser()
    bench_cmd.add_arguments(args)
    a = args.parse_args([])
    assert not a.greedy and a.seed is None
    assert all(getattr(a, k) is None for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                              "presence_penalty", "frequency_penalty"))
    assert bench_cmd.sampling_overrides(a) == {}
    assert bench_cmd.sampling_overrides(args.parse_args(["--greedy"])) == {"temperature": 0.0}
    assert bench_cmd.sampling_overrides(args.parse_args(["--greedy", "--repetition-penalty", "1.1"])) == {
        "repetition_penalty": 1.1, "temperature": 0.0}
    assert bench_cmd.sampling_overrides(args.parse_args(["--temperature", "0.8", "--top-k", "50"])) == {
        "temperature": 0.8, "top_k": 50}
    with pytest.raises(ValueError, match="--greedy is temperature 0, which ignores --temperature, --top-p"):
        bench_cmd.sampling_overrides(args.parse_args(["--greedy", "--temperature", "0.5", "--top-p", "0.9"]))


def test_command_default_sampling_is_the_generation_config(tmp_path, monkeypatch, capsys):
    """Nothing set: the engines get no sampling field from the bench (vLLM's defaults for the model, its
    generation config); the header and the JSON say what was in force; no greedy token comparison."""
    ckpt = _ckpt(tmp_path)
    run_child, calls = _fake_child(kog_steps=4 * 64)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--new-tokens", "64", "--no-chart")) == 0
    assert all(c["sampling_overrides"] == {} and c["sampling_seed"] is None for c in calls)
    captured = capsys.readouterr()
    assert "sampling: model generation config: temperature 0.6, top_p 0.9; unseeded" in captured.out
    assert "sampling: the model's generation config as vLLM applies it" in captured.err  # before the engines run
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert rep.settings["sampling"] == {"greedy": False, "overrides": {}, "seed": None}
    assert not {"temperature", "top_p", "top_k"} & set(rep.settings)
    m = rep.models[0]
    assert m.sampling["generation_config"] == LLAMA_GEN and m.sampling["seed"] is None
    assert (m.sampling["params"]["temperature"], m.sampling["params"]["top_p"]) == (0.6, 0.9)
    assert m.tokens_match is None  # sampled: kog's tokens are not expected to equal stock's


def test_command_greedy_and_explicit_flags(tmp_path, monkeypatch, capsys):
    ckpt = _ckpt(tmp_path)
    run_child, calls = _fake_child(kog_steps=4 * 64)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--new-tokens", "64", "--no-chart", "--greedy")) == 0
    assert all(c["sampling_overrides"] == {"temperature": 0.0} for c in calls)
    assert "sampling: greedy (--greedy); unseeded" in capsys.readouterr().out
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert rep.settings["sampling"] == {"greedy": True, "overrides": {"temperature": 0.0}, "seed": None}
    assert rep.models[0].sampling["params"]["top_p"] == 1.0 and rep.models[0].tokens_match is True

    calls.clear()
    args = _args(tmp_path, "--model", ckpt, "--new-tokens", "64", "--no-chart", "--temperature", "0.8", "--seed", "3")
    assert bench_cmd.run(args) == 0
    assert all(c["sampling_overrides"] == {"temperature": 0.8} and c["sampling_seed"] == 3 for c in calls)
    out = capsys.readouterr().out
    assert ("sampling: temperature 0.8, top_p 0.9 (--temperature 0.8 over the model generation config: "
            "temperature 0.6, top_p 0.9); seed 3") in out
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert rep.settings["sampling"] == {"greedy": False, "overrides": {"temperature": 0.8}, "seed": 3}
    assert rep.models[0].sampling["params"]["temperature"] == 0.8 and rep.models[0].sampling["seed"] == 3

    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--greedy", "--top-k", "20")) == 2
    assert "--greedy is temperature 0, which ignores --top-k" in capsys.readouterr().err


def test_command_header_names_each_models_sampling(tmp_path, monkeypatch, capsys):
    llama, qwen = _ckpt(tmp_path, "llama"), _ckpt(tmp_path, "qwen", "tiny-qwen3")
    run_child, _ = _fake_child(kog_steps=4 * 64, gen_of=lambda path: QWEN_GEN if path.endswith("qwen") else LLAMA_GEN)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", llama, "--model", qwen, "--new-tokens", "64")) == 0
    out = capsys.readouterr().out
    assert "sampling (llama): model generation config: temperature 0.6, top_p 0.9; unseeded" in out
    assert "sampling (qwen): model generation config: temperature 0.6, top_p 0.95, top_k 20; unseeded" in out
    assert os.path.getsize(tmp_path / "out" / "bench.png") > 5000


def test_header_of_a_json_written_before_sampling_was_recorded():
    rep = fake_report()  # settings with "temperature": 0.0 and no "sampling"
    assert "sampling: greedy" in format_table(rep).splitlines()
    rep.settings.update(temperature=0.8, top_p=0.9, top_k=0)
    assert "sampling: temperature 0.8 top-p 0.9 top-k 0" in format_table(rep)


def test_engines_that_disagree_on_sampling_are_flagged():
    a = RunResult(impl="stock", ok=True, sampling={"params": {"temperature": 0.6}, "seed": None, "generation_config": {}})
    b = RunResult(impl="kog", ok=True, sampling={"params": {"temperature": 1.0}, "seed": None, "generation_config": {}})
    m = ModelResult(model="m", path="/m", rows=[a, b])
    assert offline.model_sampling(m) == a.sampling and "differs from the stock engine's" in b.warnings[0]


def test_command_only_stock(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    from kog_backend.tools.fixtures import shapes

    (ckpt / "config.json").write_text(json.dumps(shapes.get_shape("tiny-llama")))
    run_child, calls = _fake_child(kog_steps=1)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", str(ckpt), "--only", "stock", "--no-chart")) == 0
    assert [c["impl"] for c in calls] == ["stock"]


def test_command_bad_kog_options(tmp_path, capsys):
    assert bench_cmd.run(_args(tmp_path, "--kog-options", '{"no_such_option": 1}')) == 2
    assert "unknown kog option" in capsys.readouterr().err
    assert bench_cmd.run(_args(tmp_path, "-K", "1000")) == 2


def test_command_bad_model(tmp_path, capsys):
    assert bench_cmd.run(_args(tmp_path, "--model", str(tmp_path / "missing"))) == 2
    assert "neither a checkpoint directory nor an embedded shape" in capsys.readouterr().err


def test_exit_status_failed_row():
    rep = fake_report()
    assert bench_cmd.exit_status(rep) == 1  # qwen3's kog row failed
    rep.models.pop()
    assert bench_cmd.exit_status(rep) == 0


# ---- docs/performance.md from JSON ---------------------------------------------------------------------


def _render_module():
    import benchmark_scripts

    return benchmark_scripts.load("render_performance")


def test_render_performance(tmp_path):
    from kog_backend.tools.bench.chart import write_chart

    render = _render_module()
    old, new = fake_report(seed=1), fake_report(seed=2)
    old.date, old.commit = (REPORT_DATE - timedelta(days=2)).isoformat(), "0ld0ld0ld0ld"
    new.models[0].rows[1].warnings.append("only 90% of decoded tokens ran on the kog path")
    paths = []
    for name, rep in (("a", old), ("b", new)):
        d = tmp_path / "results" / name
        (d / "logs").mkdir(parents=True)
        rep.save(str(d / "bench.json"))
        (d / "logs" / "x.result.json").write_text("{}")  # an engine's file: never read as a run
        paths.append(str(d / "bench.json"))
    write_chart(new, str(tmp_path / "results" / "b" / "bench.png"))
    out = tmp_path / "docs" / "performance.md"
    out.parent.mkdir()
    text = render.render(paths, str(out))
    assert out.read_text() == text
    # newest run first, with date, GPU and commit in its heading
    assert text.index("commit `abc123def456`") < text.index("commit `0ld0ld0ld0ld`")
    assert f"{REPORT_DATE:%Y-%m-%d %H:%M} UTC, NVIDIA H200" in text
    # the summary holds the newest figure per model
    m = new.models[0]
    summary_line = next(l for l in text.splitlines() if l.startswith("| llama-3.2-1b |"))
    assert f"{m.row('stock').tok_s:.1f}" in summary_line and f"{m.row('kog').tok_s:.1f}" in summary_line
    assert f"{m.speedup:.2f}x" in summary_line and "K=8" in summary_line
    assert "![stock vs kog" in text and "(../results/b/bench.png)" in text
    assert "Greedy tokens: identical to stock." in text
    assert "- kog: only 90% of decoded tokens ran on the kog path" in text
    assert "failed: RuntimeError: launch failed" in text


def test_render_summary_needs_both_sides_and_shows_options(tmp_path):
    render = _render_module()
    both, kog_only = fake_report(seed=3), fake_report(seed=4)
    both.settings["kog_options"] = {"step_impl": "monokernel", "run_ahead": True}
    kog_only.date = (REPORT_DATE + timedelta(days=7)).isoformat()  # newer, but no stock row
    for m in kog_only.models:
        m.rows = [r for r in m.rows if r.impl == "kog"]
    paths = []
    for name, rep in (("both", both), ("kog", kog_only)):
        rep.save(str(tmp_path / f"{name}.json"))
        paths.append(str(tmp_path / f"{name}.json"))
    text = render.render(paths, str(tmp_path / "p.md"))
    line = next(l for l in text.splitlines() if l.startswith("| llama-3.2-1b |"))
    assert f"{both.models[0].row('stock').tok_s:.1f}" in line and "`run_ahead=true`" in line
    assert "step_impl" not in line


def test_render_default_paths_skip_engine_files(tmp_path, monkeypatch):
    render = _render_module()
    (tmp_path / "r1" / "logs").mkdir(parents=True)
    fake_report().save(str(tmp_path / "r1" / "bench.json"))
    (tmp_path / "r1" / "logs" / "m-kog.result.json").write_text("{}")
    monkeypatch.setattr(render, "RESULTS", str(tmp_path))
    assert render.default_paths() == [str(tmp_path / "r1" / "bench.json")]


def test_render_without_results(tmp_path):
    text = _render_module().render([], str(tmp_path / "p.md"))
    assert "No results yet" in text and "kog bench" in text
