"""Bad input gets one clear reason and the stock path: a non-Hopper GPU, another vLLM version, an unsupported
architecture or head size. The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the GPU and
version probes can be replaced; the checkpoints are tiny."""

from __future__ import annotations

import pytest

from vllm_helpers import engine_kwargs, kog_kwargs, kog_stats, random_prompts, token_ids

pytestmark = pytest.mark.vllm_gpu

SMALL = dict(gpu_memory_utilization=0.08, max_model_len=512)


def _generate(path, kwargs, n=16):
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, skip_tokenizer_init=True, **kwargs)
    prompt = random_prompts(1, [12], 4000, seed=3)
    out = token_ids(llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)))[0]
    return llm, out


@pytest.fixture
def in_process(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="module")
def tiny_stock_tokens(checkpoint):
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        llm, out = _generate(checkpoint("tiny-llama"), engine_kwargs(**SMALL))
        del llm
    finally:
        del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
    return out


@pytest.mark.parametrize(
    "probe,fake,expect",
    [
        ("gpu_reason", lambda: "GPU NVIDIA A100 has compute capability 8.0; kog needs 9.0 (Hopper: H100/H200)", "8.0"),
        ("vllm_version_reason", None, "vLLM 0.27.0 is not supported"),
    ],
)
def test_environment_refusals_serve_stock(checkpoint, in_process, monkeypatch, tiny_stock_tokens, probe, fake, expect):
    from kog_backend import support

    if fake is None:
        real = support.vllm_version_reason
        fake = lambda version=None: real("0.27.0")  # noqa: E731
    monkeypatch.setattr(support, probe, fake)
    llm, out = _generate(checkpoint("tiny-llama"), kog_kwargs(**SMALL))
    stats = kog_stats(llm)
    assert stats["kog_steps"] == 0
    assert expect in (stats["disabled_reason"] or ""), stats
    assert out == tiny_stock_tokens


def _write_hf(tmp_path, cls_name, **cfg):
    import torch
    import transformers

    config = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, **cfg
    )
    model = getattr(transformers, cls_name)(config).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize(
    "cls_name,cfg,expect",
    [
        ("Qwen2ForCausalLM", {}, "architecture ['Qwen2ForCausalLM'] is not supported"),
        ("LlamaForCausalLM", {"head_dim": 32}, "head_dim 32"),
    ],
)
def test_unsupported_models_serve_stock(tmp_path, in_process, cls_name, cfg, expect):
    path = _write_hf(tmp_path, cls_name, **cfg)
    stock_llm, want = _generate(path, engine_kwargs(**SMALL))
    del stock_llm
    llm, got = _generate(path, kog_kwargs(**SMALL))
    stats = kog_stats(llm)
    assert stats["kog_steps"] == 0
    assert expect in (stats["disabled_reason"] or ""), stats
    assert got == want
