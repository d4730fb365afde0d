"""kog vs stock vLLM through `LLM(...)` on the same random-weight checkpoint, both engines alive in one process.

The kog path must actually run (its counter grows); batched steps and requests asking for logprobs run stock on
both engines, so their tokens (and logprobs) must be identical. Greedy parity of the kog path itself, with
near-tie flips told apart from bugs, is in test_teacher_forcing.py.
"""

from __future__ import annotations

import os

import pytest

from vllm_helpers import engine_kwargs, kog_kwargs, kog_stats, random_prompts, token_ids

pytestmark = pytest.mark.vllm_gpu

SHAPE = os.environ.get("KOG_TEST_SHAPE", "llama-3.2-1b")
NEW_TOKENS = 128


@pytest.fixture(scope="module")
def engines(checkpoint):
    from vllm import LLM

    path = checkpoint(SHAPE)
    stock = LLM(model=path, **engine_kwargs())
    kog = LLM(model=path, **kog_kwargs())
    yield stock, kog


def _greedy(**kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, **kw)


def test_single_requests_run_on_kog_path(engines):
    """Every decode step of a lone request runs on the kog path: NEW_TOKENS - 1 per request (the first token
    comes from the prefill step). Token parity with stock is test_teacher_forcing.py's job."""
    stock, kog = engines
    vocab = stock.llm_engine.model_config.get_vocab_size()
    prompts = random_prompts(3, [32, 1, 300], vocab)
    before = kog_stats(kog)
    for p in prompts:
        assert len(token_ids(kog.generate([p], _greedy()))[0]) == NEW_TOKENS
    after = kog_stats(kog)
    assert after["disabled_reason"] is None, after
    assert after["kog_steps"] - before["kog_steps"] == len(prompts) * (NEW_TOKENS - 1), after


def test_concurrent_requests_run_stock(engines):
    stock, kog = engines
    vocab = stock.llm_engine.model_config.get_vocab_size()
    prompts = random_prompts(2, [24, 40], vocab, seed=7)
    before = kog_stats(kog)
    got = token_ids(kog.generate(prompts, _greedy()))
    after = kog_stats(kog)
    want = token_ids(stock.generate(prompts, _greedy()))
    assert got == want
    batched = after["fallbacks"].get("batch of several requests", 0) - before["fallbacks"].get("batch of several requests", 0)
    assert batched >= NEW_TOKENS - 1, after


def test_logprobs_request_falls_back_and_is_right(engines):
    stock, kog = engines
    vocab = stock.llm_engine.model_config.get_vocab_size()
    prompt = random_prompts(1, [16], vocab, seed=99)
    before = kog_stats(kog)
    got = kog.generate(prompt, _greedy(logprobs=2))[0].outputs[0]
    want = stock.generate(prompt, _greedy(logprobs=2))[0].outputs[0]
    after = kog_stats(kog)
    assert list(got.token_ids) == list(want.token_ids)
    assert len(got.logprobs) == NEW_TOKENS
    for g, w in zip(got.logprobs, want.logprobs):
        assert set(g) == set(w)
        for tok in g:
            assert abs(g[tok].logprob - w[tok].logprob) < 1e-3
    assert after["kog_steps"] == before["kog_steps"]
    assert after["fallbacks"].get("logprobs requested", 0) - before["fallbacks"].get("logprobs requested", 0) == NEW_TOKENS - 1


def test_sampled_request_runs_on_kog_path(engines):
    """temperature/top-p requests run on the kog path (vLLM's sampler on kog's hidden state); a fixed seed makes
    vLLM's Gumbel sampler deterministic, so two runs give the same tokens."""
    from vllm import SamplingParams

    stock, kog = engines
    vocab = stock.llm_engine.model_config.get_vocab_size()
    prompt = random_prompts(1, [20], vocab, seed=5)
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=64, ignore_eos=True)
    before = kog_stats(kog)
    first = token_ids(kog.generate(prompt, sp))[0]
    second = token_ids(kog.generate(prompt, sp))[0]
    after = kog_stats(kog)
    assert after["kog_steps"] - before["kog_steps"] == 2 * 63
    assert first == second and len(first) == 64
