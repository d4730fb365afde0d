"""The gate's catalogue (kog_backend.path.gate): every reason it can return has a case here that makes the gate
return it, and `reason_key` names the template of each. A reason added to a level without a case fails
test_every_reason_has_a_case; a refusal string that is not in the catalogue fails test_case."""

from __future__ import annotations

import dataclasses
import types
from unittest import mock

import pytest
import torch
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from gate_inputs import decode_at, decode_step, server_config

from kog_backend.monokernel import synthetic
from kog_backend.path import gate
from kog_backend.path.burst_sampling import BurstSampling
from kog_backend.monokernel import layout
from kog_backend.path.quant_format import Fp8Format
from kog_backend.path.gate import (
    burst, environment, extension, kv_cache, model, monokernel, request, server, step, tiling,
)

NS = types.SimpleNamespace
CPU = torch.device("cpu")


def _shape(**over):
    return dataclasses.replace(synthetic.make_shape("llama", 2, 64, 4, 2, 64, 128, 256, True), **over)


def _weights(**over):
    return dataclasses.replace(synthetic.random_decoder(_shape(), CPU), **over)


def _layer(w, **over):
    return dataclasses.replace(w, layers=[dataclasses.replace(w.layers[0], **over), *w.layers[1:]])


def _fp8_weights(layout="block"):
    return synthetic.random_decoder(_shape(), CPU, fp8=layout)


def _fp8_loaded(weight_dtype=torch.float8_e4m3fn, weight_shape=(256, 256), scale_shape=(2, 2)):
    """fp8_loaded_reason on a block-layout module of 256 x 256 (its logical size) holding these parameters."""
    weight = torch.zeros(weight_shape, dtype=torch.float32).to(weight_dtype)
    return model.fp8_loaded_reason(FP8_BLOCK, "layer 0 qkv", weight, torch.ones(scale_shape), 256, 256)


def _no_cuda():
    with mock.patch("torch.cuda.is_available", return_value=False):
        return environment.gpu_reason()


def _capability_80():
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.get_device_capability", return_value=(8, 0)):
        return monokernel.device_reason(torch.device("cuda", 0), None)


def _moe_tp():
    from kog_backend.reference.moe_step import MoeShape

    shape = synthetic.make_shape("qwen3", 2, 256, 8, 2, 128, 512, 4096, True)
    return monokernel.moe_plan_or_reason(shape, MoeShape(8, 2, 128, False), 132, 2)


def _stale_build():
    from kog_backend import ops

    with mock.patch.object(ops, "load_reason", return_value=None), mock.patch.object(ops, "has_op", return_value=False):
        return monokernel.device_reason(torch.device("cuda", 0), 132)


def _extension(layout_=None, config=None):
    """A loaded extension's layout and config ops, this package's unless given."""
    lay = layout.expected_layout() if layout_ is None else layout_
    cfg = list(layout.CONFIG.values()) if config is None else config
    return NS(monokernel_layout=lambda: lay, monokernel_config=lambda: cfg)


def _other_layout():
    shifted = layout.expected_layout()
    shifted[0] += 8
    return shifted


