"""The monokernel step (kog_backend.engine.monokernel_step) on the CPU with a fake kernel and a fake vLLM sampler:
what a K = 1 launch and a burst pass the kernel and hand `sample`, the draw a filtered burst leaves to vLLM's
sampler, and the run-ahead burst it plans (only into KV blocks the request holds)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.sampling_params import SamplingParams

from kog_backend.config import KogConfig
from kog_backend.engine import monokernel_step
from kog_backend.engine.fault_injection import FaultInjection
from kog_backend.engine.kog_request import KogRequest
from kog_backend.engine.monokernel_step import MonokernelStep
from kog_backend.engine.step_io import BurstTokens, KernelLogits, StepInputs
from kog_backend.path.burst_sampling import burst_sampling
from kog_backend.path.counters import StepCounters
from kog_backend.path.run_ahead import BurstKey, RunAhead

VOCAB, BLOCK = 64, 16
CPU = torch.device("cpu")


class FakeKernel:
    def __init__(self, defer: bool = False):
        self.calls: list[tuple[str, dict]] = []
        self.logits_scratch = torch.zeros(VOCAB, dtype=torch.bfloat16)
        self.logits_scratch[42] = 1.0
        self.defer = defer

    def step(self, input_ids, positions, block_table, slot_mapping, **kw):
        self.calls.append(("step", kw))
        kw["logits_out"].fill_(0.5)
        kw["num_out"].fill_(1)

    def generate(self, input_ids, positions, block_table, slot_mapping, num_tokens, **kw):
        self.calls.append(("generate", dict(kw, input_ids=input_ids, positions=positions, block_table=block_table,
                                            num_tokens=num_tokens)))
        tokens = torch.arange(num_tokens, dtype=torch.int64) + 100
        if self.defer:  # the kernel ended before token 2 and left it to vLLM's sampler
            kw["defer_out"].fill_(1)
            return tokens, torch.tensor([2], dtype=torch.int32)
        return tokens, torch.tensor([num_tokens], dtype=torch.int32)


class FakeSampler:
    def __init__(self):
        self.sampling_states = SimpleNamespace(seeds=SimpleNamespace(gpu=torch.tensor([11, 22], dtype=torch.int64)))
        self.penalties_state = SimpleNamespace(
            prompt_bin_mask=torch.zeros(2, 2, dtype=torch.int32),
            output_bin_counts=torch.zeros(2, VOCAB, dtype=torch.int32), use_penalty=np.array([True, True]))
        self.sample_calls = []

    def sample(self, logits, expanded_idx_mapping, idx_mapping_np, positions, input_ids, expanded_local_pos):
        use_penalty = bool(self.penalties_state.use_penalty[1])
        self.sample_calls.append(dict(positions=positions.clone(), use_penalty=use_penalty))
        return logits.float().argmax(-1).view(1), None


def _step(kernel, k: int = 4, run_ahead: bool = False, config: KogConfig | None = None) -> MonokernelStep:
    step = MonokernelStep(kernel, CPU, VOCAB, BLOCK, tokens_per_step=k, max_len=4096,
                          faults=FaultInjection(config or KogConfig(), CPU))
    if run_ahead:
        step.run_ahead = RunAhead(StepCounters(path=None), cancel_word=torch.zeros(1, dtype=torch.int64))
    return step


def _inputs(position: int, sp: SamplingParams | None = None, held: int = 8) -> StepInputs:
    batch = SimpleNamespace(
        input_ids=torch.tensor([5]), positions=torch.tensor([position]), idx_mapping=torch.tensor([1]),
        idx_mapping_np=np.array([1]), req_ids=["a"], num_computed_tokens_np=np.array([position]),
        expanded_idx_mapping=torch.tensor([1]), expanded_local_pos=torch.tensor([0]))
    sp = sp or SamplingParams(temperature=0.0, max_tokens=1000)
    request = KogRequest(reason=None, single_token=None, sampling=burst_sampling(sp, VOCAB), prompt_len=10,
                         max_tokens=sp.max_tokens, stop_ids=(2, 7))
    block_tables = SimpleNamespace(num_blocks=SimpleNamespace(np=np.array([[0, held]])))
    return StepInputs(batch, torch.arange(8, dtype=torch.int32) + 30, torch.tensor([position + 500]), request,
                      block_tables)


def test_one_token_hands_the_kernels_logits_and_count_to_vllms_sampler():
    kernel = FakeKernel()
    step = _step(kernel, k=1, run_ahead=True)
    step.run_ahead.pending = SimpleNamespace(launch_id=3)  # a burst launched ahead: cancelled, only bursts run ahead
    hidden, out = step.run(_inputs(20), 1, FakeSampler())
    assert isinstance(out, KernelLogits) and out.logits is step.logits and out.count is step.k1_count
    assert hidden is step.logits and bool((step.logits == 0.5).all()) and int(step.k1_count[0]) == 1
    (name, kw), = kernel.calls
    assert name == "step" and kw["num_out"] is step.k1_count and kw["model_table"] is None
    assert kw["logits_out"].data_ptr() == step.logits.data_ptr()
    assert step.run_ahead.pending is None and int(step.run_ahead.cancel_word[0]) == 3


def test_tensor_parallel_one_token_gathers_every_ranks_rows(monkeypatch):
    agreed = []
    monkeypatch.setattr(monokernel_step, "agree_count", lambda count, tp: agreed.append((count, tp)))
    kernel = FakeKernel()
    gather = lambda t: torch.cat([t, t + 1], dim=-1)  # noqa: E731  (rank 1's rows: 1.5)
    step = MonokernelStep(kernel, CPU, VOCAB, BLOCK, tokens_per_step=1, max_len=4096,
                          faults=FaultInjection(KogConfig(), CPU), tp_size=2, padded_vocab_local=VOCAB // 2 + 8,
                          gather_logits=gather)
    _, out = step.run(_inputs(20), 1, FakeSampler())
    assert kernel.calls[0][1]["logits_out"].data_ptr() == step.local_logits.data_ptr()
    # rank 0's 40 padded rows, then rank 1's first 24: the padding of the last rank is cut off
    assert out.logits.tolist()[0] == [0.5] * (VOCAB // 2 + 8) + [1.5] * (VOCAB // 2 - 8)
    assert agreed == [(step.k1_count, 2)]


def test_greedy_burst():
    kernel = FakeKernel()
    step = _step(kernel)
    hidden, out = step.run(_inputs(20), 4, FakeSampler())
    assert isinstance(out, BurstTokens) and hidden is step.logits
    assert out.tokens.tolist() == [[100, 101, 102, 103]]
    assert out.num_sampled.tolist() == [4] and out.num_rejected.tolist() == [-3]  # vLLM advances 1 - (-3) = 4
    kw = kernel.calls[0][1]
    assert kw["stop_ids"].tolist() == [2, 7] and kw["sample_seed"] is None and kw["num_tokens"] == 4
    assert "temperature" not in kw  # the greedy kernel
    step.run(_inputs(24), 4, FakeSampler())
    assert kernel.calls[1][1]["stop_ids"] is kw["stop_ids"]  # made once per stop-id set


def test_filtered_burst_leaves_one_draw_to_vllms_sampler():
    kernel = FakeKernel(defer=True)
    sampler = FakeSampler()
    sp = SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.1, max_tokens=1000)
    _, out = _step(kernel).run(_inputs(20, sp), 4, sampler)
    kw = kernel.calls[0][1]
    assert kw["sample_seed"].tolist() == [22]  # the request's seed, at its row of vLLM's SamplingStates
    assert kw["prompt_mask"] is not None and kw["top_p"] == pytest.approx(0.9)
    # vLLM's sampler drew token 2 (at position 20 + 2) from the kernel's logits, its penalties not applied twice
    assert sampler.sample_calls == [dict(positions=torch.tensor([22]), use_penalty=False)]
    assert bool(sampler.penalties_state.use_penalty[1])  # restored
    assert out.tokens.tolist() == [[100, 101, 42, 103]] and out.num_sampled.tolist() == [3]


@pytest.mark.parametrize("held,planned", [(8, True), (2, False)])
def test_run_ahead_plans_the_next_burst_into_held_blocks_only(held, planned):
    kernel = FakeKernel()
    step = _step(kernel, run_ahead=True)
    inputs = _inputs(28, held=held)
    _, out = step.run(inputs, 4, FakeSampler())
    p = step.run_ahead.planned
    assert (p is not None) == planned  # positions 32..35 are in block 2: three blocks
    if not planned:
        return
    assert p.key == BurstKey("a", 32, 4) and p.gate is out.num_sampled and p.gate_min == 4
    assert p.block_table.tolist() == [30, 31, 32] and p.block_table.data_ptr() != inputs.block_table.data_ptr()
    assert p.slot_mapping.tolist() == [32 * BLOCK + 0] and p.positions.tolist() == [32]
    step.launch_planned()
    assert kernel.calls[-1][1]["launch_gate"] is out.num_sampled and step.run_ahead.pending.key == p.key
    _, nxt = step.run(_inputs(32), 4, FakeSampler())  # the next step takes it: no launch
    assert len(kernel.calls) == 2 and nxt.tokens.tolist() == [[100, 101, 102, 103]]


def test_refused_run_ahead_launch_ends_running_ahead(caplog):
    kernel = FakeKernel()
    step = _step(kernel, run_ahead=True)
    step.run(_inputs(20), 4, FakeSampler())

    def refuse(*a, **k):
        raise RuntimeError("no")

    kernel.generate = refuse
    with caplog.at_level(logging.WARNING):
        step.launch_planned()
    assert step.run_ahead is None
    assert any("run-ahead launch failed" in r.getMessage() for r in caplog.records)
