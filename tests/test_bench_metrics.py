"""`kog bench` arithmetic: ms/token, bandwidth, bytes per token, the derived row, the engine arguments."""

from __future__ import annotations

import json
import os
import types

import pytest

from kog_backend.tools.fixtures import shapes
from kog_backend.tools.bench import metrics, model_bytes, offline
from kog_backend.tools.bench.offline_child import engine_kwargs, sampling_kwargs
from kog_backend.tools.bench.results import RunResult
from kog_backend.config import CONFIG_KEY, SCHEDULER_CLS, WORKER_CLS


def test_ms_per_token_subtracts_the_one_token_call():
    # measured-baselines.md: (T(513) - T(1)) / 512
    assert metrics.ms_per_token(1.2, 0.176, 512) == pytest.approx(2.0)
    assert metrics.tok_per_s(2.0) == pytest.approx(500.0)


@pytest.mark.parametrize("t_full,t_one,n", [(0.1, 0.1, 512), (0.05, 0.1, 512), (1.0, 0.1, 0)])
def test_ms_per_token_rejects_unusable_timings(t_full, t_one, n):
    with pytest.raises(ValueError):
        metrics.ms_per_token(t_full, t_one, n)


def test_reduce_times():
    assert metrics.reduce_times([3.0, 1.0, 2.0, 10.0], "best") == 1.0
    assert metrics.reduce_times([3.0, 1.0, 2.0, 10.0], "median") == 2.5
    with pytest.raises(ValueError):
        metrics.reduce_times([1.0], "mean")
    with pytest.raises(ValueError):
        metrics.reduce_times([], "best")


def test_copy_bandwidth_counts_read_and_write():
    # measured-baselines.md: 4 GiB in 2.00 ms is 4.29 TB/s counting bytes read plus written
    assert metrics.copy_bandwidth(4 * 2**30, 2.0e-3) / 1e12 == pytest.approx(4.295, abs=1e-3)


def test_floor_and_share_match_the_measured_baselines():
    cfg = shapes.get_shape("llama-3.2-1b")
    w = model_bytes.weight_bytes_per_token(cfg)
    assert w / 1e9 == pytest.approx(2.47, abs=0.005)
    copy = 4.29e12
    assert metrics.floor_tok_per_s(w, copy) == pytest.approx(1740, rel=0.01)  # "0.575 ms = 1,740 tok/s"
    # stock default 499 tok/s is about 29% of the floor; stock best 580 tok/s "33%"
    achieved = metrics.achieved_bytes_per_s(w, 580.0)
    assert metrics.share_of_copy(achieved, copy) == pytest.approx(0.334, abs=0.005)
    # TP shards the weights: two GPUs double the ceiling
    assert metrics.share_of_copy(achieved, copy, num_gpus=2) == pytest.approx(0.167, abs=0.003)
    assert metrics.floor_tok_per_s(w, copy, num_gpus=2) == pytest.approx(3480, rel=0.01)


def test_speedup():
    assert metrics.speedup(1300.0, 500.0) == pytest.approx(2.6)
    assert metrics.speedup(None, 500.0) is None
    assert metrics.speedup(1300.0, 0.0) is None


@pytest.mark.parametrize("name,gb", [("llama-3.2-1b", 2.47), ("qwen3-1.7b", 3.44)])
def test_weight_bytes_agree_with_shapes(name, gb):
    cfg = shapes.get_shape(name)
    assert model_bytes.weight_bytes_per_token(cfg) == shapes.weight_bytes_per_token(name)
    assert model_bytes.weight_bytes_per_token(cfg) / 1e9 == pytest.approx(gb, abs=0.005)


def test_model_bytes_fill_hugging_face_defaults():
    full = shapes.get_shape("llama-3.1-8b")
    sparse = {k: v for k, v in full.items() if k not in ("head_dim", "tie_word_embeddings")}
    assert model_bytes.weight_bytes_per_token(sparse) == model_bytes.weight_bytes_per_token(full)
    mha = dict(full)
    del mha["num_key_value_heads"]  # HF default: as many KV heads as query heads
    assert model_bytes.kv_bytes_per_position(mha) == 4 * model_bytes.kv_bytes_per_position(full)
    fp32 = dict(full, torch_dtype="float32")
    assert model_bytes.weight_bytes_per_token(fp32) == 2 * model_bytes.weight_bytes_per_token(full)


