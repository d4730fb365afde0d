"""The gate's request, step and server levels through eligibility's names (re-exports of kog_backend.path.gate),
on vLLM's own SchedulerOutput, SamplingParams and config objects: every reason has a case."""

from __future__ import annotations

import pytest
import torch
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from gate_inputs import decode_step, server_config
from vllm.v1.core.sched.output import NewRequestData

from kog_backend.path import eligibility
from kog_backend.path.eligibility import REQUEST_FEATURES, SERVER_FEATURES


def _new_req(req_id: str, sp: SamplingParams | None = None) -> NewRequestData:
    return NewRequestData(
        req_id=req_id,
        prompt_token_ids=[1, 2, 3],
        mm_features=[],
        sampling_params=sp or SamplingParams(),
        pooling_params=None,
        block_ids=([1],),
        num_computed_tokens=0,
        lora_request=None,
        prefill_token_ids=[1, 2, 3],
    )


OK = {"a": None, "b": None}


def test_single_decode_is_eligible():
    assert eligibility.step_unsupported_reason(decode_step("a"), OK) is None


@pytest.mark.parametrize(
    "so,reason",
    [
        (decode_step("a", "b"), "batch of several requests"),
        (decode_step(), "no request scheduled"),
        (decode_step("a", tokens=7), "prefill"),
        (decode_step("a", scheduled_new_reqs=[_new_req("a")]), "prefill"),
        (decode_step("a", scheduled_spec_decode_tokens={"a": [5]}), "speculative tokens scheduled"),
        (decode_step("a", scheduled_encoder_inputs={"a": [0]}), "encoder inputs scheduled"),
        (decode_step("a", has_structured_output_requests=True), REQUEST_FEATURES["structured_outputs"]),
        (decode_step("zz"), "request unknown to the kog runner"),
    ],
)
def test_step_reasons(so, reason):
    assert eligibility.step_unsupported_reason(so, OK) == reason


def test_dummy_run_is_refused():
    assert eligibility.step_unsupported_reason(decode_step("a"), OK, dummy_run=True) == "dummy run"


def test_request_reason_is_the_step_reason():
    reasons = {"a": REQUEST_FEATURES["logprobs"]}
    assert eligibility.step_unsupported_reason(decode_step("a"), reasons) == REQUEST_FEATURES["logprobs"]


@pytest.mark.parametrize(
    "kwargs,key",
    [
        (dict(logprobs=0), "logprobs"),
        (dict(logprobs=5), "logprobs"),
        (dict(prompt_logprobs=1), "prompt_logprobs"),
        (dict(structured_outputs=StructuredOutputsParams(regex="a+")), "structured_outputs"),
    ],
)
def test_request_reasons(kwargs, key):
    assert eligibility.request_unsupported_reason(SamplingParams(**kwargs)) == REQUEST_FEATURES[key]


@pytest.mark.parametrize(
    "kwargs,key",
    [
        (dict(logit_bias={3: 1.0}), "logit_bias"),
        (dict(allowed_token_ids=[1, 2]), "allowed_token_ids"),
        (dict(bad_words=["x"]), "bad_words"),
        (dict(min_tokens=4), "min_tokens"),
        (dict(temperature=0.6, top_p=0.9, min_tokens=4, logit_bias={3: 1.0}), "logit_bias"),
    ],
)
def test_single_token_requests(kwargs, key):
    """vLLM's sampler applies these from its own state to the kernel's logits: on the kog path, one token per step."""
    sp = SamplingParams(**kwargs)
    assert eligibility.request_unsupported_reason(sp) is None
    assert eligibility.request_single_token_reason(sp) == eligibility.BURST_REASONS[key]


def test_lora_and_pooling_requests():
    assert eligibility.request_unsupported_reason(SamplingParams(), lora_request=object()) == REQUEST_FEATURES["lora"]
    assert eligibility.request_unsupported_reason(None, pooling_params=object()) == REQUEST_FEATURES["pooling"]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(temperature=0.0),
        dict(temperature=0.8, top_p=0.9),
        dict(temperature=1.0, top_k=20, min_p=0.05, seed=7),
        dict(stop=["\n\n"], stop_token_ids=[2], ignore_eos=True, max_tokens=3),
        dict(presence_penalty=0.5),
        dict(temperature=0.6, top_p=0.9, frequency_penalty=-0.5, repetition_penalty=1.1),
    ],
)
def test_supported_requests(kwargs):
    sp = SamplingParams(**kwargs)
    assert eligibility.request_unsupported_reason(sp) is None
    assert eligibility.request_single_token_reason(sp) is None  # K-token bursts


def test_server_eligible():
    assert eligibility.server_unsupported_reason(server_config()) is None


@pytest.mark.parametrize(
    "over,key",
    [
        ({"parallel_config.pipeline_parallel_size": 2}, "pipeline_parallel"),
        ({"parallel_config.data_parallel_size": 2}, "data_parallel"),
        ({"parallel_config.decode_context_parallel_size": 2}, "decode_context_parallel"),
        ({"lora_config": object()}, "lora"),
        ({"speculative_config": object()}, "speculative"),
        ({"model_config.is_encoder_decoder": True}, "encoder_decoder"),
        ({"model_config.is_multimodal_model": True}, "multimodal"),
        ({"model_config.runner_type": "pooling"}, "pooling"),
        ({"model_config.dtype": torch.float16}, "model_dtype"),
        ({"cache_config.cache_dtype": "fp8"}, "kv_cache_dtype"),
    ],
)
def test_server_reasons(over, key):
    assert eligibility.server_unsupported_reason(server_config(**over)).startswith(SERVER_FEATURES[key])


def test_server_reasons_on_a_realserver_config():
    """vLLM's own config object has every attribute the gate reads."""
    from vllm.config import DeviceConfig, VllmConfig

    cfg = VllmConfig(device_config=DeviceConfig(device="cpu"))
    # No model config: the gate must say so rather than raise.
    assert eligibility.server_unsupported_reason(cfg) == "no model config"
