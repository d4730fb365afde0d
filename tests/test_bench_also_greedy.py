"""`kog bench --also-greedy` (kog_backend/tools/bench/greedy_rounds.py): the engine process times greedy rounds
after the request's, each row counts its own rounds' kog counters; the parent reports "<model> greedy" rows, the
sampled kog row as a percentage of the greedy one, JSON and table; old JSON still loads. Engines faked as in
test_bench_child.py and test_bench_writers.py."""

from __future__ import annotations

import argparse
import glob
import json
import os

import pytest

from kog_backend.tools.bench import greedy_rounds, offline, offline_child
from kog_backend.tools.bench.results import BenchReport, RunResult
from kog_backend.tools.bench.table import format_table
from kog_backend.tools.commands import bench as bench_cmd

from test_bench_child import FakeLLM, _spec, ckpt_dirs, fake_engine  # noqa: F401 (fixtures)
from test_bench_writers import LLAMA_GEN, _ckpt, _engine_sampling, fake_report

# ---- counters: the difference of two kog_stats snapshots -----------------------------------------------------


def test_counters_since_keeps_only_the_rounds_between_the_snapshots():
    before = {"pid": 7, "kog_steps": 40, "kog_tokens": 300, "fallback_steps": 6, "fallbacks": {"prefill": 5, "x": 1},
              "single_token_steps": {"penalties": 2}, "run_ahead_used": 3, "run_ahead_abandoned": 1,
              "launch_aborts": 0, "disabled_reason": None, "timeline": {"period": 1.0}}
    after = {"pid": 7, "kog_steps": 65, "kog_tokens": 500, "fallback_steps": 11, "fallbacks": {"prefill": 10, "x": 1},
             "single_token_steps": {"penalties": 2, "top-k": 4}, "run_ahead_used": 9, "run_ahead_abandoned": 1,
             "launch_aborts": 2, "disabled_reason": "launch failed", "timeline": {"period": 0.5}}
    d = greedy_rounds.counters_since(before, after)
    assert (d["kog_steps"], d["kog_tokens"], d["fallback_steps"]) == (25, 200, 5)
    assert d["fallbacks"] == {"prefill": 5} and d["single_token_steps"] == {"top-k": 4}
    assert (d["run_ahead_used"], d["run_ahead_abandoned"], d["launch_aborts"]) == (6, 0, 2)
    assert d["disabled_reason"] == "launch failed" and d["timeline"] == {"period": 0.5} and d["pid"] == 7
    # a timeline the greedy rounds did not record is the sampled request's: not theirs
    assert "timeline" not in greedy_rounds.counters_since(before, dict(after, timeline={"period": 1.0}))
    assert greedy_rounds.split_counters([before, before], [after, after]) == [d, d]
    with pytest.raises(ValueError, match="workers"):
        greedy_rounds.split_counters([before], [after, after])


def test_greedy_overrides_keep_the_flags_at_temperature_zero():
    assert greedy_rounds.greedy_overrides({}) == {"temperature": 0.0}
    assert greedy_rounds.greedy_overrides({"temperature": 0.8, "repetition_penalty": 1.1}) == {
        "temperature": 0.0, "repetition_penalty": 1.1}


# ---- the engine process --------------------------------------------------------------------------------------


