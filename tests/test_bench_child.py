"""The engine process of `kog bench` (offline_child.py) with vLLM's LLM, the GPU probe and the copy
measurement replaced by fakes: the timed rounds, the result file, the counters and the progress protocol."""

from __future__ import annotations

import json
import os
import time
import types

import pytest

from kog_backend.tools.bench import offline, offline_child
from kog_backend.tools.bench.results import RunResult
from kog_backend.config import WORKER_CLS

PER_TOKEN_S = 0.0004


class FakeLLM:
    """vllm.LLM without an engine: generate is faked; the default sampling parameters are vLLM's own
    (`LLM.get_default_sampling_params` on a real ModelConfig of the checkpoint directory)."""

    instances: list["FakeLLM"] = []
    get_default_sampling_params = None  # vllm.LLM's, set by the fixture

    def __init__(self, **kwargs):
        from vllm.config import ModelConfig

        self.kwargs = kwargs
        self.calls = []
        self.model_config = ModelConfig(model=kwargs["model"], skip_tokenizer_init=True)
        self.default_sampling_params = None
        FakeLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        n = sampling_params.max_tokens
        self.calls.append((list(prompts[0]["prompt_token_ids"]), n, sampling_params))
        time.sleep(0.002 + PER_TOKEN_S * n)
        out = types.SimpleNamespace(token_ids=[(3 * i) % 97 for i in range(n)])
        return [types.SimpleNamespace(outputs=[out])]

    def collective_rpc(self, method):
        """A kog worker's cumulative counters: 2 steps of the engine start (its profiling runs), then one kog step
        of 8 tokens and one prefill fallback per generate call."""
        assert method == "kog_stats"
        n = len(self.calls)
        return [{"kog_steps": 2 + n, "kog_tokens": 16 + 8 * n, "fallback_steps": n, "fallbacks": {"prefill": n},
                 "disabled_reason": None}]


@pytest.fixture
def fake_engine(monkeypatch):
    import vllm

    from kog_backend.tools.bench import copy_bw, environment

    FakeLLM.instances.clear()
    monkeypatch.setattr(FakeLLM, "get_default_sampling_params", vllm.LLM.get_default_sampling_params)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(vllm, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(environment, "gpu_host_info", lambda: {"gpu": "FakeGPU", "gpu_count": 1, "driver": "1"})
    monkeypatch.setattr(copy_bw, "measure_copy_bandwidth", lambda: (4.0e12, [0.0021, 0.0020]))
    return FakeLLM


@pytest.fixture(scope="module")
def ckpt_dirs(tmp_path_factory):
    """Checkpoint directories without weights (config, generation config, tokenizer), as make-checkpoint writes them."""
    from kog_backend.tools.fixtures import checkpoints, shapes

    root = tmp_path_factory.mktemp("meta")
    out = {}
    for name in ("tiny-llama", "tiny-qwen3"):
        checkpoints.write_metadata(str(root / name), shapes.get_shape(name), checkpoints.expected_generation_config(name))
        out[name] = str(root / name)
    return out


def _spec(tmp_path, impl: str, model_path: str = "/ckpt", overrides=None, seed=None) -> str:
    spec = {
        "impl": impl, "model_path": model_path, "prompt_token_ids": [5, 6, 7, 8], "max_model_len": 336,
        "new_tokens": 40, "sampling_overrides": {"temperature": 0.0} if overrides is None else overrides,
        "sampling_seed": seed, "tp": 1, "reps": 3, "warmup": 2, "tokens_per_step": 8, "kog_options": {}, "engine_args": {},
    }
    path = tmp_path / f"{impl}.spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.parametrize("impl", ["stock", "kog"])
def test_child_rounds_and_result(tmp_path, fake_engine, ckpt_dirs, impl):
    rfd, wfd = os.pipe()
    res = tmp_path / "r.json"
    assert offline_child.main([_spec(tmp_path, impl, ckpt_dirs["tiny-llama"]), str(res), "--progress-fd", str(wfd)]) == 0
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
    assert sp.ignore_eos and sp.temperature == 0.0 and sp.top_p == 1.0  # greedy: vLLM drops the config's top-p
    assert row.sampling["params"]["temperature"] == 0.0 and row.sampling["seed"] is None
    if impl == "kog":
        assert llm.kwargs["worker_cls"] == WORKER_CLS
        assert llm.kwargs["additional_config"] == {"kog": {"tokens_per_step": 8}}
        # the rounds' own 10 calls, not the engine start's 2 steps
        assert row.counters[0]["kog_steps"] == 10 and row.counters[0]["fallbacks"] == {"prefill": 10}
    else:
        assert "worker_cls" not in llm.kwargs and row.counters is None
    # the parent's arithmetic on the child's timings
    s = offline.Settings(models=["m"], new_tokens=40, reps=3, warmup=2)
    fin = offline.finalize_row(row, s, 1e9)
    assert fin.ms_per_token == pytest.approx(PER_TOKEN_S * 1e3, rel=0.5)


# (family, overrides, seed) -> the SamplingParams fields of every timed call
SAMPLING_CASES = [
    # nothing set: what vLLM gives a request that sets nothing, the model's generation config
    ("tiny-llama", {}, None, dict(temperature=0.6, top_p=0.9, top_k=0, min_p=0.0)),
    ("tiny-qwen3", {}, None, dict(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0)),
    # --greedy: temperature 0; vLLM resets top-p / top-k
    ("tiny-qwen3", {"temperature": 0.0}, None, dict(temperature=0.0, top_p=1.0, top_k=0)),
    # explicit flags override their field only; the rest stays the generation config's
    ("tiny-qwen3", {"temperature": 0.8, "min_p": 0.05}, 7, dict(temperature=0.8, top_p=0.95, top_k=20, min_p=0.05)),
    ("tiny-llama", {"top_p": 1.0, "repetition_penalty": 1.1}, None, dict(temperature=0.6, top_p=1.0, repetition_penalty=1.1)),
]


@pytest.mark.parametrize("shape,overrides,seed,want", SAMPLING_CASES)
def test_child_sampling_is_the_generation_config_under_the_flags(tmp_path, fake_engine, ckpt_dirs, shape, overrides, seed, want):
    from kog_backend.tools.fixtures import shapes

    res = tmp_path / "r.json"
    assert offline_child.main([_spec(tmp_path, "stock", ckpt_dirs[shape], overrides, seed), str(res)]) == 0
    (llm,) = fake_engine.instances
    for _, n, sp in llm.calls:
        assert {k: getattr(sp, k) for k in want} == want and sp.seed == seed and sp.ignore_eos
    row = RunResult.from_dict(json.loads(res.read_text())["row"])
    gen = shapes.generation_config(shape)
    assert row.sampling["generation_config"] == {k: gen[k] for k in ("temperature", "top_k", "top_p") if k in gen}
    assert {k: row.sampling["params"][k] for k in want} == want and row.sampling["seed"] == seed
    if not overrides:  # nothing set: exactly LLM.generate's own default when given no SamplingParams
        default = llm.get_default_sampling_params()
        assert row.sampling["params"] == {k: getattr(default, k) for k in offline_child.FIELDS}


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
    got = offline.run_child(spec, str(tmp_path), "m-stock", timeout_s=120, verbose=False)
    row, host = got.row, got.host
    assert got.greedy_row is None and not row.ok and "no CUDA GPU" in row.error
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
    row = offline.run_child({"impl": "kog", "mode": mode}, str(tmp_path), "m-kog", timeout_s=8.0, verbose=False).row
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
