"""Sampled requests in K-token bursts inside vLLM: temperature with top-k, top-p and min-p, as real checkpoints'
generation configs ask for them, and repetition / frequency / presence penalties, drawn by the monokernel
(csrc/include/kog/burst_sampling.cuh, penalties.cuh).

Oracle chain: a seeded request at K = 1 runs the kog path one token per step with vLLM's own sampler on the
kernel's logits; at K = 32 the kernel draws the tokens itself (and vLLM's sampler draws the few it defers), so the
two must give the same tokens, every one of them, and stop at the same place. K = 1 itself agrees with stock under
teacher forcing (test_teacher_forcing.py); the unseeded draws' distribution is test_sampled_distribution.py's.
"""

from __future__ import annotations

import os

import pytest

from vllm_helpers import first_mismatch, kog_kwargs, kog_stats, random_prompts, token_ids

pytestmark = pytest.mark.vllm_gpu

SHAPE = os.environ.get("KOG_TEST_SHAPE", "llama-3.2-1b")
SCHEDULER = "kog_backend.engine.scheduler.KogScheduler"
K = 32
ASYNC = os.environ.get("KOG_TEST_ASYNC", "1") == "1"  # the K-token engine under async scheduling (vLLM's default)

SETTINGS = {
    "llama-generation-config": dict(temperature=0.6, top_p=0.9),
    "qwen3-generation-config": dict(temperature=0.6, top_k=20, top_p=0.95),
    "min-p": dict(temperature=1.0, min_p=0.05),
    "top-k": dict(temperature=0.8, top_k=50),
    "combined": dict(temperature=0.7, top_k=40, top_p=0.8, min_p=0.02),
    "temperature": dict(temperature=0.8),
    # penalties (csrc/include/kog/penalties.cuh), alone and with the generation configs
    "repetition-1.1": dict(temperature=0.6, top_p=0.9, repetition_penalty=1.1),
    "presence-1.5": dict(temperature=1.0, presence_penalty=1.5),
    "penalties-combined": dict(temperature=0.6, top_k=20, top_p=0.95, repetition_penalty=1.1, presence_penalty=1.5,
                               frequency_penalty=0.3),
    "frequency": dict(temperature=0.8, frequency_penalty=0.7),
    "greedy-repetition-1.3": dict(temperature=0.0, repetition_penalty=1.3),
}


@pytest.fixture(scope="module")
def engines(checkpoint):
    from vllm import LLM

    path = checkpoint(SHAPE)
    kw = dict(gpu_memory_utilization=0.2)
    one = LLM(model=path, **kog_kwargs({"tokens_per_step": 1, "step_impl": "monokernel"}, async_scheduling=False, **kw))
    # The bursts under vLLM's default async scheduling (KogScheduler keeps a lone request's burst the only step in
    # flight); KOG_TEST_ASYNC=0 runs them synchronously.
    burst = LLM(model=path, **kog_kwargs({"tokens_per_step": K, "step_impl": "monokernel"}, scheduler_cls=SCHEDULER,
                                          async_scheduling=ASYNC, **kw))  # fmt: skip
    return one, burst


