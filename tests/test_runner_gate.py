"""The runner's side of the gate, host state only (no vLLM model runner behind it): the step gate gets the prompt
lengths the runner recorded, bursts are capped at the tested context range, and a KV cache of a layout the kernel
does not know turns kog off with its reason at start."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from gate_inputs import decode_at

from kog_backend.config import KogConfig
from kog_backend.engine import runner as runner_mod
from kog_backend.engine.kog_request import KogRequest
from kog_backend.engine.runner import KogModelRunner
from kog_backend.engine.tokens_per_step import burst_max_len
from kog_backend.path import gate
from kog_backend.path.counters import StepCounters
from kog_backend.path.eligibility import MAX_TESTED_CONTEXT, STEP_REASONS


class _EngineConfig:
    """Stands in for the engine's VllmConfig."""


def _runner(tmp_path, max_model_len: int = 4096) -> KogModelRunner:
    r = object.__new__(KogModelRunner)
    r.vllm_config = _EngineConfig()
    r.device = torch.device("cpu")
    r.kog_config = KogConfig()
    r.kog_counters = StepCounters(path=str(tmp_path / "stats-1-rank0.json"))
    r.max_model_len = max_model_len
    r.model_config = SimpleNamespace(get_vocab_size=lambda: 1000)
    r.sampler = SimpleNamespace()
    r._kog_tokens_per_step = 32
    r._kog_timeline = None
    r._kog_monokernel = None
    r._kog_torch = None
    r._kog_requests = {"a": KogRequest(reason=None, single_token=None, sampling=None, prompt_len=10,
                                       max_tokens=10**6, stop_ids=())}
    return r


def _step(position: int, outputs: int):
    return decode_at(position, outputs)


@pytest.mark.parametrize(
    "position,outputs,want",
    [
        (9, 0, None),  # the prompt's last token: a last prefill chunk of one token
        (4, 0, STEP_REASONS["prefill"]),  # a one-token chunk inside the prompt (prompt_len 10, as recorded)
        (20, 11, None),
        (MAX_TESTED_CONTEXT, MAX_TESTED_CONTEXT - 9, STEP_REASONS["long_context"]),
    ],
)
def test_step_reason_uses_the_recorded_prompt_length(tmp_path, position, outputs, want):
    assert _runner(tmp_path)._kog_step_reason(_step(position, outputs)) == want


@pytest.mark.parametrize("max_model_len,want", [(4096, 4096), (MAX_TESTED_CONTEXT, MAX_TESTED_CONTEXT),
                                                (4 * MAX_TESTED_CONTEXT, MAX_TESTED_CONTEXT + 1)])
def test_bursts_are_capped_at_the_tested_range(tmp_path, max_model_len, want):
    assert burst_max_len(max_model_len) == want
    # The runner's burst from position p makes k tokens, the last at p + k - 1 <= want - 2 (burst_length's cap).
    r = _runner(tmp_path, max_model_len)
    for p in (want - 40, want - 5, want - 2):
        k = r._kog_burst_length(r._kog_requests["a"], p, slots=10**9)  # slots never the limit here
        assert k == min(32, want - 1 - p), (p, k)


@pytest.mark.parametrize("slots,want", [(200, 32), (132, 32), (131, 31), (102, 2), (101, 1)])
def test_bursts_stay_inside_the_slots_the_request_holds(tmp_path, slots, want):
    # Position 100: slots 132 are positions 100..131, a full burst; fewer slots cut it (a request waiting for KV
    # blocks means kog's scheduler reserved no look-ahead); one slot makes a counted single-token step.
    r = _runner(tmp_path)
    assert r._kog_burst_length(r._kog_requests["a"], 100, slots) == want
    single = r.kog_counters.snapshot()["single_token_steps"]
    assert single == ({gate.BURST_REASONS["kv_slots"]: 1} if want == 1 else {})


def _with_caches(tmp_path, monkeypatch, caches):
    """A runner whose model's layers hold `caches`, initialize_kv_cache's vLLM part and impl selection skipped."""
    r = _runner(tmp_path)
    layers = [SimpleNamespace(self_attn=SimpleNamespace(attn=SimpleNamespace(kv_cache=c))) for c in caches]
    r.model = SimpleNamespace(model=SimpleNamespace(layers=layers))
    r.kv_cache_config = SimpleNamespace(kv_cache_groups=[object()])
    r._kog_weights = SimpleNamespace(shape=SimpleNamespace(head_dim=128, tp_size=1))
    r._kog_kv_caches = []
    monkeypatch.setattr(runner_mod.GPUModelRunnerV2, "initialize_kv_cache", lambda self, cfg: None)
    monkeypatch.setattr(runner_mod, "select_step", lambda torch_step, *a: torch_step)  # the torch step
    r.initialize_kv_cache(None)
    return r


def _nhd(block: int) -> torch.Tensor:
    return torch.empty(8, block, 2, 256, dtype=torch.bfloat16, device="meta").permute(0, 2, 1, 3)


def test_known_kv_layout_keeps_kog_on(tmp_path, monkeypatch):
    r = _with_caches(tmp_path, monkeypatch, [_nhd(16), _nhd(16)])
    assert r.kog_disabled_reason is None and len(r._kog_kv_caches) == 2
    assert r._kog_torch.kv_caches == r._kog_kv_caches and r._kog_monokernel is None


@pytest.mark.parametrize("bad,needle", [(_nhd(8), "block size 8"),
                                        (torch.empty(8, 256, 16, 2, dtype=torch.bfloat16, device="meta").permute(0, 3, 2, 1),
                                         "not contiguous")])
def test_unknown_kv_layout_turns_kog_off_with_its_reason(tmp_path, monkeypatch, bad, needle):
    r = _with_caches(tmp_path, monkeypatch, [_nhd(16), bad])
    assert r.kog_disabled_reason is not None
    assert needle in r.kog_disabled_reason and r._kog_kv_caches == [] and r._kog_torch is None
