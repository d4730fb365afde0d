"""Bad input gets one clear reason and the stock path: a non-Hopper GPU, another vLLM version, an unsupported
architecture or head size. Each engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) inside a spawned child,
so that the GPU and version probes can be replaced there and the GPU memory is returned when the child exits;
the checkpoints are tiny."""

from __future__ import annotations

import pytest

from vllm_helpers import engine_kwargs, kog_kwargs, random_prompts, run_in_spawned_child

pytestmark = pytest.mark.vllm_gpu

SMALL = dict(gpu_memory_utilization=0.08, max_model_len=512, skip_tokenizer_init=True)
FAKE_GPU = "GPU NVIDIA A100 has compute capability 8.0; kog needs 9.0 (Hopper: H100/H200)"


def _child(queue, path, kwargs, probe):
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from kog_backend.path.gate import environment

    if probe == "gpu":
        environment.gpu_reason = lambda *a, **k: FAKE_GPU
    elif probe == "vllm_version":
        real = environment.vllm_version_reason
        environment.vllm_version_reason = lambda version=None: real("0.27.0")
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, **kwargs)
    prompt = random_prompts(1, [12], 4000, seed=3)
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))[0].outputs[0]
    worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    stats = worker.kog_stats() if hasattr(worker, "kog_stats") else None
    queue.put((list(out.token_ids), stats))


def _generate(path, kwargs, probe=None):
    return run_in_spawned_child(_child, path, kwargs, probe)


@pytest.fixture(scope="module")
def tiny_stock_tokens(checkpoint):
    return _generate(checkpoint("tiny-llama"), engine_kwargs(**SMALL))[0]


@pytest.mark.parametrize(
    "probe,expect", [("gpu", "compute capability 8.0"), ("vllm_version", "vLLM 0.27.0 is not supported")]
)
def test_environment_refusals_serve_stock(checkpoint, tiny_stock_tokens, probe, expect):
    out, stats = _generate(checkpoint("tiny-llama"), kog_kwargs(**SMALL), probe)
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
        ("GemmaForCausalLM", {}, "architectures ['GemmaForCausalLM'] is not supported"),
        ("LlamaForCausalLM", {"head_dim": 32}, "head_dim 32"),
    ],
)
def test_unsupported_models_serve_stock(tmp_path, cls_name, cfg, expect):
    path = _write_hf(tmp_path, cls_name, **cfg)
    want, _ = _generate(path, engine_kwargs(**SMALL))
    got, stats = _generate(path, kog_kwargs(**SMALL))
    assert stats["kog_steps"] == 0
    assert expect in (stats["disabled_reason"] or ""), stats
    assert got == want
