"""kog vs stock vLLM through `LLM(...)` on the same random-weight checkpoint, both engines alive in one process.

Greedy outputs must be token-identical; the kog path must actually run (its counter grows); batched steps and
requests asking for logprobs must run stock and still be right.
"""

from __future__ import annotations

import os

import pytest

from vllm_helpers import first_mismatch, kog_kwargs, engine_kwargs, kog_stats, random_prompts, token_ids

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


def test_greedy_single_requests_identical(engines):
    stock, kog = engines
    vocab = stock.llm_engine.model_config.get_vocab_size()
    prompts = random_prompts(4, [32, 1, 5, 300], vocab)
    before = kog_stats(kog)
    for i, p in enumerate(prompts):
        want = token_ids(stock.generate([p], _greedy()))[0]
        got = token_ids(kog.generate([p], _greedy()))[0]
        assert len(got) == NEW_TOKENS
        assert got == want, f"prompt {i}: first mismatch at token {first_mismatch(got, want)}"
    after = kog_stats(kog)
    assert after["disabled_reason"] is None, after
    # Every decode step of a lone request runs on the kog path: NEW_TOKENS - 1 per prompt (the first token
    # comes from the prefill step).
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
    """temperature/top-p requests run on the kog path (vLLM's sampler on kog's hidden state); with a fixed
    seed vLLM's Gumbel sampler is deterministic, so the tokens equal stock's."""
    from vllm import SamplingParams

    stock, kog = engines
    vocab = stock.llm_engine.model_config.get_vocab_size()
    prompt = random_prompts(1, [20], vocab, seed=5)
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=64, ignore_eos=True)
    before = kog_stats(kog)
    got = token_ids(kog.generate(prompt, sp))[0]
    after = kog_stats(kog)
    want = token_ids(stock.generate(prompt, sp))[0]
    assert after["kog_steps"] - before["kog_steps"] == 63
    assert got == want, f"first mismatch at {first_mismatch(got, want)}"