class CountingLLM(FakeLLM):
    """FakeLLM whose kog counters grow as a kog worker's do: each call one prefill step that falls back; the
    sampled calls decode every token on the kog path, the greedy calls half of them (so each row's share differs)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stats = {"kog_steps": 0, "kog_tokens": 0, "fallback_steps": 0, "fallbacks": {}, "disabled_reason": None}

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        out = super().generate(prompts, sampling_params, use_tqdm)
        decoded = sampling_params.max_tokens - 1
        on_kog = decoded // 2 if sampling_params.temperature == 0.0 else decoded
        st = self.stats
        st["kog_steps"] += -(-on_kog // 8)
        st["kog_tokens"] += on_kog
        st["fallback_steps"] += 1
        st["fallbacks"] = {"prefill": st["fallbacks"].get("prefill", 0) + 1}
        return out

    def collective_rpc(self, method):
        assert method == "kog_stats"
        return [dict(self.stats, fallbacks=dict(self.stats["fallbacks"]))]


def _also_greedy_spec(tmp_path, impl, model_path):
    path = _spec(tmp_path, impl, model_path, overrides={})
    spec = json.loads(open(path).read())
    spec["also_greedy"] = True
    open(path, "w").write(json.dumps(spec))
    return path


@pytest.mark.parametrize("impl", ["stock", "kog"])
def test_child_times_greedy_rounds_after_the_requests_own(tmp_path, fake_engine, ckpt_dirs, monkeypatch, impl):  # noqa: F811
    import vllm

    monkeypatch.setattr(vllm, "LLM", CountingLLM)
    rfd, wfd = os.pipe()
    res = tmp_path / "r.json"
    argv = [_also_greedy_spec(tmp_path, impl, ckpt_dirs["tiny-llama"]), str(res), "--progress-fd", str(wfd)]
    assert offline_child.main(argv) == 0
    progress = os.read(rfd, 65536).decode().splitlines()
    os.close(rfd)
    assert progress[0] == "total 12"  # copy, engine start, 2 + 3 sampled rounds, 2 + 3 greedy rounds
    assert progress[-6:] == ["step greedy warm-up 1", "step greedy warm-up 2", "step greedy rep 1",
                             "step greedy rep 2", "step greedy rep 3", "done"]
    data = json.loads(res.read_text())
    row, greedy = RunResult.from_dict(data["row"]), RunResult.from_dict(data["greedy_row"])
    (llm,) = fake_engine.instances
    # 5 sampled rounds at the generation config's temperature, then 5 greedy rounds on the same prompt
    temps = [sp.temperature for _, _, sp in llm.calls]
    assert temps == [0.6] * 10 + [0.0] * 10 and [n for _, n, _ in llm.calls] == [1, 41] * 10
    assert all(p == [5, 6, 7, 8] for p, _, _ in llm.calls)
    assert row.sampling["params"]["temperature"] == 0.6 and greedy.sampling["params"]["temperature"] == 0.0
    assert greedy.sampling["params"]["top_p"] == 1.0  # vLLM drops the generation config's top-p at temperature 0
    assert greedy.ok and len(greedy.times_one_s) == len(greedy.times_full_s) == 3 and greedy.generated_tokens == 41
    assert (greedy.copy_gbps, greedy.load_s) == (row.copy_gbps, row.load_s)  # same process, same measurement
    if impl == "stock":
        assert row.counters is None and greedy.counters is None
        return
    # each row counts its own 10 calls: sampled 5 x 40 tokens on kog, greedy 5 x 20
    assert row.counters[0]["kog_tokens"] == 200 and row.counters[0]["fallbacks"] == {"prefill": 10}
    assert greedy.counters[0]["kog_tokens"] == 100 and greedy.counters[0]["fallbacks"] == {"prefill": 10}
    assert greedy.counters[0]["kog_steps"] == 5 * 3 and greedy.counters[0]["fallback_steps"] == 10
    s = offline.Settings(models=["m"], new_tokens=40, reps=3, warmup=2)
    fin_row, fin_greedy = offline.finalize_row(row, s, 1e9), offline.finalize_row(greedy, s, 1e9)
    assert fin_row.kog_token_share == pytest.approx(1.0) and fin_row.warnings == []
    assert fin_greedy.kog_token_share == pytest.approx(0.5)
    assert any("only 50% of decoded tokens" in w for w in fin_greedy.warnings)


def test_child_greedy_rounds_that_fail_leave_the_sampled_row(tmp_path, fake_engine, ckpt_dirs, monkeypatch):  # noqa: F811
    import vllm

    class FailsGreedy(CountingLLM):
        def generate(self, prompts, sampling_params=None, use_tqdm=True):
            if sampling_params.temperature == 0.0:
                raise RuntimeError("greedy kernel missing")
            return super().generate(prompts, sampling_params, use_tqdm)

    monkeypatch.setattr(vllm, "LLM", FailsGreedy)
    res = tmp_path / "r.json"
    assert offline_child.main([_also_greedy_spec(tmp_path, "kog", ckpt_dirs["tiny-llama"]), str(res)]) == 0
    data = json.loads(res.read_text())
    assert data["row"]["ok"] is True and data["row"]["counters"][0]["kog_tokens"] == 200
    assert data["greedy_row"]["ok"] is False
    assert data["greedy_row"]["error"] == "greedy rounds: RuntimeError: greedy kernel missing"


def test_child_without_also_greedy_writes_no_greedy_row(tmp_path, fake_engine, ckpt_dirs):  # noqa: F811
    res = tmp_path / "r.json"
    assert offline_child.main([_spec(tmp_path, "kog", ckpt_dirs["tiny-llama"], overrides={}), str(res)]) == 0
    assert "greedy_row" not in json.loads(res.read_text())


# ---- the command, with the engine processes faked ------------------------------------------------------------

PER_TOKEN_S = {  # (impl, greedy) -> seconds per decoded token of the fake engines
    ("stock", False): 0.0021, ("kog", False): 0.00084, ("stock", True): 0.0020, ("kog", True): 0.0008,
}


def _fake_child_also_greedy(greedy_kog_tokens: int | None = None, greedy_tokens_differ: bool = False):
    """offline.run_child's stand-in: both rows of an also_greedy spec with its own timings and counters."""
    calls = []

    def rows(spec, greedy: bool) -> RunResult:
        n, impl = spec["new_tokens"], spec["impl"]
        sub = dict(spec, sampling_overrides=greedy_rounds.greedy_overrides(spec["sampling_overrides"])) if greedy else spec
        ids = [(7 * i) % 1000 for i in range(n + 1)] if greedy else [(11 * i + len(impl)) % 1000 for i in range(n + 1)]
        if greedy and impl == "kog" and greedy_tokens_differ:
            ids[9] += 1
        row = RunResult(impl=impl, ok=True, copy_gbps=4290.0, times_one_s=[0.02] * spec["reps"],
                        times_full_s=[0.02 + PER_TOKEN_S[impl, greedy] * n] * spec["reps"], output_token_ids=ids,
                        generated_tokens=n + 1, sampling=_engine_sampling(sub, LLAMA_GEN))
        if impl == "kog":
            decoded = (spec["warmup"] + spec["reps"]) * n
            tokens = decoded if not greedy or greedy_kog_tokens is None else greedy_kog_tokens
            row.counters = [{"kog_steps": -(-tokens // 4), "kog_tokens": tokens, "fallbacks": {}}]
        return row

    def run_child(spec, out_dir, tag, timeout_s, verbose):
        calls.append(spec)
        greedy = rows(spec, True) if spec.get("also_greedy") else None
        return offline.ChildResult(rows(spec, False), {"gpu": "FakeGPU", "gpu_count": 1, "driver": "1.0"}, greedy)

    return run_child, calls


def _args(tmp_path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    return p.parse_args([*argv, "--out", str(tmp_path / "out")])


def test_command_also_greedy_rows_ratio_and_json(tmp_path, monkeypatch, capsys):
    ckpt = _ckpt(tmp_path)
    run_child, calls = _fake_child_also_greedy()
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--new-tokens", "64", "--no-chart", "--also-greedy")) == 0
    assert [c["impl"] for c in calls] == ["stock", "kog"]  # two engine starts, not three
    assert all(c["also_greedy"] and c["sampling_overrides"] == {} for c in calls)
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert rep.settings["also_greedy"] is True
    assert [m.model for m in rep.models] == ["ckpt", "ckpt greedy"]
    sampled, greedy = rep.models
    assert (sampled.greedy_of, greedy.greedy_of) == (None, "ckpt")
    assert sampled.row("kog").ms_per_token == pytest.approx(0.84) and greedy.row("kog").ms_per_token == pytest.approx(0.8)
    assert greedy.row("stock").ms_per_token == pytest.approx(2.0)
    assert greedy.speedup == pytest.approx(2.5) and sampled.speedup == pytest.approx(2.1 / 0.84)
    assert sampled.sampled_kog_of_greedy == pytest.approx(0.8 / 0.84)
    assert greedy.row("kog").bw_share == pytest.approx(greedy.row("kog").gbps / 4290.0)
    # greedy: stock's tokens against kog's; sampled: not compared
    assert greedy.tokens_match is True and sampled.tokens_match is None
    assert greedy.sampling["params"]["temperature"] == 0.0 and sampled.sampling["params"]["temperature"] == 0.6
    out = capsys.readouterr().out
    lines = out.splitlines()
    greedy_kog = next(l for l in lines if l.startswith("ckpt greedy") and " kog " in l)
    assert "1250.0" in greedy_kog and "2.50x" in greedy_kog and greedy_kog.split()[-2] == "64"  # kog steps: 4 rounds x 64 / 4
    assert f"sampled kog / greedy kog, ckpt: {100 * 0.8 / 0.84:.1f}% (1190.5 / 1250.0 tok/s, same engine process)" in out
    assert "sampling: model generation config: temperature 0.6, top_p 0.9; unseeded" in out
    assert ('also greedy (--also-greedy): each engine then timed the same rounds again in the same process, '
            'sampling: greedy; rows "<model> greedy"') in out
    assert "ckpt greedy: vLLM max_model_len" not in out  # one line per model, the greedy rows share it


def test_command_also_greedy_counters_are_each_rows_own(tmp_path, monkeypatch, capsys):
    """The greedy kog row judged on its own counters: a greedy kog path that ran half the tokens warns on that row
    only; one that never ran fails the run even though the sampled row did run kog."""
    ckpt = _ckpt(tmp_path)
    run_child, _ = _fake_child_also_greedy(greedy_kog_tokens=4 * 64 // 2, greedy_tokens_differ=True)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--new-tokens", "64", "--no-chart", "--also-greedy")) == 0
    out = capsys.readouterr().out
    assert "! ckpt greedy kog: only 50% of decoded tokens ran on the kog path" in out
    assert "! ckpt kog:" not in out
    assert "ckpt greedy: kog's greedy tokens differ from stock's from position 9" in out
    run_child, _ = _fake_child_also_greedy(greedy_kog_tokens=0)
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--new-tokens", "64", "--no-chart", "--also-greedy")) == 1
    assert "! ckpt greedy kog: kog steps = 0" in capsys.readouterr().out


def test_command_also_greedy_with_a_failed_engine(tmp_path, monkeypatch, capsys):
    ckpt = _ckpt(tmp_path)

    def run_child(spec, out_dir, tag, timeout_s, verbose):
        if spec["impl"] == "kog":  # what offline.run_child reports for an engine process that wrote nothing
            err = RunResult(impl="kog", ok=False, error=f"{tag} exited with status 1 before writing a result")
            return offline.ChildResult(err, {}, RunResult(impl="kog", ok=False, error=f"{tag}: no greedy rounds (...)"))
        return _fake_child_also_greedy()[0](spec, out_dir, tag, timeout_s, verbose)

    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--model", ckpt, "--new-tokens", "64", "--no-chart", "--also-greedy")) == 1
    out = capsys.readouterr().out
    assert "sampled kog / greedy kog, ckpt: - (a kog row is missing or failed)" in out
    rep = BenchReport.load(str(tmp_path / "out" / "bench.json"))
    assert rep.models[0].sampled_kog_of_greedy is None and not rep.models[1].row("kog").ok


def test_command_also_greedy_only_stock(tmp_path, monkeypatch, capsys):
    run_child, calls = _fake_child_also_greedy()
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--model", _ckpt(tmp_path), "--new-tokens", "64", "--no-chart", "--also-greedy", "--only", "stock")
    assert bench_cmd.run(args) == 0
    out = capsys.readouterr().out
    assert [c["impl"] for c in calls] == ["stock"] and "ckpt greedy  stock" in out
    assert "sampled kog / greedy kog" not in out


@pytest.mark.parametrize("argv,message", [
    (["--greedy"], "greedy already"),
    (["--temperature", "0"], "greedy already"),
    (["--url", "http://127.0.0.1:1"], "does not take --url"),
])
def test_command_refuses_also_greedy_where_it_means_nothing(tmp_path, monkeypatch, capsys, argv, message):
    run_child, calls = _fake_child_also_greedy()
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(_args(tmp_path, "--also-greedy", *argv)) == 2
    assert message in capsys.readouterr().err and not calls


def test_sweep_with_also_greedy(tmp_path, monkeypatch, capsys):
    from kog_backend.tools.bench.sweep import SweepReport

    ckpt = _ckpt(tmp_path)
    run_child, calls = _fake_child_also_greedy()
    monkeypatch.setattr(offline, "run_child", run_child)
    args = _args(tmp_path, "--model", ckpt, "--prompt-lens", "32,64", "--new-tokens", "64", "--no-chart", "--also-greedy")
    assert bench_cmd.run(args) == 0
    assert len(calls) == 4 and all(c["also_greedy"] for c in calls)
    sweep = SweepReport.load(str(tmp_path / "out" / "sweep.json"))
    assert sorted(sweep.by_model()) == ["ckpt", "ckpt greedy"]
    out = capsys.readouterr().out
    assert f"sampled kog / greedy kog, ckpt prompt 32: {100 * 0.8 / 0.84:.1f}%" in out
    assert next(l for l in out.splitlines() if l.startswith("ckpt greedy") and " 64 " in l)
    # The same sweep again: both lengths (with their greedy rows) are reused, no engine runs.
    run_child, calls = _fake_child_also_greedy()
    monkeypatch.setattr(offline, "run_child", run_child)
    assert bench_cmd.run(args) == 0 and not calls
    assert "prompt 64 tokens: reusing" in capsys.readouterr().err


# ---- the report: table, JSON, old files -------------------------------------------------------------------------


def also_greedy_report() -> BenchReport:
    """fake_report's llama-3.2-1b sampled (generation config), with its greedy rounds."""
    rep = fake_report()
    rep.models.pop()  # the qwen model with a failed row
    sampled = rep.models[0]
    sampled.tokens_match = None
    gen = {"temperature": 0.6, "top_p": 0.9}
    sampled.sampling = {"params": {"temperature": 0.6, "top_p": 0.9, "top_k": 0, "min_p": 0.0}, "seed": None,
                        "generation_config": gen}
    greedy = greedy_rounds.greedy_model(sampled)
    for r in sampled.rows:
        g = RunResult(**{**r.__dict__, "tok_s": r.tok_s * 1.04, "ms_per_token": r.ms_per_token / 1.04, "warnings": []})
        if g.counters:
            g.counters = [dict(g.counters[0], kog_steps=2040)]
        greedy.rows.append(g)
    greedy.speedup = greedy.row("kog").tok_s / greedy.row("stock").tok_s
    greedy.tokens_match = True
    greedy.sampling = {"params": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}, "seed": None,
                       "generation_config": gen}
    sampled.sampled_kog_of_greedy = greedy_rounds.kog_of_greedy(sampled, greedy)
    rep.models.append(greedy)
    rep.settings = {"prompt_len": 32, "new_tokens": 512, "tokens_per_step": 32, "tp": 1, "reps": 3, "warmup": 1,
                    "stat": "best", "also_greedy": True, "sampling": {"greedy": False, "overrides": {}, "seed": None}}
    return rep


def test_table_of_an_also_greedy_report():
    rep = also_greedy_report()
    text = format_table(rep)
    lines = text.splitlines()
    sampled, greedy = rep.models
    g_kog = next(l for l in lines if l.startswith("llama-3.2-1b greedy") and " kog " in l)
    assert f"{greedy.row('kog').tok_s:.1f}" in g_kog and "2040" in g_kog and f"{greedy.speedup:.2f}x" in g_kog
    s_kog = next(l for l in lines if l.startswith("llama-3.2-1b ") and " kog " in l and "greedy" not in l)
    assert "2048" in s_kog
    assert f"sampled kog / greedy kog, llama-3.2-1b: {100 / 1.04:.1f}%" in text
    assert sampled.sampled_kog_of_greedy == pytest.approx(1 / 1.04)
    assert "sampling: model generation config: temperature 0.6, top_p 0.9; unseeded" in lines  # one line: the request's


def test_also_greedy_json_round_trip_and_readers(tmp_path):
    from test_bench_writers import _render_module

    rep = also_greedy_report()
    path = str(tmp_path / "bench.json")
    rep.save(path)
    back = BenchReport.load(path)
    assert back == rep and back.models[1].greedy_of == "llama-3.2-1b"
    assert json.load(open(path))["models"][0]["sampled_kog_of_greedy"] == pytest.approx(1 / 1.04)
    text = _render_module().render([path], str(tmp_path / "performance.md"))
    assert "**llama-3.2-1b greedy**" in text and f"Sampled kog: {100 / 1.04:.1f}% of greedy kog" in text
    from kog_backend.tools.bench.chart import write_chart

    assert os.path.getsize(write_chart(back, str(tmp_path / "bench.png"))) > 5000


def test_json_written_before_also_greedy_still_loads(tmp_path):
    d = fake_report().to_dict()
    for m in d["models"]:
        del m["greedy_of"], m["sampled_kog_of_greedy"]
    rep = BenchReport.from_dict(d)
    assert all(m.greedy_of is None and m.sampled_kog_of_greedy is None for m in rep.models)
    text = format_table(rep)
    assert "sampled kog / greedy kog" not in text and "also greedy" not in text


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "benchmarks", "results", "*", "bench.json"))))
def test_the_cited_bench_json_files_load_and_print(path):
    """Every result the docs cite loads; its table has the sampled / greedy line exactly when it has greedy rows."""
    rep = BenchReport.load(path)
    assert rep.models
    has_greedy = any(m.greedy_of is not None for m in rep.models)
    assert ("sampled kog / greedy kog" in format_table(rep)) == has_greedy

