"""Greedy parity of the kog path with stock vLLM, with bf16 near-ties told apart from bugs.

For each shape: stock decodes freely (tokens S, logits L_s); kog decodes freely (tokens G); kog decodes again with
its tokens forced to S (logits L_k). Required: |L_k - L_s| <= ATOL at every step and vocabulary entry; every step
where argmax(L_k) != S has a stock top-2 margin <= 2*ATOL; and G == S, or G first differs from S at such a step.
ATOL (absolute, on bf16 logits of magnitude ~1-10; per shape where stock's own rounding needs more) is stated
below and overridable with KOG_LOGIT_ATOL / KOG_LOGIT_ATOL_8B.

FP8 checkpoints (KOG_TF_FP8=block,channel,tensor, with KOG_TF_SHAPES): test_fp8_parity_under_teacher_forcing, whose
docstring states its bounds.
"""

from __future__ import annotations

import json
import os

import pytest

from teacher_forcing import FP8_MAX_RELATIVE, FP8_SPREAD, compare, fp8_parity_failures, record
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
# The 48-layer Qwen3-30B-A3B shape adds routes that a near tie of its router logits may flip (its tiny
# 2-4-layer MoE checkpoints keep the 1B's bound).
for _name in ("qwen3-4b", "qwen3-14b", "qwen2.5-coder-7b", "qwen2.5-coder-32b", "mistral-7b", "llama-3.2-3b",
              "qwen2.5-coder-1.5b", "qwen3-32b", "qwen3-30b-a3b"):
    SHAPE_ATOL[_name] = float(os.environ.get("KOG_LOGIT_ATOL_NEW", "0.75"))
# gpu_memory_utilization per shape: 0.25 of an 80 GB card holds up to the 8B-class weights (~15 GB) and their KV
# cache; the 14B (29.5 GB) and 32B (65.5 GB) shapes need more, the 32B a short context.
SHAPE_MEMORY = {"qwen3-14b": (0.5, None), "qwen3-32b": (0.92, 4096), "qwen2.5-coder-32b": (0.92, 4096),
                "qwen3-30b-a3b": (0.92, 2048)}
# Checkpoints larger than the device's 64 GB disk: config and tokenizer only, vLLM's load_format="dummy", then every
# parameter redrawn in place from a seeded normal (teacher_forcing.seed_weights) in each engine.
DUMMY_LOAD = {"qwen3-32b", "qwen2.5-coder-32b", "qwen3-30b-a3b"}
# Issue 3 asks for 256-token greedy outputs.
NEW_TOKENS = int(os.environ.get("KOG_TF_TOKENS", "256"))
SHAPES = os.environ.get("KOG_TF_SHAPES", "llama-3.2-1b").split(",")
IMPLS = os.environ.get("KOG_TF_IMPLS", "torch,monokernel").split(",")
# More kog options for the kog engines, a JSON object (e.g. '{"moe_kernel": true}' for a Qwen3-MoE shape).
EXTRA_OPTIONS = json.loads(os.environ.get("KOG_TF_OPTIONS", "{}"))
# FP8 layouts whose checkpoint (`kog make-checkpoint --fp8`) of each shape is run; none by default.
FP8_LAYOUTS = [x for x in os.environ.get("KOG_TF_FP8", "").split(",") if x]


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
    kog = kog_kwargs({"step_impl": impl, **EXTRA_OPTIONS}, **kw)
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


