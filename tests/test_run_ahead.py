"""kog_backend.path.run_ahead on the CPU: which burst comes next, which launch a step takes, what abandoning writes."""

from __future__ import annotations

import torch

from kog_backend.path.counters import StepCounters
from kog_backend.path.run_ahead import BurstKey, PlannedLaunch, RunAhead, blocks_needed, next_burst_key


class FakeMonokernel:
    def __init__(self):
        self.calls = []

    def generate(self, input_ids, positions, block_table, slot_mapping, num_tokens, **kw):
        self.calls.append(dict(num_tokens=num_tokens, **kw))
        return torch.full((num_tokens,), len(self.calls), dtype=torch.int64), torch.zeros(1, dtype=torch.int32)


def _planned(key, gate_min=32):
    one = torch.zeros(1, dtype=torch.int64)
    return PlannedLaunch(key=key, input_ids=one, positions=one, block_table=torch.zeros(4, dtype=torch.int32),
                         slot_mapping=one, gate=torch.zeros(1, dtype=torch.int32), gate_min=gate_min,
                         stop_ids=torch.tensor([-1]), sample_seed=None)


def test_next_burst_key():
    key = BurstKey("r", 100, 32)
    assert next_burst_key(key, 32) == BurstKey("r", 132, 32)
    assert next_burst_key(key, 7) == BurstKey("r", 132, 7)  # capped by max_tokens or max_model_len
    assert next_burst_key(key, 1) is None  # a one-token step is vLLM's sampler's


def test_blocks_needed():
    assert blocks_needed(BurstKey("r", 0, 16), 16) == 1
    assert blocks_needed(BurstKey("r", 1, 16), 16) == 2
    assert blocks_needed(BurstKey("r", 132, 32), 16) == 11  # last position 163


def test_take_the_matching_burst_and_abandon_others():
    counters = StepCounters()
    word = torch.zeros(1, dtype=torch.int64)
    ra, mk = RunAhead(counters, cancel_word=word), FakeMonokernel()
    key = BurstKey("r", 132, 32)
    ra.plan(_planned(key))
    ra.launch_planned(mk)
    assert ra.planned is None and mk.calls[0]["cancel_id"] == 1 and mk.calls[0]["gate_min"] == 32
    assert mk.calls[0]["cancel"] is word and mk.calls[0]["launch_gate"] is not None
    burst = ra.take(key)
    assert burst is not None and burst.launch_id == 1 and int(word[0]) == 0
    assert ra.take(key) is None  # taken once
    # A step that is not the planned one: the launch is cancelled on the GPU through the word (ids only grow).
    ra.plan(_planned(BurstKey("r", 164, 32)))
    ra.launch_planned(mk)
    assert ra.take(BurstKey("r", 164, 31)) is None and int(word[0]) == 2
    ra.plan(_planned(BurstKey("r", 164, 32)))
    ra.launch_planned(mk)
    assert ra.take(BurstKey("other", 164, 32)) is None and int(word[0]) == 3
    assert (counters.run_ahead_used, counters.run_ahead_abandoned) == (1, 2)
    assert counters.snapshot()["run_ahead_abandoned"] == 2


def test_abandon():
    word = torch.zeros(1, dtype=torch.int64)
    ra, mk = RunAhead(cancel_word=word), FakeMonokernel()
    ra.plan(_planned(BurstKey("a", 10, 8)))
    ra.launch_planned(mk)
    ra.abandon_request("b")  # another request finished: nothing happens
    assert ra.pending is not None and int(word[0]) == 0
    ra.abandon_request("a")
    assert ra.pending is None and int(word[0]) == 1
    ra.plan(_planned(BurstKey("a", 18, 8)))
    ra.abandon()  # planned but not yet launched: dropped, nothing to cancel
    ra.launch_planned(mk)
    assert len(mk.calls) == 1 and ra.pending is None and int(word[0]) == 1