def test_kv_bytes():
    cfg = shapes.get_shape("llama-3.2-1b")
    per_pos = 2 * 16 * 8 * 64 * 2  # K and V, 16 layers, 8 KV heads x 64, bf16
    assert model_bytes.kv_bytes_per_position(cfg) == per_pos
    # decode steps read 33, 34, ..., 544 positions after a 32-token prompt: mean 288.5
    assert model_bytes.mean_kv_bytes_per_token(cfg, 32, 512) == pytest.approx(per_pos * 288.5)
    assert model_bytes.mean_kv_bytes_per_token(cfg, 32, 512) == pytest.approx(per_pos * sum(range(33, 545)) / 512)


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen3-1.7b", "llama-3.1-8b"])
def test_kernel_benches_count_kv_bytes_as_kog_bench_does(name):
    # bench_monokernel.py / bench_tp_monokernel.py count K/V through DecoderShape, kog bench through the config.
    from kog_backend.monokernel import synthetic

    s = synthetic.make_shape(*synthetic.SHAPES[name])
    assert s.kv_bytes_per_position == model_bytes.kv_bytes_per_position(shapes.get_shape(name))
    half = synthetic.make_shape(*synthetic.SHAPES[name][:4], s.num_kv_heads // 2, *synthetic.SHAPES[name][5:])
    assert 2 * half.kv_bytes_per_position == s.kv_bytes_per_position  # a TP-2 rank holds half the KV heads


def _settings(**kw) -> offline.Settings:
    return offline.Settings(models=["x"], **kw)


def _timed_row(impl: str, **kw) -> RunResult:
    return RunResult(
        impl=impl, ok=True, times_one_s=[0.030, 0.025, 0.028], times_full_s=[1.050, 1.029, 1.040], copy_gbps=4290.0, **kw
    )


def test_finalize_row_best():
    s = _settings(new_tokens=512, stat="best")
    bpt = 2.48e9
    r = offline.finalize_row(_timed_row("stock"), s, bpt)
    ms = (1.029 - 0.025) / 512 * 1e3
    assert r.ms_per_token == pytest.approx(ms)
    assert r.tok_s == pytest.approx(1e3 / ms)
    assert r.ttft_ms == pytest.approx(25.0)
    assert r.gbps == pytest.approx(bpt * r.tok_s / 1e9)
    assert r.bw_share == pytest.approx(r.gbps / 4290.0)
    assert r.floor_tok_s == pytest.approx(4290e9 / bpt)
    assert r.warnings == []


def test_finalize_row_median_and_tp():
    s = _settings(new_tokens=512, stat="median", tp=2)
    r = offline.finalize_row(_timed_row("stock"), s, 2.48e9)
    assert r.ms_per_token == pytest.approx((1.040 - 0.028) / 512 * 1e3)
    assert r.bw_share == pytest.approx(r.gbps / (2 * 4290.0))


def test_finalize_row_unusable_timings_fail_the_row():
    row = RunResult(impl="stock", ok=True, times_one_s=[1.0], times_full_s=[0.5])
    r = offline.finalize_row(row, _settings(), 1e9)
    assert not r.ok and "timings unusable" in r.error


def test_finalize_kog_row_without_kog_steps_warns():
    counters = [{"kog_steps": 0, "kog_tokens": 0, "fallback_steps": 9, "fallbacks": {"prefill": 9}, "disabled_reason": "no CUDA GPU"}]
    r = offline.finalize_row(_timed_row("kog", counters=counters), _settings(), 2.48e9)
    assert r.ok
    assert any("kog steps = 0" in w and "no CUDA GPU" in w and "prefill x9" in w for w in r.warnings)
    assert r.kog_token_share == 0.0


def test_finalize_kog_row_token_share():
    s = _settings(new_tokens=512, warmup=1, reps=3)
    full = [{"kog_steps": 4 * 512, "kog_tokens": 4 * 512, "fallbacks": {}}]
    r = offline.finalize_row(_timed_row("kog", counters=full), s, 2.48e9)
    assert r.kog_token_share == pytest.approx(1.0) and r.warnings == []
    part = [{"kog_steps": 1000, "kog_tokens": 1000, "fallbacks": {"batch of several requests": 5}}]
    r = offline.finalize_row(_timed_row("kog", counters=part), s, 2.48e9)
    assert any("49% of decoded tokens" in w for w in r.warnings)


def test_compare_tokens():
    a = RunResult(impl="stock", ok=True, output_token_ids=[1, 2, 3, 4])
    assert offline.compare_tokens(a, RunResult(impl="kog", ok=True, output_token_ids=[1, 2, 3, 4])) == (True, None)
    assert offline.compare_tokens(a, RunResult(impl="kog", ok=True, output_token_ids=[1, 2, 9, 4])) == (False, 2)
    assert offline.compare_tokens(a, RunResult(impl="kog", ok=True, output_token_ids=[1, 2, 3])) == (False, 3)
    assert offline.compare_tokens(a, RunResult(impl="kog", ok=False)) == (None, None)


def test_prompt_token_ids():
    ids = offline.prompt_token_ids(128256, 32, seed=0)
    assert ids == offline.prompt_token_ids(128256, 32, seed=0) and len(ids) == 32
    assert max(ids) < offline.PROMPT_ID_LIMIT and ids != offline.prompt_token_ids(128256, 32, seed=1)
    assert max(offline.prompt_token_ids(300, 1000)) < 300


def test_max_model_len():
    cfg = shapes.get_shape("tiny-llama")
    n = offline.max_model_len(cfg, _settings(prompt_len=32, new_tokens=512))
    assert n >= 32 + 513 and n % 16 == 0
    with pytest.raises(ValueError):
        offline.max_model_len(dict(cfg, max_position_embeddings=100), _settings(prompt_len=32, new_tokens=512))


def _spec(impl: str, **kw) -> dict:
    spec = {"impl": impl, "model_path": "/ckpt", "tp": 1, "max_model_len": 816, "sampling_overrides": {}}
    spec.update(kw)
    return spec


def test_engine_kwargs_differ_only_in_the_kog_selection():
    extra = {"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}, "additional_config": {"other": 1}}
    stock = engine_kwargs(_spec("stock", engine_args=extra))
    kog = engine_kwargs(_spec("kog", engine_args=extra, tokens_per_step=8, kog_options={"step_impl": "torch"}))
    assert "worker_cls" not in stock and stock["additional_config"] == {"other": 1}
    assert kog["worker_cls"] == WORKER_CLS
    assert kog["additional_config"] == {"other": 1, CONFIG_KEY: {"step_impl": "torch", "tokens_per_step": 8}}
    # K > 1 also needs kog's scheduler (what --backend kog sets); async scheduling stays vLLM's default.
    assert kog["scheduler_cls"] == SCHEDULER_CLS and "async_scheduling" not in kog
    kog_selection = ("worker_cls", "additional_config", "scheduler_cls")
    same = {k: v for k, v in kog.items() if k not in kog_selection}
    assert same == {k: v for k, v in stock.items() if k != "additional_config"}
    assert stock["enable_prefix_caching"] is False and stock["tensor_parallel_size"] == 1
    assert engine_kwargs(_spec("kog"))["additional_config"] == {CONFIG_KEY: {}}  # kog's own default K (32) ...
    assert engine_kwargs(_spec("kog"))["scheduler_cls"] == SCHEDULER_CLS  # ... which needs kog's scheduler
    one = engine_kwargs(_spec("kog", kog_options={"tokens_per_step": 1}))
    assert one["scheduler_cls"] == SCHEDULER_CLS and "async_scheduling" not in one


def test_sampling_kwargs():
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}  # vLLM's, from a generation config
    kw = sampling_kwargs(_spec("kog", sampling_overrides={"temperature": 0.8, "top_k": 50}, sampling_seed=7), 513, defaults)
    assert kw == {"max_tokens": 513, "ignore_eos": True, "temperature": 0.8, "top_p": 0.95, "top_k": 50, "min_p": 0.0,
                  "seed": 7}
    kw = sampling_kwargs(_spec("stock"), 1, defaults)
    assert "seed" not in kw and {k: kw[k] for k in defaults} == defaults


def test_resolve_model(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="neither"):
        offline.resolve_model("no-such-shape-or-dir")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json"):
        offline.resolve_model(str(empty))
    ckpt = tmp_path / "my-model"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(shapes.get_shape("tiny-llama")))
    m = offline.resolve_model(str(ckpt))
    assert (m.label, m.path, m.shape) == ("my-model", str(ckpt), None)
    # a shape whose checkpoint is complete (marker present) is used as it is
    monkeypatch.setenv("KOG_CHECKPOINT_DIR", str(tmp_path / "ckpts"))
    from kog_backend.tools.fixtures import checkpoints

    d = checkpoints.default_checkpoint_dir("tiny-llama")
    os.makedirs(d)
    with pytest.raises(ValueError, match="no current checkpoint"):
        offline.resolve_model("tiny-llama", create=False)
    marker_path = tmp_path / "ckpts" / os.path.basename(d) / checkpoints.MARKER
    current = {"format": checkpoints.MARKER_FORMAT, "shape": "tiny-llama", "seed": 0, "config": shapes.get_shape("tiny-llama"),
               "generation_config": checkpoints.expected_generation_config("tiny-llama")}
    marker_path.write_text(json.dumps(current))
    m = offline.resolve_model("tiny-llama", create=False)
    assert (m.label, m.path, m.shape) == ("tiny-llama", d, "tiny-llama")
    # A checkpoint written before its shape had a generation config is brought up to date (in a child process:
    # faked here) before any engine reads it.
    stale = dict(current)
    del stale["generation_config"]
    marker_path.write_text(json.dumps(stale))
    with pytest.raises(ValueError, match="no current checkpoint"):
        offline.resolve_model("tiny-llama", create=False)
    ran, logs = [], []

    def fake_run(cmd, **kw):
        ran.append(cmd)
        marker_path.write_text(json.dumps(current))
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(offline.subprocess, "run", fake_run)
    assert offline.resolve_model("tiny-llama", log=logs.append).path == d
    assert len(ran) == 1 and "write_checkpoint('tiny-llama'" in ran[0][-1] and "up to date" in logs[0]