@pytest.mark.parametrize("layout", FP8_LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_fp8_parity_under_teacher_forcing(checkpoint, shape, layout):
    """The FP8 monokernel against stock vLLM on the shape's FP8 checkpoint (`kog make-checkpoint --fp8 LAYOUT`).

    Stock on Hopper does not compute what kog computes: it quantises every projection's input activations to FP8
    (e4m3 per token, per 128-column group for the block layout: CUTLASS / DeepGEMM W8A8, reference/fp8_linear.py
    names the lines), each element rounded by up to 2^-4 of itself, while kog multiplies the FP8 weights with bf16
    activations. Their logits then differ by more than the bf16 bounds above, by an amount no bf16 measurement
    gives. So the bound is measured in each run, on the same checkpoint and forced tokens:

      stock      free run: tokens S, logits L_s (FP8 activations)
      reference  kog's torch step (step_impl torch) forced to S: L_r, from vLLM's own loaded FP8 weights and scales,
                 dequantised in fp32 with bf16 activations (torch_step.project, fp8_linear): what the kernel is to
                 compute, in stock's op order for everything else
      kog        the monokernel free (tokens G) and forced to S (L_k)

    Required:
      - |L_k - L_r| <= ATOL (the shape's bf16 bound above: the kernel and the reference compute the same sums in
        another order), and every step where argmax(L_k) != argmax(L_r) has a reference top-2 margin <= 2 ATOL;
      - |L_k - L_s| <= FP8_SPREAD x d + ATOL, d = max |L_r - L_s| measured here (stock's own FP8-activation
        spread), every argmax flip against S at a stock top-2 margin <= twice that bound, and G == S or G first
        differs from S at such a flip. By the triangle inequality |L_k - L_s| <= |L_k - L_r| + d, so the first
        check implies this one at FP8_SPREAD = 1; the 25% above it is the margin this bound would need if the
        reference were measured in another run (as the bf16 8B bound sits ~20% above its measured maximum);
      - the reference within FP8_MAX_RELATIVE (relative L2, per step) of stock: a guard against a reference and a
        kernel that agree on a wrong dequantisation (a misapplied scale leaves logits unrelated to stock's,
        ~1.41 apart), not a tolerance.
    Both the reference and kog runs must decode every step on the kog path (a refused FP8 model would leave the
    reference equal to stock and the test vacuous). The measured d and relative distance are printed: the first
    GPU runs record them.
    """
    if shape in DUMMY_LOAD:
        pytest.skip(f"{shape}: FP8 teacher forcing needs the checkpoint's weights (seed_weights redraws bf16 only)")
    util, max_len = SHAPE_MEMORY.get(shape, (0.25, None))
    kw = dict(gpu_memory_utilization=util, skip_tokenizer_init=True)
    if max_len is not None:
        kw["max_model_len"] = max_len
    from transformers import AutoConfig

    model = checkpoint(shape, fp8=layout)
    vocab = AutoConfig.from_pretrained(model).vocab_size
    prompt = random_prompts(1, [32], vocab, seed=11)[0]["prompt_token_ids"]
    stock = record(model, engine_kwargs(**kw), prompt, NEW_TOKENS)
    reference = record(model, kog_kwargs({"step_impl": "torch"}, **kw), prompt, NEW_TOKENS, force=stock.tokens)
    kog = kog_kwargs({"step_impl": "monokernel", "fp8_weights": True}, **kw)  # (the FP8 kernel is opt-in)
    free = record(model, kog, prompt, NEW_TOKENS)
    forced = record(model, kog, prompt, NEW_TOKENS, force=stock.tokens)
    atol = SHAPE_ATOL.get(shape, ATOL)
    p, failures = fp8_parity_failures(stock, reference, free, forced, atol)
    print(f"\n[{shape} fp8-{layout}] steps={p.vs_stock.steps} stock vs reference: max|dlogit|={p.stock_vs_reference:.4f} "
          f"relative={p.relative:.4f} (guard {FP8_MAX_RELATIVE}); kog vs reference: "
          f"max|dlogit|={p.vs_reference.max_abs_diff:.4f} (bound {atol}) flips={p.vs_reference.flips}; kog vs stock: "
          f"max|dlogit|={p.vs_stock.max_abs_diff:.4f} (bound {FP8_SPREAD} x d + {atol} = {p.kog_stock_bound:.4f}) "
          f"flips={len(p.vs_stock.flips)} free-run first mismatch={p.vs_stock.first_free_mismatch} kog={forced.kog_stats}")
    assert reference.kog_stats["kog_steps"] == NEW_TOKENS - 1, reference.kog_stats
    assert forced.kog_stats["kog_steps"] == NEW_TOKENS - 1, forced.kog_stats
    assert not failures, (failures, p)