@pytest.mark.parametrize("name", list(SETTINGS))
def test_seeded_tokens_identical_at_k1_and_k32(engines, name):
    from vllm import SamplingParams

    one, burst = engines
    vocab = one.llm_engine.model_config.get_vocab_size()
    max_tokens = 200
    for i, prompt in enumerate(random_prompts(3, [32, 7, 100], vocab, seed=31)):
        sp = SamplingParams(seed=1000 + i, max_tokens=max_tokens, ignore_eos=True, **SETTINGS[name])
        want = token_ids(one.generate([prompt], sp, use_tqdm=False))[0]
        before = kog_stats(burst)
        got = token_ids(burst.generate([prompt], sp, use_tqdm=False))[0]
        after = kog_stats(burst)
        assert got == want, f"{name}, prompt {i}: first mismatch at {first_mismatch(got, want)}"
        steps = after["kog_steps"] - before["kog_steps"]
        # Prefill gives the first token; bursts of up to K the rest (a burst the kernel ends at a deferred token
        # is shorter).
        # kog_tokens counts the tokens each step asked for: a burst ended early asked for more than it made.
        least = -(-(max_tokens - 1) // K)
        assert least <= steps <= 2 * least, (name, steps)
        assert after["kog_tokens"] - before["kog_tokens"] >= max_tokens - 1


def test_stop_token_mid_sampled_burst(engines):
    """A stop id ends a sampled K = 32 burst exactly where K = 1 ends."""
    from vllm import SamplingParams

    one, burst = engines
    vocab = one.llm_engine.model_config.get_vocab_size()
    prompt = random_prompts(1, [24], vocab, seed=32)
    cfg = dict(seed=7, max_tokens=64, ignore_eos=True, **SETTINGS["llama-generation-config"])
    free = token_ids(one.generate(prompt, SamplingParams(**cfg), use_tqdm=False))[0]
    stop_at = next(i for i in range(6, len(free)) if free[i] not in free[:i] and i % 4 != 0)
    for llm in (one, burst):
        out = llm.generate(prompt, SamplingParams(stop_token_ids=[free[stop_at]], **cfg), use_tqdm=False)[0].outputs[0]
        assert list(out.token_ids) == free[: stop_at + 1]
        assert out.finish_reason == "stop"


def test_default_request_takes_the_burst_path(engines):
    """A request that sets no sampling field gets the checkpoint's generation config (vLLM applies it) and runs in
    bursts: about (tokens - 1) / K kog steps, none of them one-token steps."""
    _, burst = engines
    sp = burst.get_default_sampling_params()
    assert sp.temperature > 0 and (sp.top_p < 1 or sp.top_k > 0), sp
    sp.max_tokens, sp.ignore_eos = 256, True
    vocab = burst.llm_engine.model_config.get_vocab_size()
    before = kog_stats(burst)
    out = burst.generate(random_prompts(1, [40], vocab, seed=33), sp, use_tqdm=False)
    after = kog_stats(burst)
    assert len(out[0].outputs[0].token_ids) == 256
    steps = after["kog_steps"] - before["kog_steps"]
    assert steps <= 2 * -(-255 // K), steps
    assert after["fallback_steps"] - before["fallback_steps"] == 1  # the prefill


@pytest.mark.parametrize("extra", [dict(allowed_token_ids=list(range(100, 140))), dict(logit_bias={7: 100.0}),
                                   dict(min_tokens=20)], ids=["allowed_token_ids", "logit_bias", "min_tokens"])
def test_sampler_state_requests_run_one_token_per_step(engines, extra):
    """Requests whose draw reads vLLM's sampler state a burst does not reproduce stay on the kog path one token per
    step (counted), with vLLM's sampler applying it to the kernel's logits: same tokens at K = 1 and K = 32."""
    from vllm import SamplingParams

    one, burst = engines
    vocab = one.llm_engine.model_config.get_vocab_size()
    prompt = random_prompts(1, [20], vocab, seed=34)
    sp = SamplingParams(seed=5, max_tokens=40, temperature=0.8, **extra)
    want = token_ids(one.generate(prompt, sp, use_tqdm=False))[0]
    before = kog_stats(burst)
    got = token_ids(burst.generate(prompt, sp, use_tqdm=False))[0]
    after = kog_stats(burst)
    assert got == want
    if "allowed_token_ids" in extra:
        assert set(got) <= set(extra["allowed_token_ids"])
    if "logit_bias" in extra:
        assert got.count(7) >= len(got) - 1
    singles = sum(after["single_token_steps"].values()) - sum(before["single_token_steps"].values())
    assert after["kog_steps"] - before["kog_steps"] == len(got) - 1 == singles
