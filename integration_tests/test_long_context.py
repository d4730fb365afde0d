"""Long prompts, prefix-cache hits and chunked prefills inside vLLM, decoded on the kog path.

Each teacher-forcing test runs the method and bounds of test_teacher_forcing.py (teacher_forcing.parity_failures):
stock decodes freely, kog decodes freely, kog decodes again with stock's tokens forced, and kog's logits must stay
within ATOL of stock's at every step with every argmax flip at a stock near-tie. Both sides run the same request
history (the same earlier requests filling the prefix cache, the same chunking), so they read the same cached
blocks. One token per engine step (K = 1: vLLM's sampler, whose tokens teacher forcing replaces); the burst test
checks K = 32 against K = 1 token for token after the same hits and chunks.

  test_prefix_cache_hit_then_kog_decode   an earlier request fills the prefix cache (a shared 768-token prefix, or
                                          the whole prompt): the recorded request's prompt hits it
  test_chunked_prefill_then_kog_decode    max_num_batched_tokens 256: the prompt is prefilled in chunks, the last of
                                          100 tokens or of 1 token (which the kog path computes itself)
  test_long_prompt_teacher_forcing        a KOG_LONG_PROMPT-token prompt (default 32768), KOG_LONG_STEPS steps
                                          (default 128)
  test_bursts_after_hit_and_chunks        K = 32 bursts (KogScheduler) after both, token-identical to K = 1

Environment: KOG_LONG_SHAPE (default llama-3.2-1b), KOG_LONG_IMPL (monokernel | torch, default monokernel),
KOG_LONG_TOKENS (steps of the short-prompt tests, default 128), KOG_LOGIT_ATOL as test_teacher_forcing.py.
"""

from __future__ import annotations

import os

import pytest

from teacher_forcing import parity_failures, record
from test_teacher_forcing import ATOL, SHAPE_ATOL
from vllm_helpers import engine_kwargs, first_mismatch, kog_kwargs, kog_stats, random_prompts, run_in_spawned_child

pytestmark = pytest.mark.vllm_gpu

SHAPE = os.environ.get("KOG_LONG_SHAPE", "llama-3.2-1b")
IMPL = os.environ.get("KOG_LONG_IMPL", "monokernel")
NEW_TOKENS = int(os.environ.get("KOG_LONG_TOKENS", "128"))
LONG_PROMPT = int(os.environ.get("KOG_LONG_PROMPT", "32768"))
LONG_STEPS = int(os.environ.get("KOG_LONG_STEPS", "128"))
CHUNK = 256  # max_num_batched_tokens of the chunked-prefill tests (tokens per engine step)
BLOCK = 16  # vLLM's default KV block size: prefix-cache hits come in whole blocks
SCHEDULER = "kog_backend.engine.scheduler.KogScheduler"


def _vocab(model: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model).vocab_size


def _teacher_forcing(model: str, prompt: list[int], steps: int, warm=None, **kw):
    """(stock, kog free, kog forced) recordings of one greedy request, each in a fresh engine with the same
    earlier requests `warm`; asserts parity and that every decode step ran on the kog path."""
    stock = record(model, engine_kwargs(**kw), prompt, steps, warm=warm)
    kog = kog_kwargs({"step_impl": IMPL, "tokens_per_step": 1}, **kw)
    free = record(model, kog, prompt, steps, warm=warm)
    forced = record(model, kog, prompt, steps, force=stock.tokens, warm=warm)
    atol = SHAPE_ATOL.get(SHAPE, ATOL)
    c, failures = parity_failures(stock, free, forced, atol)
    print(f"\n[{SHAPE} {IMPL} prompt {len(prompt)}] steps={c.steps} max|dlogit|={c.max_abs_diff:.4f} "
          f"flips={c.flips} free-run first mismatch={c.first_free_mismatch} cached={forced.num_cached_tokens} "
          f"kog={forced.kog_stats}")
    assert not forced.kog_stats.get("disabled_reason"), forced.kog_stats
    assert not failures, (failures, c)
    return stock, free, forced