def _kv(shape=(3, 2, 16, 128), dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


def _misaligned_kv():
    return torch.zeros(3 * 2 * 16 * 128 + 1, dtype=torch.bfloat16)[1:].view(3, 2, 16, 128)


def _rope(name="RotaryEmbedding", neox=True, dim=64):
    return type(name, (), {"is_neox_style": neox, "rotary_dim": dim})()


FP8_BLOCK = Fp8Format("fp8", "block")
FP8 = "float8_e4m3fn"
W = "model.layers.0.self_attn.q_proj.weight"

SAMPLED = BurstSampling(0.6, 20, 0.9, 0.0)
PENALISED = BurstSampling(0.0, 0, 1.0, 0.0, repetition_penalty=1.1)
KERNEL = NS(filtered_sampling_reason=None, penalty_reason=None)
TP_KERNEL = NS(filtered_sampling_reason=monokernel.filtered_sampling_reason(None, True),
               penalty_reason=monokernel.penalty_reason(True))


def _burst(sampling=SAMPLED, single=None, option=True, mk=KERNEL, fp64=False):
    return lambda: gate.burst_reason(single, sampling, sampled_bursts=option, monokernel=mk, fp64_gumbel=fp64)


# (level, key, a call that makes the gate return that reason)
_MOE = types.SimpleNamespace(num_experts=16, intermediate_size=128, norm_topk_prob=True)  # a tiny Qwen3-MoE
_TRITON, _FLASHINFER = types.SimpleNamespace(name="TRITON"), types.SimpleNamespace(name="FLASHINFER_CUTLASS")
CASES = [
    ("environment", "disabled", lambda: environment.worker_reason(False, True)),
    ("environment", "v1_runner", lambda: environment.worker_reason(True, False)),
    ("environment", "vllm_version", lambda: environment.vllm_version_reason("0.27.0")),
    ("environment", "no_gpu", _no_cuda),
    ("environment", "gpu_capability", lambda: environment.gpu_reason((8, 0), "NVIDIA A100")),
    ("environment", "gpu_capability", lambda: environment.gpu_reason((8, 9), None)),
    ("extension", "not_built", lambda: extension.not_built_reason(None)),
    ("extension", "load_failed", lambda: extension.load_failed_reason("/x/_C.abi3.so", OSError("undefined symbol"))),
    ("extension", "no_version_op", lambda: extension.version_op_reason(AttributeError("version"))),
    ("extension", "version", lambda: extension.version_reason(5, 6)),
    ("extension", "no_step_op", _stale_build),
    ("extension", "no_layout_op", lambda: layout.extension_mismatch(NS())),
    ("extension", "layout", lambda: layout.extension_mismatch(_extension(layout_=_other_layout()))),
    ("extension", "constants", lambda: layout.extension_mismatch(
        _extension(config=list(dict(layout.CONFIG, kHeaderBytes=0).values())))),
    ("extension", "constants", lambda: layout.extension_mismatch(_extension(config=list(layout.CONFIG.values())[:-1]))),
    ("server", "pipeline_parallel", lambda: server.server_unsupported_reason(
        server_config(**{"parallel_config.pipeline_parallel_size": 2}))),
    ("server", "data_parallel", lambda: server.server_unsupported_reason(
        server_config(**{"parallel_config.data_parallel_size": 2}))),
    ("server", "decode_context_parallel", lambda: server.server_unsupported_reason(
        server_config(**{"parallel_config.prefill_context_parallel_size": 2}))),
    ("server", "lora", lambda: server.server_unsupported_reason(server_config(lora_config=object()))),
    ("server", "speculative", lambda: server.server_unsupported_reason(server_config(speculative_config=object()))),
    ("server", "no_model_config", lambda: server.server_unsupported_reason(server_config(model_config=None))),
    ("server", "encoder_decoder", lambda: server.server_unsupported_reason(
        server_config(**{"model_config.is_encoder_decoder": True}))),
    ("server", "multimodal", lambda: server.server_unsupported_reason(
        server_config(**{"model_config.is_multimodal_model": True}))),
    ("server", "pooling", lambda: server.server_unsupported_reason(
        server_config(**{"model_config.runner_type": "pooling"}))),
    ("server", "model_dtype", lambda: server.server_unsupported_reason(
        server_config(**{"model_config.dtype": torch.float16}))),
    ("server", "kv_cache_dtype", lambda: server.server_unsupported_reason(
        server_config(**{"cache_config.cache_dtype": "fp8"}))),
    ("model", "architecture", lambda: model.architecture_reason(["Gemma2ForCausalLM"])),
    ("model", "architecture", lambda: model.architecture_reason([])),
    ("model", "mixture_of_experts", lambda: model.architecture_reason(["Qwen3MoeForCausalLM"])),
    ("model", "mixture_of_experts", lambda: model.architecture_reason(
        ["Qwen3ForCausalLM"], model.config_num_experts({"num_experts": 8}))),  # experts under a dense name
    ("model", "mixture_of_experts", lambda: model.architecture_reason(
        ["MixtralForCausalLM"], model.config_num_experts(NS(num_local_experts=8)))),
    ("model", "sliding_window", lambda: model.sliding_window_reason(4096, None)),
    ("model", "rope_scaling", lambda: model.rope_scaling_reason({"rope_type": "yarn", "factor": 4.0})),
    ("model", "quantization", lambda: model.quantization_reason({"quant_method": "awq", "bits": 4})),
    ("model", "quantization", lambda: model.quantization_reason(None, "gptq")),
    ("model", "fp8_tp", lambda: model.quantization_reason(
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, None, 2)),
    ("model", "fp8_tp", lambda: model.quantization_reason(None, "fp8", 4)),
    ("model", "fp8_loaded_weight", lambda: _fp8_loaded(weight_dtype=torch.int32)),  # Marlin's int32 tiles
    ("model", "fp8_loaded_weight", lambda: _fp8_loaded(weight_shape=(272, 256))),  # rows padded to 16 (CUTLASS)
    ("model", "fp8_loaded_scale", lambda: _fp8_loaded(scale_shape=(2, 1))),
    ("model", "fp8_weight_dtype", lambda: model.fp8_checkpoint_reason(FP8_BLOCK, {W: ((256, 256), "bfloat16")})),
    ("model", "fp8_scale_missing", lambda: model.fp8_checkpoint_reason(FP8_BLOCK, {W: ((256, 256), FP8)})),
    ("model", "fp8_scale_shape", lambda: model.fp8_checkpoint_reason(
        FP8_BLOCK, {W: ((256, 256), FP8), W + "_scale_inv": ((2,), "float32")})),
    ("model", "fp8_scale_dtype", lambda: model.fp8_checkpoint_reason(
        FP8_BLOCK, {W: ((256, 256), FP8), W + "_scale_inv": ((2, 2), "int64")})),
    ("model", "torch_dtype", lambda: model.torch_dtype_reason("float16")),
    ("model", "mlp_bias", lambda: model.config_bias_reason("llama", True, False)),
    ("model", "o_proj_bias", lambda: model.config_bias_reason("qwen3", False, True)),
    ("model", "qkv_bias_mixed", lambda: model.bias_reason(False, False, [True, False])),
    ("model", "head_dim", lambda: model.head_dim_reason(96)),
    ("model", "tp_divisible", lambda: model.tp_divisible_reason(32, 8, 14336, 3)),
    ("model", "no_layers", lambda: model.layers_reason(NS(model=None))),
    ("model", "mlp_not_dense", lambda: model.mlp_reason(3, NS(experts=[]))),
    ("model", "rotary_class", lambda: model.rotary_reason(_rope("YaRNScalingRotaryEmbedding"), 64)),
    ("model", "rotary_partial", lambda: model.rotary_reason(_rope(dim=32), 64)),
    ("model", "sinks", lambda: model.sinks_reason(NS(sinks=torch.zeros(4)))),
    ("kv_cache", "groups", lambda: kv_cache.groups_reason(2)),
    ("kv_cache", "not_bf16_tensor", lambda: kv_cache.layer_reason(0, _kv(dtype=torch.float16))),
    ("kv_cache", "not_bf16_tensor", lambda: kv_cache.layer_reason(1, None)),
    ("kv_cache", "layout", lambda: kv_cache.layout_reason(_kv((3, 2, 16, 96)), 64)),
    ("kv_cache", "head_dim_strided", lambda: kv_cache.layout_reason(_kv((3, 2, 128, 16)).transpose(2, 3), 64)),
    ("kv_cache", "page_order", lambda: kv_cache.served_layout_reason(_kv((2, 3, 16, 128)).permute(1, 0, 2, 3), 64)),
    ("kv_cache", "block_size", lambda: kv_cache.served_layout_reason(_kv((3, 2, 8, 128)), 64)),
    ("kv_cache", "dtype", lambda: kv_cache.monokernel_reason(0, _kv(dtype=torch.float16), 2, 64, CPU, None)),
    ("kv_cache", "device", lambda: kv_cache.monokernel_reason(0, _kv(), 2, 64, torch.device("cuda", 0), None)),
    ("kv_cache", "shape", lambda: kv_cache.monokernel_reason(0, _kv(), 4, 64, CPU, None)),
    ("kv_cache", "alignment", lambda: kv_cache.monokernel_reason(0, _misaligned_kv(), 2, 64, CPU, None)),
    ("kv_cache", "strides", lambda: kv_cache.monokernel_reason(
        1, _kv(), 2, 64, CPU, _kv((3, 16, 2, 128)).permute(0, 2, 1, 3))),
    ("tiling", "hidden_size", lambda: tiling.shape_reason(100, 32, 8, 132, 1000)),
    ("tiling", "heads", lambda: tiling.shape_reason(2048, 12, 8, 132, 1000)),
    ("tiling", "kv_heads_sms", lambda: tiling.shape_reason(2048, 200, 200, 132, 1000)),
    ("tiling", "no_vocab_rows", lambda: tiling.shape_reason(2048, 32, 8, 132, 0)),
    ("tiling", "stage_input", lambda: tiling.stage_input_reason("down", "intermediate_size", 8196)),
    ("tiling", "stage_input_fp8", lambda: tiling.stage_input_reason("down", "intermediate_size", 8200, 1)),
    ("tiling", "residual_rows", lambda: tiling.residual_rows_reason("o", 65536, 10**6, 132)),
    ("tiling", "slots", lambda: tiling.slots_reason(60000, 2048, 120000, 32768, 1)),
    ("tiling", "filtered_grid", lambda: tiling.filtered_sampling_reason(300, 8, 100, 1000)),
    ("tiling", "filtered_work", lambda: tiling.filtered_sampling_reason(33, 4000, 64000, 32768)),
    ("tiling", "moe_experts", lambda: tiling.moe_reason(300, 8)),
    ("tiling", "moe_top_k", lambda: tiling.moe_reason(128, 9)),
    ("tiling", "moe_top_k", lambda: tiling.moe_reason(128, 6)),
    ("tiling", "moe_kernel", lambda: tiling.moe_kernel_reason(64, 8)),
    ("monokernel", "refused", lambda: monokernel.refused("kog_backend._C is not built")),
    ("monokernel", "refused", lambda: monokernel.refused(model.head_dim_reason(96))),
    ("monokernel", "tp_refused", lambda: monokernel.refused("shared buffer: x", tp=True)),
    ("monokernel", "setup_failed", lambda: monokernel.setup_failed(ValueError("no memory"))),
    ("monokernel", "launch_failed", lambda: monokernel.launch_failed(RuntimeError("launch"))),
    ("monokernel", "kernel_abort", lambda: monokernel.kernel_abort("counter wait timed out in block 3")),
    ("monokernel", "not_cuda", lambda: monokernel.unsupported_reason(_weights(), [], "cpu")),
    ("monokernel", "capability", _capability_80),
    ("monokernel", "residency", lambda: monokernel.residency_reason(66, 132)),
    ("monokernel", "moe_tp", _moe_tp),
    ("model", "moe_dense_layers", lambda: model.moe_layers_reason({"mlp_only_layers": [3], "decoder_sparse_step": 1})),
    ("model", "moe_quantized", lambda: model.REASONS["moe_quantized"].format(method="fp8")),
    ("model", "moe_backend", lambda: model.moe_block_reason(0, 1, (16, 256, 256), _MOE, _FLASHINFER, None, None)),
    ("model", "moe_parallel", lambda: model.moe_block_reason(0, 2, (16, 128, 256), _MOE, _TRITON, None, None)),
    ("model", "moe_shared_expert", lambda: model.moe_block_reason(0, 1, (16, 256, 256), _MOE, _TRITON, object(), None)),
    ("model", "moe_router", lambda: model.moe_block_reason(0, 1, (16, 256, 256), _MOE, _TRITON, None, object())),
    ("monokernel", "architecture", lambda: monokernel.shape_reason(_shape(arch="gemma"), 1)),
    ("monokernel", "qkv_bias_arch", lambda: monokernel.shape_reason(_shape(qkv_bias=True), 1)),
    ("monokernel", "qk_norm_arch", lambda: monokernel.shape_reason(_shape(qk_norm=True), 1)),
    ("monokernel", "layer_count", lambda: monokernel.layer_count_reason(2, 0, 2)),
    ("monokernel", "lm_head_rows", lambda: monokernel.weights_reason(
        _weights(lm_head=torch.zeros(100, 64, dtype=torch.bfloat16)), CPU)),
    ("monokernel", "qkv_bias_undeclared", lambda: monokernel.weights_reason(
        _layer(_weights(), qkv_bias=torch.zeros(256, dtype=torch.bfloat16)), CPU)),
    ("monokernel", "context", lambda: monokernel.context_reason(8192, 4096)),
    ("monokernel", "tp_option_off", lambda: monokernel.tp_option_reason(2, False)),
    ("monokernel", "fp8_option_off", lambda: monokernel.fp8_option_reason("tensor", False)),
    ("monokernel", "tp_needs_buffer", lambda: monokernel.shape_reason(_shape(tp_size=2), 1)),
    ("monokernel", "tp_sharding", lambda: monokernel.shape_reason(_shape(tp_size=2), 4)),
    ("monokernel", "tp_sharding", lambda: monokernel.tp_reason(_shape(tp_size=2), 4)),
    ("monokernel", "tp_world", lambda: monokernel.tp_reason(_shape(tp_size=16), 16)),
    ("monokernel", "tp_shared_buffer", lambda: monokernel.tp_shared_buffer_reason("cudaIpcOpenMemHandle failed")),
    ("monokernel", "tp_setup_failed", lambda: monokernel.tp_setup_failed(ValueError("x"))),
    ("monokernel", "filtered_tp", lambda: monokernel.filtered_sampling_reason(None, True)),
    ("monokernel", "penalties_tp", lambda: monokernel.penalty_reason(True)),
    ("monokernel", "tensor_missing", lambda: monokernel.tensor_reason("layer 0 q_norm", None, (64,), CPU)),
    ("monokernel", "tensor_dtype", lambda: monokernel.weights_reason(
        _weights(final_norm=torch.ones(64, dtype=torch.float16)), CPU)),
    ("monokernel", "tensor_device", lambda: monokernel.weights_reason(_weights(), torch.device("cuda", 0))),
    ("monokernel", "tensor_shape", lambda: monokernel.weights_reason(
        _layer(_weights(), post_norm=torch.ones(32, dtype=torch.bfloat16)), CPU)),
    ("monokernel", "tensor_contiguous", lambda: monokernel.weights_reason(
        _layer(_weights(), down=torch.zeros(128, 64, dtype=torch.bfloat16).t()), CPU)),
    ("monokernel", "tensor_alignment", lambda: monokernel.tensor_reason(
        "embed", torch.zeros(65, dtype=torch.bfloat16)[1:], (64,), CPU)),
    ("monokernel", "fp8_unknown_layout", lambda: monokernel.weights_reason(
        dataclasses.replace(_fp8_weights(), fp8="int4"), CPU)),
    ("monokernel", "tensor_dtype_fp8", lambda: monokernel.weights_reason(
        _layer(_fp8_weights(), qkv=_weights().layers[0].qkv), CPU)),
    ("monokernel", "tensor_dtype_scale", lambda: monokernel.weights_reason(
        _layer(_fp8_weights("channel"), down_scale=torch.ones(64, 1, dtype=torch.bfloat16)), CPU)),
    ("monokernel", "fp8_scale_undeclared", lambda: monokernel.weights_reason(
        _layer(_weights(), o_scale=torch.ones(())), CPU)),
    ("monokernel", "tensor_shape", lambda: monokernel.weights_reason(
        _layer(_fp8_weights("tensor"), gate_up_scale=torch.ones(2)), CPU)),
    ("monokernel", "tensor_missing", lambda: monokernel.weights_reason(_layer(_fp8_weights(), o_scale=None), CPU)),
    ("request", "logprobs", lambda: request.request_unsupported_reason(SamplingParams(logprobs=0))),
    ("request", "prompt_logprobs", lambda: request.request_unsupported_reason(SamplingParams(prompt_logprobs=1))),
    ("request", "structured_outputs", lambda: request.request_unsupported_reason(
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+")))),
    ("request", "lora", lambda: request.request_unsupported_reason(SamplingParams(), lora_request=object())),
    ("request", "pooling", lambda: request.request_unsupported_reason(None, pooling_params=object())),
    ("burst", "option", _burst(option=False)),
    ("burst", "no_monokernel", _burst(mk=None)),
    ("burst", "fp64_gumbel", _burst(fp64=True)),
    ("burst", "filters", _burst(mk=TP_KERNEL)),
    ("burst", "penalties", _burst(sampling=PENALISED, mk=TP_KERNEL)),
    ("burst", "logit_bias", lambda: burst.request_single_token_reason(SamplingParams(logit_bias={3: 1.0}))),
    ("burst", "allowed_token_ids", lambda: burst.request_single_token_reason(SamplingParams(allowed_token_ids=[1]))),
    ("burst", "bad_words", lambda: burst.request_single_token_reason(SamplingParams(bad_words=["x"]))),
    ("burst", "min_tokens", _burst(single=burst.request_single_token_reason(SamplingParams(min_tokens=4)))),
    ("burst", "kv_slots", lambda: burst.fit_to_slots(32, 100, 101)[1]),
    ("burst", "scheduler", lambda: burst.scheduling_reason(False, False)),
    ("burst", "async_scheduling", lambda: burst.scheduling_reason(True, True)),
    ("step", "dummy_run", lambda: step.step_unsupported_reason(decode_step("a"), {"a": None}, dummy_run=True)),
    ("step", "batch", lambda: step.step_unsupported_reason(decode_step("a", "b"), {})),
    ("step", "idle", lambda: step.step_unsupported_reason(decode_step(), {})),
    ("step", "prefill", lambda: step.step_unsupported_reason(decode_step("a", tokens=7), {"a": None})),
    ("step", "speculative", lambda: step.step_unsupported_reason(
        decode_step("a", scheduled_spec_decode_tokens={"a": [5]}), {"a": None})),
    ("step", "encoder", lambda: step.step_unsupported_reason(
        decode_step("a", scheduled_encoder_inputs={"a": [0]}), {"a": None})),
    ("step", "unknown_request", lambda: step.step_unsupported_reason(decode_step("zz"), {"a": None})),
    ("step", "long_context", lambda: step.step_unsupported_reason(
        decode_at(step.MAX_TESTED_CONTEXT, outputs=1), {"a": None})),
]


@pytest.mark.parametrize("level,key,make", CASES, ids=[f"{lv}-{k}-{i}" for i, (lv, k, _) in enumerate(CASES)])
def test_case(level, key, make):
    """The gate returns this reason, and reason_key traces it back to its template."""
    reason = make()
    assert isinstance(reason, str) and reason, reason
    assert gate.reason_key(reason) == (level, key), reason


def test_every_reason_has_a_case():
    listed = {(level, key) for level, key, _ in gate.catalogue()}
    covered = {(level, key) for level, key, _ in CASES}
    assert sorted(listed - covered) == [], "reasons without a case"
    assert sorted(covered - listed) == [], "cases of reasons the catalogue lacks"


def test_catalogue_keys_are_unique_and_displayable():
    entries = gate.catalogue()
    assert len({(level, key) for level, key, _ in entries}) == len(entries)
    assert len({text for _, _, text in entries}) == len(entries), "two keys share a text: reason_key cannot tell"
    for _, _, text in entries:
        shown = gate.display(text)
        assert "{" not in shown and "}" not in shown, shown


def test_nested_reasons_are_the_outer_ones():
    inner = tiling.stage_input_reason("down", "intermediate_size", 8196)
    assert gate.reason_key(monokernel.refused(inner)) == ("monokernel", "refused")
    assert gate.reason_key(inner) == ("tiling", "stage_input")


def test_strings_the_gate_never_returns_have_no_key():
    assert gate.reason_key("something else entirely") is None
    assert gate.reason_key("prefill, and more") is None


def test_eligible_inputs_have_no_reason():
    assert environment.vllm_version_reason("0.26.0") is None and environment.gpu_reason((9, 0), "H100") is None
    assert extension.version_reason(6, 6) is None and layout.extension_mismatch(_extension()) is None
    assert server.server_unsupported_reason(server_config()) is None
    assert model.architecture_reason(["Qwen2ForCausalLM"]) is None and model.head_dim_reason(128) is None
    assert model.config_num_experts({"num_experts": 0}) is None and model.config_num_experts(NS()) is None
    assert model.config_bias_reason("qwen2", False, True) is None  # Qwen2's QKV bias
    assert model.quantization_reason(None) is None and model.quantization_reason({}, None) is None
    assert model.quantization_reason(None, "fp8") is None and model.quantization_reason(None, "fp8", 1) is None
    assert _fp8_loaded() is None and model.fp8_tp_reason("channel", 1) is None
    assert all(monokernel.weights_reason(_fp8_weights(lay), CPU) is None for lay in ("tensor", "channel", "block"))
    assert model.fp8_checkpoint_reason(FP8_BLOCK, {W: ((256, 256), FP8), W + "_scale_inv": ((2, 2), "float32")}) is None
    assert kv_cache.layout_reason(_kv(), 64) is None and kv_cache.monokernel_reason(0, _kv(), 2, 64, CPU, None) is None
    assert monokernel.shape_reason(_shape(), 1) is None and monokernel.weights_reason(_weights(), CPU) is None
    assert monokernel.tp_option_reason(2, True) is None and monokernel.tp_reason(_shape(tp_size=2), 2) is None
    assert _burst()() is None and _burst(sampling=None)() is None
    assert step.step_unsupported_reason(decode_step("a"), {"a": None}) is None


def test_levels_say_what_kog_doctor_lists():
    """`kog doctor --reasons` prints the whole catalogue, level by level."""
    from kog_backend.tools.doctor import features, report

    text = report.format_features(features.reason_sections())
    for level, _, template in gate.catalogue():
        assert f"gate level {level}:" in text and f"  - {gate.display(template)}" in text
