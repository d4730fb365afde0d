"""Host-side arithmetic of the kog runner: how many tokens one step may generate, and which ids end a burst."""

from __future__ import annotations

import pytest
from vllm.sampling_params import SamplingParams

from kog_backend.runner import _stop_ids, burst_length, sampled_burst_temperature


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
    assert _stop_ids(sp) == (2, 3, 5)
    sp = SamplingParams(stop_token_ids=[5], ignore_eos=True)
    sp.update_from_generation_config({}, 2)
    assert _stop_ids(sp) == (5,)
    assert _stop_ids(None) == ()


@pytest.mark.parametrize(
    "kwargs,want",
    [
        (dict(temperature=0.0), None),  # greedy bursts on its own path
        (dict(temperature=0.8), 0.8),
        (dict(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0), 1.0),  # vllm bench latency's request
        (dict(temperature=0.8, top_p=0.9), None),  # top-p needs the whole row sorted: vLLM's sampler, K = 1
        (dict(temperature=0.8, top_k=50), None),
        (dict(temperature=0.8, min_p=0.05), None),
    ],
)
def test_sampled_burst_temperature(kwargs, want):
    assert sampled_burst_temperature(SamplingParams(**kwargs)) == want
    assert sampled_burst_temperature(None) is None


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
        ({}, "kog", True, 1, "INFO"),
        ({"tokens_per_step": 8}, "stock", False, 1, "WARNING"),  # asked for K > 1 and cannot have it: warn
        ({"tokens_per_step": 8}, "kog", True, 1, "WARNING"),
    ],
)
def test_effective_tokens_per_step(kog, sched, async_, want, level, monkeypatch):
    from types import SimpleNamespace

    from vllm.v1.core.sched.scheduler import Scheduler

    from kog_backend import runner
    from kog_backend.config import KogConfig
    from kog_backend.scheduler import KogScheduler

    logged = []
    monkeypatch.setattr(runner.logger, "info", lambda *a, **k: logged.append("INFO"))
    monkeypatch.setattr(runner.logger, "warning", lambda *a, **k: logged.append("WARNING"))
    vc = _vllm_config(kog, KogScheduler if sched == "kog" else Scheduler, async_)
    fake = SimpleNamespace(kog_config=KogConfig.from_vllm_config(vc))
    assert runner.KogModelRunner._kog_effective_tokens_per_step(fake, vc) == want
    assert logged == ([level] if level else [])