@pytest.mark.parametrize("hit", ["shared_prefix", "whole_prompt"])
def test_prefix_cache_hit_then_kog_decode(checkpoint, hit):
    model = checkpoint(SHAPE)
    prompt, other = random_prompts(2, [1000], _vocab(model), seed=31)
    prompt = prompt["prompt_token_ids"]
    # shared_prefix: an earlier prompt with the same first 768 tokens (48 blocks), then other tokens
    warm = [prompt[:768] + other["prompt_token_ids"][:200]] if hit == "shared_prefix" else [prompt]
    want_cached = 768 if hit == "shared_prefix" else (len(prompt) - 1) // BLOCK * BLOCK
    stock, _, forced = _teacher_forcing(model, prompt, NEW_TOKENS, warm=warm, enable_prefix_caching=True)
    assert stock.num_cached_tokens == forced.num_cached_tokens == want_cached, (stock.num_cached_tokens,
                                                                                forced.num_cached_tokens)
    # The hit's prefill (the request's first step) is stock's; every later token is a kog step.
    assert forced.kog_stats["kog_steps"] == NEW_TOKENS - 1, forced.kog_stats


@pytest.mark.parametrize("last_chunk", [100, 1])
def test_chunked_prefill_then_kog_decode(checkpoint, last_chunk):
    model = checkpoint(SHAPE)
    prompt = random_prompts(1, [4 * CHUNK + last_chunk], _vocab(model), seed=32)[0]["prompt_token_ids"]
    _, _, forced = _teacher_forcing(model, prompt, NEW_TOKENS, max_num_batched_tokens=CHUNK,
                                    enable_chunked_prefill=True, enable_prefix_caching=False)
    # A last chunk of one token is the prompt's last token alone: the kog path computes it (its logits give the
    # first output token). Longer chunks are stock prefills.
    want = NEW_TOKENS if last_chunk == 1 else NEW_TOKENS - 1
    assert forced.kog_stats["kog_steps"] == want, forced.kog_stats
    assert forced.kog_stats["fallbacks"].get("prefill", 0) >= 4, forced.kog_stats


def test_long_prompt_teacher_forcing(checkpoint):
    model = checkpoint(SHAPE)
    prompt = random_prompts(1, [LONG_PROMPT], _vocab(model), seed=33)[0]["prompt_token_ids"]
    max_len = -(-(LONG_PROMPT + LONG_STEPS + 64) // BLOCK) * BLOCK
    _, _, forced = _teacher_forcing(model, prompt, LONG_STEPS, max_model_len=max_len, enable_prefix_caching=False)
    assert forced.kog_stats["kog_steps"] == LONG_STEPS - 1, forced.kog_stats


def _burst_tokens(queue, model: str, k: int, prompts: list[list[int]], max_tokens: int) -> None:
    from vllm import LLM, SamplingParams

    extra = dict(scheduler_cls=SCHEDULER) if k > 1 else {}
    kw = kog_kwargs({"step_impl": IMPL, "tokens_per_step": k}, async_scheduling=False, enable_prefix_caching=True,
                    max_num_batched_tokens=CHUNK, enable_chunked_prefill=True, gpu_memory_utilization=0.2, **extra)
    llm = LLM(model=model, **kw)
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    out = []
    for p in prompts:  # one at a time: each decodes alone (the kog path)
        before = kog_stats(llm)
        res = llm.generate([{"prompt_token_ids": p}], sp)[0]
        after = kog_stats(llm)
        out.append((list(res.outputs[0].token_ids), res.num_cached_tokens,
                    after["kog_tokens"] - before["kog_tokens"], after["disabled_reason"]))
    queue.put(out)


def test_bursts_after_hit_and_chunks(checkpoint):
    """K = 32 after a prefix-cache hit and after chunked prefills (last chunk 100 tokens, 1 token) gives K = 1's
    tokens, with every decoded token on the kog path."""
    model = checkpoint(SHAPE)
    a, b, c = (p["prompt_token_ids"] for p in random_prompts(3, [4 * CHUNK + 100, 4 * CHUNK + 1, 600],
                                                              _vocab(model), seed=34))
    prompts = [a, b, a[:512] + c]  # the third hits the first's 512-token prefix
    runs = {k: run_in_spawned_child(_burst_tokens, model, k, prompts, NEW_TOKENS, timeout=480) for k in (1, 32)}
    for i, ((tok1, cached1, kog1, off1), (tok32, cached32, kog32, off32)) in enumerate(zip(runs[1], runs[32])):
        assert off1 is None and off32 is None, (off1, off32)
        assert tok32 == tok1, f"prompt {i}: K=32 first differs from K=1 at {first_mismatch(tok32, tok1)}"
        want_kog = NEW_TOKENS if i == 1 else NEW_TOKENS - 1  # prompt 1's last prefill chunk is one token
        assert kog1 == kog32 == want_kog, (i, kog1, kog32)
    assert runs[1][2][1] == runs[32][2][1] == 512, "the third prompt hit the first's prefix"
