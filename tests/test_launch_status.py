"""The monokernel's launch outcome (launch_outcome.LaunchOutcome, through the runner) with a fake monokernel: a clean
launch costs a host read and nothing else; an aborted one turns kog off with the diagnostic, counts the abort, resets
the kernel's counters and sends this step and every later one down the stock path; a K = 1 step's token is dropped; a
launch the launcher refuses turns kog off on one GPU and raises under tensor parallelism."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from kog_backend.config import KogConfig
from kog_backend.engine import scheduling
from kog_backend.engine.fault_injection import FaultInjection
from kog_backend.engine.launch_outcome import LaunchOutcome
from kog_backend.engine.monokernel_step import MonokernelStep
from kog_backend.engine.runner import KogModelRunner
from kog_backend.engine.step_io import KernelLogits
from kog_backend.path.counters import StepCounters


class FakeMonokernel:
    def __init__(self, word: int = 0):
        self.status = torch.tensor([word], dtype=torch.int32)
        self.calls: list[str] = []

    def status_word(self) -> int:
        self.calls.append("status_word")
        return int(self.status[0])

    def diagnostics(self) -> str | None:
        self.calls.append("diagnostics")
        return "blocks not resident: block 3 waited over 1 ms on counter 3 (token-ready) with 66 of 132 blocks started"

    def reset_counters(self) -> None:
        self.calls.append("reset_counters")
        self.status.zero_()


class FakeRunAhead:
    def __init__(self):
        self.abandoned = 0

    def abandon(self) -> None:
        self.abandoned += 1


def _step(mk, tp_size: int = 1) -> MonokernelStep:
    cpu = torch.device("cpu")
    step = MonokernelStep(mk, cpu, vocab_size=64, block_size=16, tokens_per_step=1, max_len=4096,
                          faults=FaultInjection(KogConfig(), cpu), tp_size=tp_size)
    step.run_ahead = FakeRunAhead()
    return step


class _EngineConfig:
    """Stands in for the engine's VllmConfig (the key kog's scheduler is told of a turned-off kog by)."""


def _runner(tmp_path, mk) -> KogModelRunner:
    r = object.__new__(KogModelRunner)  # the host-side state only: no vLLM model runner behind it
    r.vllm_config = _EngineConfig()
    r.device = torch.device("cpu")
    r.kog_config = KogConfig()
    r.kog_counters = StepCounters(path=str(tmp_path / "stats-1-rank0.json"))
    r._kog_monokernel = _step(mk)
    r._kog_outcome = LaunchOutcome(r.kog_counters, r._kog_disable, r.device)
    r._kog_output = None
    r._kog_requests = {}
    return r


def test_clean_launch_is_a_host_read_only(tmp_path):
    mk = FakeMonokernel(0)
    r = _runner(tmp_path, mk)
    step = r._kog_monokernel
    for _ in range(3):
        r._kog_check_launch_status()
    assert mk.calls == ["status_word"] * 3  # no diagnostics, no reset, no device call
    assert r._kog_monokernel is step and r.kog_disabled_reason is None and r.kog_counters.launch_aborts == 0
    assert step.run_ahead.abandoned == 0


@pytest.mark.parametrize("word", [1, 7])
def test_abort_disables_kog_counts_and_resets(tmp_path, caplog, word):
    mk = FakeMonokernel(word)
    r = _runner(tmp_path, mk)
    ahead = r._kog_monokernel.run_ahead
    r._kog_output = KernelLogits(torch.zeros(1, 64), torch.ones(1, dtype=torch.int32))  # nothing of it is sampled
    with caplog.at_level(logging.WARNING):
        r._kog_check_launch_status()
        r._kog_check_launch_status()  # kog is off now: nothing more happens
    assert mk.calls == ["status_word", "diagnostics", "reset_counters"]
    assert ahead.abandoned == 1  # the burst queued behind the aborted one is cancelled
    assert r._kog_monokernel is None and r._kog_output is None
    assert r.kog_counters.launch_aborts == 1
    reason = r.kog_disabled_reason
    assert reason.startswith("kernel abort: blocks not resident")
    assert int(mk.status[0]) == 0
    # This step and the next ones run stock, with that reason.
    so = SimpleNamespace(num_scheduled_tokens={"a": 1})
    assert r._kog_step_reason(so) == reason
    logged = [rec.getMessage() for rec in caplog.records if "kernel abort" in rec.getMessage()]
    assert len(logged) == 1  # the diagnostic, logged once
    snap = r.kog_counters.snapshot()
    assert snap["launch_aborts"] == 1 and snap["disabled_reason"] == reason
    assert scheduling.turned_off_reason(r.vllm_config) == reason  # KogScheduler schedules as stock from its next step


class FakeSampler:
    def __call__(self, logits, input_batch):
        from vllm.v1.worker.gpu.sample.output import SamplerOutput

        one = torch.ones(1, dtype=torch.int32)
        return SamplerOutput(sampled_token_ids=torch.tensor([[int(logits.argmax())]]), logprobs_tensors=None,
                             num_nans=None, num_sampled=one, num_rejected=torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize("count, sampled, rejected", [(1, 1, 0), (0, 0, 1)])
def test_k1_step_count_replaces_the_samplers(tmp_path, count, sampled, rejected):
    # A K = 1 launch writes its count (0 when it aborted) into MonokernelStep.k1_count; vLLM's sampler's token of the
    # launch's logits goes out only with count 1.
    r = _runner(tmp_path, FakeMonokernel(0))
    r.sampler = FakeSampler()
    r._kog_output = KernelLogits(torch.randn(1, 64), torch.tensor([count], dtype=torch.int32))
    out, num_sampled, num_rejected = r.sample(None, SimpleNamespace(), None)
    assert int(num_sampled[0]) == sampled and int(num_rejected[0]) == rejected
    assert int(out.num_sampled[0]) == sampled and r._kog_output is None


def test_refused_launch_turns_kog_off_on_one_gpu(tmp_path):
    counters = StepCounters(path=str(tmp_path / "stats-1-rank0.json"))
    disabled = []
    outcome = LaunchOutcome(counters, disabled.append, torch.device("cpu"))
    step = _step(FakeMonokernel(0))
    outcome.launch_failed(step, RuntimeError("too many blocks"))
    assert disabled == ["monokernel launch failed: too many blocks"] and step.run_ahead.abandoned == 1


def test_refused_launch_raises_under_tensor_parallelism(tmp_path):
    # The peers' kernels wait for this rank's partials: no rank falls back alone.
    disabled = []
    outcome = LaunchOutcome(StepCounters(path=None), disabled.append, torch.device("cpu"))
    step = _step(FakeMonokernel(0), tp_size=2)
    error = RuntimeError("too many blocks")
    with pytest.raises(RuntimeError) as raised:
        outcome.launch_failed(step, error)
    assert raised.value is error and disabled == [] and step.run_ahead.abandoned == 0


def test_inject_fault_hangs_only_the_chosen_launch():
    mk = FakeMonokernel(0)
    mk.fault_table = lambda: "fault-table"
    cpu = torch.device("cpu")
    faults = FaultInjection(KogConfig.from_dict({"inject_fault": "hang", "inject_fault_launch": 3}), cpu)
    assert [faults.table(mk) for _ in range(5)] == [None, None, "fault-table", None, None]
    off = FaultInjection(KogConfig(), cpu)
    assert [off.table(mk) for _ in range(5)] == [None] * 5  # the default: no injection
