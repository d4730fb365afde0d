"""model_spec's refusals that need no GPU: architecture, sliding window, missing layers; and the KV-cache view."""

from __future__ import annotations

import types

import pytest
import torch

from kog_backend.path import model_spec


def _config(**hf):
    hf_config = types.SimpleNamespace(**{"architectures": ["LlamaForCausalLM"], **hf})
    return types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf_config))


def _model():
    return types.SimpleNamespace(model=types.SimpleNamespace(layers=[]), named_parameters=lambda: [])


@pytest.mark.parametrize(
    "hf,match",
    [
        (dict(architectures=["Gemma2ForCausalLM"]), "architectures"),
        (dict(architectures=["MistralForCausalLM"], sliding_window=4096), "sliding_window 4096"),
        (dict(architectures=["Qwen3ForCausalLM"], sliding_window=4096, use_sliding_window=True), "sliding_window"),
        (dict(architectures=["Qwen2ForCausalLM"], sliding_window=131072, use_sliding_window=True), "sliding_window"),
    ],
)
def test_refusals(hf, match):
    with pytest.raises(model_spec.UnsupportedModel, match=match):
        model_spec.from_vllm_model(_model(), _config(**hf))


def test_model_without_layers_is_refused():
    with pytest.raises(model_spec.UnsupportedModel, match="layers"):
        model_spec.from_vllm_model(types.SimpleNamespace(model=None), _config())


def test_kv_cache_view_reads_strides_of_both_layouts():
    blocks, heads, bs, d = 5, 2, 16, 64
    nhd = torch.randn(blocks, bs, heads, 2 * d).permute(0, 2, 1, 3)  # vLLM's default memory order
    hnd = torch.randn(blocks, heads, bs, 2 * d)  # VLLM_KV_CACHE_LAYOUT=HND
    for cache in (nhd, hnd):
        view = model_spec.kv_cache_view(cache, d)
        assert view.block_size == bs and view.num_blocks == blocks
        assert torch.equal(view.k[3, 7, 1], cache[3, 1, 7, :d]) and torch.equal(view.v[3, 7, 1], cache[3, 1, 7, d:])
    with pytest.raises(model_spec.UnsupportedModel):
        model_spec.kv_cache_view(torch.randn(blocks, heads, bs, d), d)
