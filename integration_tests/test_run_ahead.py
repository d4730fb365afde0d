"""Run-ahead bursts inside vLLM (kog option run_ahead, kog_backend/path/run_ahead.py), on the monokernel.

Oracle: kog at K = 1 (the chain of test_multi_token.py: K = 1 agrees with stock under teacher forcing). With
run-ahead at K = 32 every output must equal K = 1's token for token, stops must land where K = 1's land, and the
counters must show bursts taken from the run-ahead launch (else the test would pass without running ahead) and,
where a step turns out different (a stop, a second request), bursts abandoned.
"""

from __future__ import annotations

import os

import pytest

from test_multi_token import _greedy, _staggered_child, multi_kwargs
from vllm_helpers import first_mismatch, kog_stats, random_prompts, run_in_spawned_child, token_ids

pytestmark = pytest.mark.vllm_gpu

SHAPE = os.environ.get("KOG_TEST_SHAPE", "llama-3.2-1b")
K = 32


def ra_kwargs(k: int, run_ahead: bool, **over):
    return multi_kwargs(k, {"step_impl": "monokernel", "run_ahead": run_ahead}, **over)


@pytest.fixture(scope="module")
def engines(checkpoint):
    from vllm import LLM

    path = checkpoint(SHAPE)
    return {
        "k1": LLM(model=path, **ra_kwargs(1, False, gpu_memory_utilization=0.15)),
        "ahead": LLM(model=path, **ra_kwargs(K, True, gpu_memory_utilization=0.15)),
    }


@pytest.mark.parametrize("max_tokens", [512, 100, 2])
def test_greedy_identical_to_one_token_steps(engines, max_tokens):
    vocab = engines["k1"].llm_engine.model_config.get_vocab_size()
    for p in random_prompts(2, [32, 5], vocab, seed=31):
        want = token_ids(engines["k1"].generate([p], _greedy(max_tokens, ignore_eos=True)))[0]
        before = kog_stats(engines["ahead"])
        got = token_ids(engines["ahead"].generate([p], _greedy(max_tokens, ignore_eos=True)))[0]
        after = kog_stats(engines["ahead"])
        assert got == want, f"first mismatch at {first_mismatch(got, want)}"
        bursts = -(-(max_tokens - 1) // K)
        assert after["kog_steps"] - before["kog_steps"] == bursts
        # Every burst but the first (and a last one shorter than K, sized only once the one before it ran) comes
        # from the run-ahead launch.
        full_after_first = (max_tokens - 1) // K - 1
        assert after["run_ahead_used"] - before["run_ahead_used"] >= max(0, full_after_first), (before, after)


def test_stop_token_mid_burst(engines):
    vocab = engines["k1"].llm_engine.model_config.get_vocab_size()
    prompt = random_prompts(1, [24], vocab, seed=32)
    free = token_ids(engines["k1"].generate(prompt, _greedy(200, ignore_eos=True)))[0]
    # A token first seen past the first two bursts, so that a run-ahead burst computed it.
    stop_at = next((i for i in range(2 * K + 3, len(free)) if free[i] not in free[:i]), None)
    assert stop_at is not None, f"no new token past {2 * K + 3} in {free}"
    out = engines["ahead"].generate(prompt, _greedy(200, ignore_eos=True, stop_token_ids=[free[stop_at]]))[0].outputs[0]
    assert list(out.token_ids) == free[: stop_at + 1] and out.finish_reason == "stop"


def test_staggered_second_request(checkpoint):
    """A second request arrives while a run-ahead burst is on the GPU: both requests' tokens equal those of K = 1
    with the second request arriving after the same number of the first's tokens, and the run-ahead burst was
    abandoned (cancelled on the GPU) rather than handed to vLLM."""
    path = checkpoint(SHAPE)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    prompts = random_prompts(2, [20, 28], vocab, seed=33)
    kw = dict(gpu_memory_utilization=0.25)
    # Prefill (1 token), then two bursts (2 x 32): the second request arrives after 65 tokens.
    ahead, joined, stats = run_in_spawned_child(_staggered_child, path, ra_kwargs(K, True, **kw), prompts, 120, 65)
    ref, joined1, _ = run_in_spawned_child(_staggered_child, path, ra_kwargs(1, False, **kw), prompts, 120, 65)
    assert joined == joined1 == 65, (joined, joined1)
    assert stats["run_ahead_used"] >= 1 and stats["run_ahead_abandoned"] >= 1, stats
    assert ahead["r1"] == ref["r1"], first_mismatch(ahead["r1"], ref["r1"])
    assert ahead["r2"] == ref["r2"], first_mismatch(ahead["r2"], ref["r2"])


def test_stop_string_mid_burst(checkpoint):
    """A stop string ends the request inside a burst while the next burst runs ahead: the text ends where K = 1
    ends it."""
    from vllm import LLM, SamplingParams

    path = checkpoint("tiny-llama")
    one = LLM(model=path, **ra_kwargs(1, False, gpu_memory_utilization=0.08, max_model_len=1024))
    ahead = LLM(model=path, **ra_kwargs(K, True, gpu_memory_utilization=0.08, max_model_len=1024))
    prompt = "The quick brown fox"
    sp = dict(temperature=0.0, max_tokens=150, ignore_eos=True)
    free = one.generate([prompt], SamplingParams(**sp))[0].outputs[0].text
    assert len(free) > 80, free
    stop = free[70:74]
    assert stop.strip(), free
    want = one.generate([prompt], SamplingParams(**sp, stop=[stop]))[0].outputs[0]
    got = ahead.generate([prompt], SamplingParams(**sp, stop=[stop]))[0].outputs[0]
    assert got.text == want.text and got.finish_reason == want.finish_reason == "stop"
