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
