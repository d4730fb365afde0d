"""What a request asks for: the features that keep it on the stock path for its whole life.

Checked once, when the request is added (its SamplingParams); every step of it then counts the reason. What a
request may ask for and still run on the kog path is KOG_PATH_FEATURES; burst.py says which of those take one
token per engine step instead of K.
"""

from __future__ import annotations

from typing import Any

# Keys are the SamplingParams fields (or what the request carries); the values are the counted reasons.
REQUEST_FEATURES = {
    "logprobs": "logprobs requested",
    "prompt_logprobs": "prompt logprobs requested",
    "structured_outputs": "structured output (guided decoding)",
    "lora": "LoRA adapter",
    "pooling": "pooling request",
}
REASONS = REQUEST_FEATURES

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


def request_unsupported_reason(sampling_params: Any, lora_request: Any = None,
                               pooling_params: Any = None) -> str | None:
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
