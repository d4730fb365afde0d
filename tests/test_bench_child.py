"""The engine process of `kog bench` (offline_child.py) with vLLM's LLM, the GPU probe and the copy
measurement replaced by fakes: the timed rounds, the result file, the counters and the progress protocol."""

from __future__ import annotations

import json
import os
import time
import types

import pytest

from kog_backend.bench import offline, offline_child
from kog_backend.bench.results import RunResult
from kog_backend.config import WORKER_CLS

PER_TOKEN_S = 0.0004


class FakeLLM:
    instances: list["FakeLLM"] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []
        FakeLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        n = sampling_params.max_tokens
        self.calls.append((list(prompts[0]["prompt_token_ids"]), n, sampling_params))
        time.sleep(0.002 + PER_TOKEN_S * n)
        out = types.SimpleNamespace(token_ids=[(3 * i) % 97 for i in range(n)])
        return [types.SimpleNamespace(outputs=[out])]

    def collective_rpc(self, method):
        assert method == "kog_stats"
        return [{"kog_steps": 12, "kog_tokens": 96, "fallback_steps": 3, "fallbacks": {"prefill": 3}, "disabled_reason": None}]


@pytest.fixture
def fake_engine(monkeypatch):
    import vllm

    from kog_backend.bench import copy_bw, environment

    FakeLLM.instances.clear()
    monkeypatch.setattr(vllm, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(environment, "gpu_host_info", lambda: {"gpu": "FakeGPU", "gpu_count": 1, "driver": "1"})
    monkeypatch.setattr(copy_bw, "measure_copy_bandwidth", lambda: (4.0e12, [0.0021, 0.0020]))
    return FakeLLM


def _spec(tmp_path, impl: str) -> str:
    spec = {
        "impl": impl, "model_path": "/ckpt", "prompt_token_ids": [5, 6, 7, 8], "max_model_len": 336,
        "new_tokens": 40, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "sampling_seed": None, "tp": 1,
        "reps": 3, "warmup": 2, "tokens_per_step": 8, "kog_options": {}, "engine_args": {},
    }
    path = tmp_path / f"{impl}.spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.parametrize("impl", ["stock", "kog"])
def test_child_rounds_and_result(tmp_path, fake_engine, impl):
    rfd, wfd = os.pipe()
    res = tmp_path / "r.json"
    assert offline_child.main([_spec(tmp_path, impl), str(res), "--progress-fd", str(wfd)]) == 0
    progress = os.read(rfd, 65536).decode().splitlines()
    os.close(rfd)
    assert progress[0] == "total 7"  # copy, engine start, 2 warm-up, 3 reps
    assert progress[1:] == ["step copy bandwidth", "step engine up", "step warm-up 1", "step warm-up 2",
                            "step rep 1", "step rep 2", "step rep 3", "done"]
    data = json.loads(res.read_text())
    assert data["host"]["gpu"] == "FakeGPU"
    row = RunResult.from_dict(data["row"])
    assert row.ok and row.copy_gbps == pytest.approx(4000.0) and row.load_s is not None
    assert len(row.times_one_s) == len(row.times_full_s) == 3
    assert all(f > o for f, o in zip(row.times_full_s, row.times_one_s))
    assert row.generated_tokens == 41 and row.warnings == []
    (llm,) = fake_engine.instances
    # 5 rounds of (1-token call, 41-token call), all on the spec's prompt
    assert [n for _, n, _ in llm.calls] == [1, 41] * 5
    assert all(p == [5, 6, 7, 8] for p, _, _ in llm.calls)
    sp = llm.calls[1][2]
    assert sp.ignore_eos and sp.temperature == 0.0
    if impl == "kog":
        assert llm.kwargs["worker_cls"] == WORKER_CLS
        assert llm.kwargs["additional_config"] == {"kog": {"tokens_per_step": 8}}
        assert row.counters[0]["kog_steps"] == 12
    else:
        assert "worker_cls" not in llm.kwargs and row.counters is None
    # the parent's arithmetic on the child's timings
    s = offline.Settings(models=["m"], new_tokens=40, reps=3, warmup=2)
    fin = offline.finalize_row(row, s, 1e9)
    assert fin.ms_per_token == pytest.approx(PER_TOKEN_S * 1e3, rel=0.5)


def test_child_reports_a_failing_engine(tmp_path, fake_engine, monkeypatch):
    def boom(**kwargs):
        raise RuntimeError("CUDA out of memory")

    import vllm

    monkeypatch.setattr(vllm, "LLM", boom)
    res = tmp_path / "r.json"
    assert offline_child.main([_spec(tmp_path, "kog"), str(res)]) == 1
    data = json.loads(res.read_text())
    assert data["row"]["ok"] is False and data["row"]["error"] == "RuntimeError: CUDA out of memory"
    assert data["host"]["gpu"] == "FakeGPU"  # the machine is still reported


def test_child_process_without_gpu(tmp_path):
    """The real child in its own process, as `kog bench` starts it: on a machine without a GPU it reports
    that cleanly and the parent turns it into a failed row."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    spec = json.loads(open(_spec(tmp_path, "stock")).read())
    row, host = offline.run_child(spec, str(tmp_path), "m-stock", timeout_s=120, verbose=False)
    assert not row.ok and "no CUDA GPU" in row.error
    assert host.get("gpu_count") == 0
    assert (tmp_path / "logs" / "m-stock.log").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["hang_after_result", "hang_before_result"])
def test_run_child_ends_a_hanging_engine_and_its_group(tmp_path, monkeypatch, mode):
    monkeypatch.setattr(offline, "CHILD_MODULE", "bench_hanging_child")
    monkeypatch.setattr(offline, "EXIT_GRACE_S", 1.0)
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.abspath(__file__)))
    t0 = time.monotonic()
    row, _ = offline.run_child({"impl": "kog", "mode": mode}, str(tmp_path), "m-kog", timeout_s=8.0, verbose=False)
    took = time.monotonic() - t0
    pids = json.loads((tmp_path / "logs" / "m-kog.result.json.pids").read_text())
    if mode == "hang_after_result":
        assert row.ok and took < 6 and any("did not exit" in w for w in row.warnings)
    else:
        assert not row.ok and "timed out after 8 s" in row.error and took >= 8
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
