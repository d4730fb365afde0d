"""Greedy parity of the kog path with stock vLLM, with bf16 near-ties told apart from bugs.

For each shape: stock decodes freely (tokens S, logits L_s); kog decodes freely (tokens G); kog decodes again with
its tokens forced to S (logits L_k). Required: |L_k - L_s| <= ATOL at every step and vocabulary entry; every step
where argmax(L_k) != S has a stock top-2 margin <= 2*ATOL; and G == S, or G first differs from S at such a step.
ATOL (absolute, on bf16 logits of magnitude ~1-10; per shape where stock's own rounding needs more) is stated
below and overridable with KOG_LOGIT_ATOL / KOG_LOGIT_ATOL_8B.
"""

from __future__ import annotations

import os

import pytest

from teacher_forcing import compare, record
from vllm_helpers import engine_kwargs, first_mismatch, kog_kwargs, random_prompts

pytestmark = pytest.mark.vllm_gpu

# Measured on an H200, torch step vs stock (eager), llama-3.2-1b shape, 128 steps: max |dlogit| = 0.156 (2.5 bf16
# ulps at |logit| 8-16), 10 flips, all at stock top-2 margins <= 0.0625 (6 of them exact bf16 ties).
# Llama-3.1-8B shape (32 layers, untied random head), on an H200, 128 steps: torch step vs stock max |dlogit| =
# 0.5625, monokernel vs stock 0.544 (27 flips, all explained); its bound is set from the torch step, which follows
# stock's recipe op for op, so the kernel is held to what stock's own rounding allows.
# Over 256 steps (H200): 1B monokernel 0.161, Qwen3-1.7B monokernel 0.211 (under 0.25); 8B torch step 0.621 and
# monokernel 0.606, past the 128-step bound of 0.6 (the maximum grows with the steps), so the 8B bound is 0.75: the
# torch step's 256-step maximum plus ~20%.
ATOL = float(os.environ.get("KOG_LOGIT_ATOL", "0.25"))
SHAPE_ATOL = {"llama-3.1-8b": float(os.environ.get("KOG_LOGIT_ATOL_8B", "0.75"))}
# The shapes the derived tiling opened take the 8B's bound (28-64 layers, untied or tied heads of 32k-152k rows)
# until measured: run them with KOG_TF_IMPLS=torch,monokernel, the torch step following stock's recipe op for op
# shows how far stock's own rounding spreads at that shape; KOG_LOGIT_ATOL_NEW overrides.
for _name in ("qwen3-4b", "qwen3-14b", "qwen2.5-coder-7b", "qwen2.5-coder-32b", "mistral-7b", "llama-3.2-3b",
              "qwen2.5-coder-1.5b", "qwen3-32b"):
    SHAPE_ATOL[_name] = float(os.environ.get("KOG_LOGIT_ATOL_NEW", "0.75"))
# gpu_memory_utilization per shape: 0.25 of an 80 GB card holds up to the 8B-class weights (~15 GB) and their KV
# cache; the 14B (29.5 GB) and 32B (65.5 GB) shapes need more, the 32B a short context.
SHAPE_MEMORY = {"qwen3-14b": (0.5, None), "qwen3-32b": (0.92, 4096), "qwen2.5-coder-32b": (0.92, 4096)}
# Checkpoints larger than the device's 64 GB disk: config and tokenizer only, vLLM's load_format="dummy", then every
# parameter redrawn in place from a seeded normal (teacher_forcing.seed_weights) in each engine.
DUMMY_LOAD = {"qwen3-32b", "qwen2.5-coder-32b"}
# Issue 3 asks for 256-token greedy outputs.
NEW_TOKENS = int(os.environ.get("KOG_TF_TOKENS", "256"))
SHAPES = os.environ.get("KOG_TF_SHAPES", "llama-3.2-1b").split(",")
IMPLS = os.environ.get("KOG_TF_IMPLS", "torch,monokernel").split(",")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("prompt_len", [32])
def test_greedy_parity_under_teacher_forcing(checkpoint, shape, prompt_len, impl):
    util, max_len = SHAPE_MEMORY.get(shape, (0.25, None))
    kw = dict(gpu_memory_utilization=util, skip_tokenizer_init=True)
    if max_len is not None:
        kw["max_model_len"] = max_len
    from transformers import AutoConfig

    reseed = None
    if shape in DUMMY_LOAD:
        from kog_backend.tools.fixtures.checkpoints import write_dummy

        model = write_dummy(shape, os.path.join(os.environ.get("KOG_TEST_CKPT_DIR", "/tmp/kog-test-ckpt"), shape + "-dummy"))
        kw["load_format"] = "dummy"
        reseed = (0, float(AutoConfig.from_pretrained(model).initializer_range))
    else:
        model = checkpoint(shape)
    vocab = AutoConfig.from_pretrained(model).vocab_size
    prompt = random_prompts(1, [prompt_len], vocab, seed=11)[0]["prompt_token_ids"]
    stock = record(model, engine_kwargs(**kw), prompt, NEW_TOKENS, reseed=reseed)
    kog = kog_kwargs({"step_impl": impl}, **kw)
    free = record(model, kog, prompt, NEW_TOKENS, reseed=reseed)
    forced = record(model, kog, prompt, NEW_TOKENS, force=stock.tokens, reseed=reseed)
    atol = SHAPE_ATOL.get(shape, ATOL)
    c = compare(stock, forced, atol)
    c.first_free_mismatch = first_mismatch(free.tokens, stock.tokens)
    print(f"\n[{shape} {impl}] steps={c.steps} max|dlogit|={c.max_abs_diff:.4f} flips={c.flips} "
          f"free-run first mismatch={c.first_free_mismatch} kog={forced.kog_stats}")
    assert forced.kog_stats["kog_steps"] == NEW_TOKENS - 1, forced.kog_stats
    assert c.max_abs_diff <= atol, c
    assert not c.unexplained, c
    if c.first_free_mismatch is not None:
        assert c.first_free_mismatch in {i for i, _ in c.flips}, c
