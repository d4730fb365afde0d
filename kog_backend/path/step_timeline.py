"""Where a lone request's time goes between its bursts (kog option step_timeline; a diagnostic, off by default).

`kog bench` at K = 32 without run-ahead spent ~0.89 ms per Llama-3.2-1B token where the kernel alone took ~0.79
(docs/tuning.md, `run_ahead`): ~3 ms per burst outside the kernel, twice the engine step measured with an empty
model. This records,
per kog step, host times (time.perf_counter) at execute_model's entry and at sample_tokens' return, and CUDA events
on the stream right before and after every kernel launch; when the runner goes idle the events have completed and
the request's medians (ms) join the counters (`kog stats --json`, `kog bench`'s result and table):

  period      execute_model entry to the next entry: one engine step, host side
  in_runner   execute_model entry to sample_tokens' return: kog's and vLLM's runner work
  kernel      a launch's start event to its end event: the kernel's GPU time (including any wait at its start)
  gpu_gap     one launch's end event to the next launch's start event: GPU time outside the kernel (vLLM's own
              small kernels and idle time) between bursts

Reading the events needs one stream synchronisation per idle period, so the option is for diagnosis only.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch


class StepTimeline:
    def __init__(self) -> None:
        self._execute: list[float] = []  # host seconds at each kog step's execute_model entry
        self._sampled: list[float] = []  # host seconds at each kog step's sample_tokens return
        self._launches: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._in_step = False

    def execute_entry(self, kog_step: bool) -> None:
        """Every execute_model call; only kog steps are timed (a stock step in between ends the period series)."""
        self._in_step = kog_step
        if kog_step:
            self._execute.append(time.perf_counter())

    def sampled(self) -> None:
        if self._in_step:
            self._sampled.append(time.perf_counter())
            self._in_step = False

    @contextmanager
    def launch(self):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._launches.append((start, end))

    def summary(self) -> dict[str, float] | None:
        """Medians in ms over what was recorded since the last summary, then forgets it; None if nothing was."""
        if not self._launches:
            self._execute, self._sampled = [], []
            return None
        self._launches[-1][1].synchronize()
        ms = 1e3
        kernel = [s.elapsed_time(e) for s, e in self._launches]
        gaps = [a[1].elapsed_time(b[0]) for a, b in zip(self._launches, self._launches[1:])]
        periods = [(b - a) * ms for a, b in zip(self._execute, self._execute[1:])]
        in_runner = [(b - a) * ms for a, b in zip(self._execute, self._sampled)]
        out = {"launches": float(len(kernel)), "kernel": statistics.median(kernel)}
        for name, values in (("gpu_gap", gaps), ("period", periods), ("in_runner", in_runner)):
            if values:
                out[name] = statistics.median(values)
        self._execute, self._sampled, self._launches = [], [], []
        return out
