"""Host-side arithmetic of the kog step: how many tokens one step may generate (tokens_per_step), and which ids end a
burst (kog_request)."""

from __future__ import annotations

import pytest
import torch
from vllm.sampling_params import SamplingParams

from kog_backend.path.eligibility import BurstSampling, burst_sampling
from kog_backend.engine.kog_request import stop_ids
from kog_backend.engine.tokens_per_step import burst_length


@pytest.mark.parametrize(
    "k,position,prompt_len,max_tokens,max_model_len,want",
    [
        (16, 40, 32, 1000, 4096, 16),  # plenty of room
        (16, 40, 32, 10, 4096, 1),  # 9 outputs so far (positions 32..40), one more allowed
        (16, 40, 32, 20, 4096, 11),  # max_tokens not divisible by K: the last burst is shorter
        (16, 4090, 32, 10**6, 4096, 5),  # the last token may sit at max_model_len - 1 = 4095
        (16, 4094, 32, 10**6, 4096, 1),  # at the edge: never less than one
        (1, 40, 32, 1000, 4096, 1),
    ],
)
def test_burst_length(k, position, prompt_len, max_tokens, max_model_len, want):
    assert burst_length(k, position, prompt_len, max_tokens, max_model_len) == want


def test_burst_never_passes_max_tokens_over_a_whole_request():
    prompt_len, max_tokens, k = 7, 53, 16
    outputs = 1  # the prefill step samples the first token
    position = prompt_len  # that token is fed back at this position
    while outputs < max_tokens:
        n = burst_length(k, position, prompt_len, max_tokens, 4096)
        assert n >= 1
        outputs += n
        position += n
    assert outputs == max_tokens


def test_stop_ids_follow_check_stop():
    sp = SamplingParams(stop_token_ids=[5, 3])
    sp.update_from_generation_config({}, 2)
    assert stop_ids(sp) == (2, 3, 5)
    sp = SamplingParams(stop_token_ids=[5], ignore_eos=True)
    sp.update_from_generation_config({}, 2)
    assert stop_ids(sp) == (5,)
    assert stop_ids(None) == ()


@pytest.mark.parametrize(
    "kwargs,want",
    [
        (dict(temperature=0.0), None),  # greedy bursts on its own path
        (dict(temperature=0.8), BurstSampling(0.800000011920929, 0, 1.0, 0.0)),  # fp32, as SamplingStates holds it
        (dict(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0), BurstSampling(1.0, 0, 1.0, 0.0)),
        (dict(temperature=0.6, top_p=0.9), BurstSampling(0.6000000238418579, 0, 0.8999999761581421, 0.0)),
        (dict(temperature=0.6, top_k=20, top_p=0.95), BurstSampling(0.6000000238418579, 20, 0.949999988079071, 0.0)),
        (dict(temperature=0.8, min_p=0.05), BurstSampling(0.800000011920929, 0, 1.0, 0.05000000074505806)),
        (dict(temperature=0.8, top_k=1000), BurstSampling(0.800000011920929, 0, 1.0, 0.0)),  # k >= V: off
        (dict(temperature=0.8, top_k=999), BurstSampling(0.800000011920929, 999, 1.0, 0.0)),
        # penalties, fp32 as PenaltiesState holds them; a greedy request with penalties takes the sampled kernel at
        # temperature 0 and vLLM's greedy normalisation (no filters)
        (dict(temperature=0.6, top_p=0.9, repetition_penalty=1.1),
         BurstSampling(0.6000000238418579, 0, 0.8999999761581421, 0.0, 1.100000023841858, 0.0, 0.0)),
        (dict(temperature=1.0, presence_penalty=1.5, frequency_penalty=-0.3),
         BurstSampling(1.0, 0, 1.0, 0.0, 1.0, -0.30000001192092896, 1.5)),
        (dict(temperature=0.0, top_k=5, repetition_penalty=1.2), BurstSampling(0.0, 0, 1.0, 0.0, 1.2000000476837158)),
        (dict(temperature=0.0, repetition_penalty=1.0 + 1e-9), None),  # 1 in fp32: vLLM's kernel skips it too
    ],
)
def test_burst_sampling_is_vllms_normalisation(kwargs, want):
    got = burst_sampling(SamplingParams(**kwargs), vocab_size=1000)
    assert got == want
    assert burst_sampling(None, 1000) is None
    if got is not None:
        assert got.filtered == (got.top_k > 0 or got.top_p < 1.0 or got.min_p > 0.0)
        rows = (torch.zeros(32, dtype=torch.int32), torch.zeros(1000, dtype=torch.int32))
        kw = got.draw_kwargs("cpu", rows if got.penalized else None)
        assert kw["temperature"] == got.temperature
        assert ("defer_out" in kw) == got.filtered
        if got.filtered:
            assert kw["defer_out"].tolist() == [0] and (kw["top_k"], kw["top_p"], kw["min_p"]) == (
                got.top_k, got.top_p, got.min_p)
        if got.penalized:
            with pytest.raises(ValueError, match="PenaltiesState rows"):
                got.draw_kwargs("cpu")
            assert kw["prompt_mask"] is rows[0] and kw["output_counts"] is rows[1]
            assert (kw["repetition_penalty"], kw["frequency_penalty"], kw["presence_penalty"]) == (
                got.repetition_penalty, got.frequency_penalty, got.presence_penalty)
        else:
            assert "prompt_mask" not in kw


def _vllm_config(kog, scheduler_cls, async_scheduling):
    from types import SimpleNamespace

    sched = SimpleNamespace(async_scheduling=async_scheduling, get_scheduler_cls=lambda: scheduler_cls)
    return SimpleNamespace(additional_config={"kog": kog}, scheduler_config=sched)


@pytest.mark.parametrize(
    "kog,sched,async_,want,level",
    [
        ({}, "kog", False, 32, None),  # the default K where kog's scheduler runs
        ({"tokens_per_step": 8}, "kog", False, 8, None),
        ({"tokens_per_step": 1}, "stock", True, 1, None),
        ({}, "stock", False, 1, "INFO"),  # the default without kog's scheduler: quietly 1
        ({}, "kog", True, 32, None),  # async scheduling too (KogScheduler is vLLM's async scheduler)
        ({"tokens_per_step": 8}, "stock", False, 1, "WARNING"),  # asked for K > 1 and cannot have it: warn
        ({"tokens_per_step": 8}, "kog", True, 8, None),
    ],
)
def test_effective_tokens_per_step(kog, sched, async_, want, level, monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler

    from kog_backend.config import KogConfig
    from kog_backend.engine import tokens_per_step
    from kog_backend.engine.scheduler import KogScheduler

    logged = []
    monkeypatch.setattr(tokens_per_step.logger, "info", lambda *a, **k: logged.append("INFO"))
    monkeypatch.setattr(tokens_per_step.logger, "warning", lambda *a, **k: logged.append("WARNING"))
    vc = _vllm_config(kog, KogScheduler if sched == "kog" else Scheduler, async_)
    assert tokens_per_step.effective_tokens_per_step(KogConfig.from_vllm_config(vc), vc) == want
    assert logged == ([level] if level else [])
