"""The one gate every engine step passes through: kog path or stock.

Three levels, each returning None (eligible) or a reason string that is logged once and counted:
  server_unsupported_reason(vllm_config)        parallelism, LoRA, speculative decoding, KV dtype, ...
  request_unsupported_reason(sampling_params, lora_request)
                                                what a request asks for that the kog path does not do
  step_unsupported_reason(scheduler_output, request_reasons, prompt_lens)
                                                exactly one request, decoding one token (its last known token,
                                                within the tested context range), nothing else
and, once the KV cache exists, kv_cache_unsupported_reason(kv_cache, head_dim): a layout the kernel does not know.
All TP ranks see the same SchedulerOutput and config, so they take the same decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

GREEDY_TEMPERATURE = 1e-5  # vLLM's SamplingParams: temperature below this is greedy

# The longest context, in positions (the step's own token included), at which the kog path is checked against its
# reference: the longest case of integration_tests/test_monokernel_long_context_gpu.py, which imports this constant.
# A step whose context is longer runs stock, and a burst never computes past it (runner.burst_length's cap).
MAX_TESTED_CONTEXT = 131072
# KV-cache block sizes (positions per block) the kernel tests cover (the same test file); vLLM's default is 16.
TESTED_BLOCK_SIZES = (16, 32, 64, 128)

# Reasons a request can never take the kog path. Keys are the SamplingParams fields; `kog doctor` lists them.
REQUEST_FEATURES = {
    "logprobs": "logprobs requested",
    "prompt_logprobs": "prompt logprobs requested",
    "structured_outputs": "structured output (guided decoding)",
    "lora": "LoRA adapter",
    "pooling": "pooling request",
}

# Everything else a request may ask for runs on the kog path, K tokens per engine step: greedy, and temperature with
# top-k, top-p and min-p, seeded or not, drawn inside the monokernel exactly as vLLM's sampler draws them
# (csrc/include/kog/burst_sampling.cuh; a token whose draw depends on vLLM's own rounding is drawn by vLLM's
# sampler on the kernel's logits); EOS, stop ids, stop strings, max_tokens stay vLLM's (scheduler and detokenizer).
KOG_PATH_FEATURES = (
    "greedy",
    "temperature / top-k / top-p / min-p (in K-token bursts, vLLM's draws)",
    "repetition / frequency / presence penalty (in K-token bursts, vLLM's arithmetic)",
    "seed",
    "stop, stop_token_ids, ignore_eos, max_tokens",
    "logit_bias, allowed_token_ids, bad_words, min_tokens (one token per engine step, vLLM's sampler)",
)

# Reasons a request that runs on the kog path does so one token per engine step (vLLM's sampler on the kernel's
# logits) instead of in K-token bursts. Counted per step like the stock reasons.
BURST_REASONS = {
    "option": "sampled bursts off (kog option sampled_bursts)",
    "fp64_gumbel": "vLLM draws with fp64 Gumbel noise (the kernel draws vLLM's fp32 noise)",
    "no_monokernel": "sampled bursts need the monokernel",
    "filters": "top-k/top-p/min-p bursts unavailable",  # + the monokernel's reason
    "penalties": "penalty bursts unavailable",  # + the monokernel's reason
    # What vLLM's sampler applies from its own per-request state that a burst does not reproduce: the kernel's
    # logits of one token go through vLLM's sampler instead.
    "logit_bias": "logit_bias",
    "allowed_token_ids": "allowed_token_ids",
    "bad_words": "bad_words",
    "min_tokens": "min_tokens > 0",
}

# Reasons a single step runs stock (the request itself may be eligible). Values are the counted reasons.
STEP_REASONS = {
    "batch": "batch of several requests",
    "idle": "no request scheduled",
    "prefill": "prefill",
    "speculative": "speculative tokens scheduled",
    "encoder": "encoder inputs scheduled",
    "unknown_request": "request unknown to the kog runner",
    "long_context": f"context beyond {MAX_TESTED_CONTEXT} positions (the kog path's tested range)",
}

SERVER_FEATURES = {
    "pipeline_parallel": "pipeline parallelism",
    "data_parallel": "data parallelism",
    "decode_context_parallel": "decode context parallelism",
    "lora": "LoRA enabled on the server",
    "speculative": "speculative decoding configured",
    "kv_cache_dtype": "KV-cache dtype differs from the model's",
    "model_dtype": "model dtype is not bf16",
    "encoder_decoder": "encoder-decoder model",
    "multimodal": "multimodal model",
    "pooling": "pooling model",
}


def request_unsupported_reason(sampling_params: Any, lora_request: Any = None, pooling_params: Any = None) -> str | None:
    if pooling_params is not None or sampling_params is None:
        return REQUEST_FEATURES["pooling"]
    sp = sampling_params
    if lora_request is not None:
        return REQUEST_FEATURES["lora"]
    if sp.logprobs is not None:
        return REQUEST_FEATURES["logprobs"]
    if sp.prompt_logprobs is not None:
        return REQUEST_FEATURES["prompt_logprobs"]
    if sp.structured_outputs is not None:
        return REQUEST_FEATURES["structured_outputs"]
    return None


def request_single_token_reason(sampling_params: Any) -> str | None:
    """Why a request on the kog path runs one token per engine step whatever the kernel can do (vLLM's sampler
    applies these from its own state to the kernel's logits), or None."""
    sp = sampling_params
    if sp is None:
        return None
    if sp.logit_bias:
        return BURST_REASONS["logit_bias"]
    if sp.allowed_token_ids:
        return BURST_REASONS["allowed_token_ids"]
    if sp.bad_words or getattr(sp, "bad_words_token_ids", None):
        return BURST_REASONS["bad_words"]
    if sp.min_tokens and sp.min_tokens > 0:
        return BURST_REASONS["min_tokens"]
    return None


def step_unsupported_reason(
    scheduler_output: Any,
    request_reasons: Mapping[str, str | None],
    dummy_run: bool = False,
    prompt_lens: Mapping[str, int] | None = None,
    max_context: int = MAX_TESTED_CONTEXT,
) -> str | None:
    """None when the step is one request decoding one token on the kog path. Where the request is in the step's
    scheduled_cached_reqs (every step but its first), its position is checked too: the scheduled token must be its
    last known one (num_computed_tokens + 1 == prompt length + outputs; a prefill chunk of one token that is not
    the prompt's last is a prefill, the final one-token chunk of a chunked prefill decodes), and the context
    (position + 1) at most max_context. prompt_lens: request id -> prompt length (tokens), as the runner recorded
    it; without it only the context length is checked."""
    if dummy_run:
        return "dummy run"
    num_reqs = len(scheduler_output.num_scheduled_tokens)
    if num_reqs != 1:
        return STEP_REASONS["batch"] if num_reqs > 1 else STEP_REASONS["idle"]
    if scheduler_output.scheduled_new_reqs or scheduler_output.total_num_scheduled_tokens != 1:
        return STEP_REASONS["prefill"]
    if scheduler_output.scheduled_spec_decode_tokens:
        return STEP_REASONS["speculative"]
    if scheduler_output.scheduled_encoder_inputs:
        return STEP_REASONS["encoder"]
    if scheduler_output.has_structured_output_requests:
        return REQUEST_FEATURES["structured_outputs"]
    (req_id,) = scheduler_output.num_scheduled_tokens
    if req_id not in request_reasons:
        return STEP_REASONS["unknown_request"]
    if request_reasons[req_id] is not None:
        return request_reasons[req_id]
    cached = scheduler_output.scheduled_cached_reqs
    if cached is not None and req_id in cached.req_ids:
        i = cached.req_ids.index(req_id)  # one request: a list of one
        position = cached.num_computed_tokens[i]
        prompt_len = (prompt_lens or {}).get(req_id)
        if prompt_len is not None and position + 1 < prompt_len + cached.num_output_tokens[i]:
            return STEP_REASONS["prefill"]
        if position + 1 > max_context:
            return STEP_REASONS["long_context"]
    return None


def server_unsupported_reason(vllm_config: Any) -> str | None:
    pc = vllm_config.parallel_config
    mc = vllm_config.model_config
    if pc.pipeline_parallel_size != 1:
        return SERVER_FEATURES["pipeline_parallel"]
    if pc.data_parallel_size != 1:
        return SERVER_FEATURES["data_parallel"]
    if getattr(pc, "decode_context_parallel_size", 1) != 1 or getattr(pc, "prefill_context_parallel_size", 1) != 1:
        return SERVER_FEATURES["decode_context_parallel"]
    if vllm_config.lora_config is not None:
        return SERVER_FEATURES["lora"]
    if vllm_config.speculative_config is not None:
        return SERVER_FEATURES["speculative"]
    if mc is None:
        return "no model config"
    if getattr(mc, "is_encoder_decoder", False):
        return SERVER_FEATURES["encoder_decoder"]
    if getattr(mc, "is_multimodal_model", False):
        return SERVER_FEATURES["multimodal"]
    if getattr(mc, "runner_type", "generate") != "generate":
        return SERVER_FEATURES["pooling"]
    import torch

    if mc.dtype != torch.bfloat16:
        return f"{SERVER_FEATURES['model_dtype']} ({mc.dtype})"
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype not in ("auto", "bfloat16"):
        return f"{SERVER_FEATURES['kv_cache_dtype']} ({cache_dtype})"
    return None


def kv_cache_unsupported_reason(kv_cache: Any, head_dim: int) -> str | None:
    """Why one layer's KV cache is not a layout the kernel knows, or None. Known: vLLM's flash layout (FLASH_ATTN,
    TRITON_ATTN), logical [num_blocks, num_kv_heads, block_size, 2 * head_dim] bf16, K in [..., :head_dim], V in
    [..., head_dim:], in NHD memory order ([blocks][block_size][kv_heads][2D], vLLM's default) or HND
    ([blocks][kv_heads][block_size][2D], VLLM_KV_CACHE_LAYOUT=HND) within a block, a block stride of at least one
    page (vLLM pads or packs pages for some configurations; the kernel reads the stride), and a block size in
    TESTED_BLOCK_SIZES. Element units throughout (bf16)."""
    shape = tuple(kv_cache.shape)
    if len(shape) != 4 or shape[3] != 2 * head_dim:
        return f"KV-cache layout: shape {shape} is not the flash layout [blocks, kv_heads, block, 2*{head_dim}]"
    _, nkv, bs, d2 = shape
    strides = tuple(kv_cache.stride())
    nhd = (d2, nkv * d2, 1)  # within a block; the block stride may exceed a page (vLLM's padded or packed pages)
    hnd = (bs * d2, d2, 1)
    if strides[1:] not in (nhd, hnd) or strides[0] < nkv * bs * d2:
        return (f"KV-cache layout: strides {strides} of shape {shape} are neither NHD (*, {nhd}) nor HND (*, {hnd}) "
                "with whole pages")
    if bs not in TESTED_BLOCK_SIZES:
        return f"KV-cache block size {bs} (tested: {', '.join(map(str, TESTED_BLOCK_SIZES))})"
    return None


@dataclasses.dataclass(frozen=True)
class BurstSampling:
    """A sampled (or penalised) request's draw as vLLM's SamplingStates and PenaltiesState hold it (fp32 values;
    temperature 0 = greedy, top_k 0 = off, top_p 1 = off, penalties at 1 / 0 / 0 = off)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def draw_kwargs(self, device: Any, penalty_rows: tuple[Any, Any] | None = None) -> dict[str, Any]:
        """Monokernel.generate's arguments for this draw; a filtered draw gets a fresh zeroed defer_out. A penalised
        one needs penalty_rows: (prompt_mask, output_counts), the request's rows of vLLM's PenaltiesState."""
        kw: dict[str, Any] = {"temperature": self.temperature}
        if self.filtered:
            import torch

            kw.update(top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                      defer_out=torch.zeros(1, dtype=torch.int32, device=device))
        if self.penalized:
            if penalty_rows is None:
                raise ValueError("a penalised draw needs the request's PenaltiesState rows")
            kw.update(prompt_mask=penalty_rows[0], output_counts=penalty_rows[1],
                      repetition_penalty=self.repetition_penalty, frequency_penalty=self.frequency_penalty,
                      presence_penalty=self.presence_penalty)
        return kw


def burst_sampling(sampling_params: Any, vocab_size: int) -> BurstSampling | None:
    """The draw a burst reproduces for this request, normalised as vLLM 0.26's SamplingStates and PenaltiesState
    do (top_k <= 0 or >= vocab_size: off; fp32 temperature, top_p, min_p and penalties; a greedy request has no
    filters), or None for a greedy request without penalties (the greedy kernel). What else a request may ask for
    is refused by request_unsupported_reason or keeps it at one token per step (request_single_token_reason)."""
    sp = sampling_params
    if sp is None:
        return None
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    penalties = (f32(sp.repetition_penalty), f32(sp.frequency_penalty), f32(sp.presence_penalty))
    if sp.temperature < GREEDY_TEMPERATURE:
        return BurstSampling(0.0, 0, 1.0, 0.0, *penalties) if penalties != (1.0, 0.0, 0.0) else None
    top_k = int(sp.top_k or 0)
    top_k = 0 if top_k <= 0 or top_k >= vocab_size else top_k
    top_p = f32(sp.top_p)
    return BurstSampling(f32(sp.temperature), top_k, 1.0 if top_p == 1.0 else top_p, f32(sp.min_p), *penalties)

