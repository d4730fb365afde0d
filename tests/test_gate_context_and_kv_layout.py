"""The gate's context-length and KV-layout checks: a context past the tested range and a KV cache the kernel does not
know are refused with their reasons (stock serves them); the runner caps a burst at the tested range."""

from __future__ import annotations

import pytest
import torch
from gate_inputs import decode_at

from kog_backend.engine.tokens_per_step import burst_length, burst_max_len
from kog_backend.path import eligibility
from kog_backend.path.eligibility import MAX_TESTED_CONTEXT, STEP_REASONS, TESTED_BLOCK_SIZES


def _decode_at(position: int, prompt_len: int):
    """One request decoding the token at `position` (outputs so far: position + 1 - prompt_len)."""
    return decode_at(position, outputs=position + 1 - prompt_len)


@pytest.mark.parametrize(
    "position,want",
    [
        (0, None),
        (MAX_TESTED_CONTEXT - 2, None),
        (MAX_TESTED_CONTEXT - 1, None),  # context MAX_TESTED_CONTEXT, the longest tested
        (MAX_TESTED_CONTEXT, STEP_REASONS["long_context"]),
        (4 * MAX_TESTED_CONTEXT, STEP_REASONS["long_context"]),
    ],
)
def test_context_beyond_the_tested_range_runs_stock(position, want):
    so = _decode_at(position, prompt_len=1)
    assert eligibility.step_unsupported_reason(so, {"a": None}, prompt_lens={"a": 1}) == want
    assert eligibility.step_unsupported_reason(so, {"a": None}) == want  # without prompt lengths too


def test_context_limit_is_a_parameter_and_named_in_the_reason():
    so = _decode_at(100, prompt_len=50)
    assert eligibility.step_unsupported_reason(so, {"a": None}, prompt_lens={"a": 50}, max_context=101) is None
    assert eligibility.step_unsupported_reason(so, {"a": None}, max_context=100) == STEP_REASONS["long_context"]
    assert str(MAX_TESTED_CONTEXT) in STEP_REASONS["long_context"]


def test_a_request_reason_wins_over_the_position_checks():
    so = _decode_at(MAX_TESTED_CONTEXT + 5, prompt_len=10)
    assert eligibility.step_unsupported_reason(so, {"a": "logprobs requested"}) == "logprobs requested"


@pytest.mark.parametrize(
    "position,prompt_len,outputs,want",
    [
        (9, 10, 0, None),  # the prompt's last token (the final chunk of one token): its logits give output 1
        (5, 10, 0, STEP_REASONS["prefill"]),  # a one-token prefill chunk in the middle of the prompt
        (12, 10, 3, None),  # decoding: positions 10, 11 hold outputs 1, 2; output 3 is the input
        (11, 10, 3, STEP_REASONS["prefill"]),  # recomputing a known token (a resumed request's prefill)
    ],
)
def test_only_the_last_known_token_decodes(position, prompt_len, outputs, want):
    so = _decode_at(position, prompt_len)
    so.scheduled_cached_reqs.num_output_tokens = [outputs]
    assert eligibility.step_unsupported_reason(so, {"a": None}, prompt_lens={"a": prompt_len}) == want


def test_burst_never_computes_past_the_tested_range():
    """The runner passes burst_max_len(max_model_len) = min(max_model_len, MAX_TESTED_CONTEXT + 1) to burst_length: a
    burst from position p makes k tokens, computing positions p .. p + k - 1, whose longest context p + k stays
    within the tested range."""
    cap = burst_max_len(4 * MAX_TESTED_CONTEXT)
    assert cap == MAX_TESTED_CONTEXT + 1
    for p in (MAX_TESTED_CONTEXT - 40, MAX_TESTED_CONTEXT - 5, MAX_TESTED_CONTEXT - 1):
        k = burst_length(32, p, 100, 10**9, cap)
        assert 1 <= k and p + k <= MAX_TESTED_CONTEXT, (p, k)
    assert burst_length(32, MAX_TESTED_CONTEXT - 40, 100, 10**9, cap) == 32


def _flash_cache(num_blocks: int, nkv: int, block: int, head_dim: int, order: str) -> torch.Tensor:
    """A KV cache as vLLM's attn_utils allocates it: physical in stride order, then permuted to the logical
    [num_blocks, nkv, block, 2 * head_dim] (meta device: no memory)."""
    if order == "NHD":
        return torch.empty(num_blocks, block, nkv, 2 * head_dim, dtype=torch.bfloat16, device="meta").permute(0, 2, 1, 3)
    return torch.empty(num_blocks, nkv, block, 2 * head_dim, dtype=torch.bfloat16, device="meta")


@pytest.mark.parametrize("order", ["NHD", "HND"])
@pytest.mark.parametrize("block", TESTED_BLOCK_SIZES)
@pytest.mark.parametrize("nkv,head_dim", [(8, 128), (2, 64), (1, 128)])
def test_known_kv_layouts(order, block, nkv, head_dim):
    assert eligibility.kv_cache_unsupported_reason(_flash_cache(64, nkv, block, head_dim, order), head_dim) is None


def test_admitted_block_sizes_are_powers_of_two():
    """The attention split takes a position's block and row as a shift and a mask (attn_split.cuh): a block size
    that is not a power of two must be refused, not admitted."""
    assert all(b > 0 and b & (b - 1) == 0 for b in TESTED_BLOCK_SIZES)
    assert eligibility.kv_cache_unsupported_reason(_flash_cache(64, 8, 48, 128, "NHD"), 128) is not None


def test_padded_pages_are_known():
    """vLLM pads pages for some configurations (page_size_padded): only the block stride grows."""
    page = 16 * 8 * 256
    padded = torch.empty(64 * (page + 512), dtype=torch.bfloat16, device="meta").as_strided(
        (64, 8, 16, 256), (page + 512, 256, 8 * 256, 1))
    assert eligibility.kv_cache_unsupported_reason(padded, 128) is None


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda: torch.empty(2, 64, 16, 8, 128, dtype=torch.bfloat16, device="meta"), "not the flash layout"),
        (lambda: torch.empty(64, 8, 16, 128, dtype=torch.bfloat16, device="meta"), "not the flash layout"),
        # K and V planes in the block's outermost dimension: [blocks][2D][block][heads], last dim not contiguous
        (lambda: torch.empty(64, 256, 16, 8, dtype=torch.bfloat16, device="meta").permute(0, 3, 2, 1), "not contiguous"),
        # heads outermost over blocks
        (lambda: torch.empty(8, 64, 16, 256, dtype=torch.bfloat16, device="meta").permute(1, 0, 2, 3), "neither NHD"),
        (lambda: _flash_cache(64, 8, 8, 128, "NHD"), "block size 8"),
        (lambda: _flash_cache(64, 8, 256, 128, "HND"), "block size 256"),
    ],
)
def test_unknown_kv_layouts_are_refused(make, needle):
    reason = eligibility.kv_cache_unsupported_reason(make(), 128)
    assert reason is not None and needle in reason, reason
