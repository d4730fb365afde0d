"""kog_backend.path.step_timeline on the CPU (the CUDA events replaced by host clocks) and its line in kog bench's table."""

from __future__ import annotations

from kog_backend.tools.bench.results import RunResult
from kog_backend.tools.bench.table import _timelines
from kog_backend.path.counters import StepCounters
from kog_backend.path.step_timeline import StepTimeline


class FakeEvent:
    """torch.cuda.Event's timing calls, at times set by the test (ms)."""

    clock = 0.0

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = FakeEvent.clock

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.t - self.t


def test_summary_medians(monkeypatch):
    import kog_backend.path.step_timeline as mod

    monkeypatch.setattr(mod.torch.cuda, "Event", FakeEvent)
    host = iter([0.0, 0.0005, 0.003, 0.0035, 0.006, 0.0065])  # three steps, 3 ms apart, 0.5 ms in the runner
    monkeypatch.setattr(mod.time, "perf_counter", lambda: next(host))
    tl = StepTimeline()
    for i in range(3):
        tl.execute_entry(kog_step=True)
        FakeEvent.clock = 10.0 * i
        with tl.launch():
            FakeEvent.clock = 10.0 * i + 8.0  # 8 ms kernels, 2 ms gaps
        tl.sampled()
    tl.execute_entry(kog_step=False)  # a stock step: not timed
    tl.sampled()
    s = tl.summary()
    assert s == {"launches": 3.0, "kernel": 8.0, "gpu_gap": 2.0, "period": 3.0, "in_runner": 0.5}
    assert tl.summary() is None  # forgotten after a summary


def test_counters_and_table_line():
    c = StepCounters()
    assert "timeline" not in c.snapshot()
    c.record_timeline({"launches": 16.0, "kernel": 25.1, "gpu_gap": 3.2, "period": 28.4, "in_runner": 0.6})
    snap = c.snapshot()
    assert snap["timeline"]["gpu_gap"] == 3.2
    line = _timelines(RunResult(impl="kog", counters=[snap]))
    assert line == ["step timeline, medians over 16 launches, ms: period 28.400, in_runner 0.600, kernel 25.100, "
                    "gpu_gap 3.200"]
