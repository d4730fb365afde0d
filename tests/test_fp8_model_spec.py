"""model_spec.from_vllm_model on FP8 models as vLLM 0.26 holds them after loading (tests/vllm_fp8_models.py): the
formats the FP8 kernel reads give views of vLLM's own parameters ([N, K] float8 rows, fp32 scales, nothing copied);
what it cannot read (tensor parallelism, Marlin's int32 tiles, CUTLASS's padding, a projection left bf16, a scale
of another dtype or layout) is refused with the gate's reason. bf16 models keep their views as before. Fresh random
weights each run (the seed is in the failure message)."""

from __future__ import annotations

import dataclasses
import random

import pytest

torch = pytest.importorskip("torch")

from vllm_fp8_models import FORMATS, loaded_linear, vllm_model  # noqa: E402

from kog_backend.monokernel import synthetic  # noqa: E402
from kog_backend.path import gate, model_spec  # noqa: E402
from kog_backend.path.gate import monokernel as mk_gate  # noqa: E402

CPU = torch.device("cpu")
PROJECTIONS = (("qkv", "qkv_scale", "self_attn", "qkv_proj"), ("o_proj", "o_scale", "self_attn", "o_proj"),
               ("gate_up", "gate_up_scale", "mlp", "gate_up_proj"), ("down", "down_scale", "mlp", "down_proj"))


def _shape(arch="qwen3", H=256, nh=4, nkv=2, D=64, I=384, L=2):  # noqa: E741
    return dataclasses.replace(synthetic.make_shape(arch, L, H, nh, nkv, D, I, 512, arch != "llama"),
                               max_position=64)  # fmt: skip


def _seed() -> int:
    return random.randrange(2**31)


def _module(model, layer: int, where: str, name: str):
    return getattr(getattr(model.model.layers[layer], where), name)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2"])
def test_fp8_formats_are_views_of_vllm_parameters(fmt, arch):
    seed = _seed()
    layout = FORMATS[fmt][0]
    w = synthetic.random_decoder(_shape(arch), CPU, seed=seed, fp8=layout)
    model, config = vllm_model(w, fmt)
    got = model_spec.from_vllm_model(model, config)
    assert got.fp8 == layout and got.projection_bytes == 1 and got.shape == w.shape, seed
    for i, (lw, want) in enumerate(zip(got.layers, w.layers)):
        for name, scale, where, mod in PROJECTIONS:
            m = _module(model, i, where, mod)
            t, s = getattr(lw, name), getattr(lw, scale)
            assert t.dtype == torch.float8_e4m3fn and t.is_contiguous(), (name, seed)
            assert t.data_ptr() == m.weight.data_ptr(), name  # a view of vLLM's parameter, not a copy
            assert torch.equal(t.view(torch.uint8), getattr(want, name).view(torch.uint8)), (name, seed)
            assert s is getattr(m, FORMATS[fmt][3]) and s.dtype == torch.float32, name
        assert lw.input_norm is model.model.layers[i].input_layernorm.weight
        assert (lw.qkv_bias is not None) == (arch == "qwen2")
    assert mk_gate.weights_reason(got, CPU) is None


def test_bf16_models_are_read_as_before():
    w = synthetic.random_decoder(_shape("qwen2"), CPU, seed=_seed())
    model, config = vllm_model(w)
    got = model_spec.from_vllm_model(model, config)
    assert got.fp8 is None and got.projection_bytes == 2 and got.shape == w.shape
    for i, lw in enumerate(got.layers):
        for name, scale, where, mod in PROJECTIONS:
            assert getattr(lw, name) is _module(model, i, where, mod).weight and getattr(lw, scale) is None


@pytest.mark.parametrize("layout", ["tensor", "channel", "block"])
def test_weight_bytes_per_token_counts_fp8_bytes_and_scales(layout):
    s = _shape("qwen3")
    bf16 = synthetic.random_decoder(s, CPU, seed=1)
    fp8 = synthetic.random_decoder(s, CPU, seed=1, fp8=layout)
    H, I, nq, q = s.hidden_size, s.intermediate_size, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, s.q_size
    proj = nq * H + H * q + 2 * I * H + H * I  # elements of one layer's four projections
    scales = {"tensor": 4, "channel": nq + H + 2 * I + H,
              "block": 4 * 2 + 2 * 2 + 6 * 2 + 2 * 3}[layout]  # fmt: skip
    assert fp8.weight_bytes_per_token() == bf16.weight_bytes_per_token() - s.num_layers * (proj - 4 * scales)


def _refusal(w, fmt, **edit):
    """from_vllm_model's reason after `edit` replaced layer 0 modules (name -> module)."""
    model, config = vllm_model(w, fmt)
    for name, module in edit.items():
        where = "self_attn" if name in ("qkv_proj", "o_proj") else "mlp"
        setattr(getattr(model.model.layers[0], where), name, module)
    with pytest.raises(model_spec.UnsupportedModel) as e:
        model_spec.from_vllm_model(model, config)
    return str(e.value)


def test_tensor_parallelism_is_refused():
    w = synthetic.random_decoder(_shape(), CPU, seed=_seed(), fp8="block")
    model, config = vllm_model(w, "fp8-block", tp_size=2)
    with pytest.raises(model_spec.UnsupportedModel) as e:
        model_spec.from_vllm_model(model, config)
    assert str(e.value) == ("fp8 (block 128x128) weights at tensor parallelism 2: not on the kog path yet (the FP8 "
                            "kernel is TP = 1 only)")
    assert gate.reason_key(str(e.value)) == ("model", "fp8_tp")


def test_marlin_repacked_weights_are_refused():
    """VLLM_TEST_FORCE_FP8_MARLIN (or a weight-only compressed-tensors scheme): int32 tiles replace the weight."""
    w = synthetic.random_decoder(_shape(), CPU, seed=_seed(), fp8="channel")
    s = w.shape
    tiles = torch.zeros(s.hidden_size // 16, 2 * s.intermediate_size * 16 // 4, dtype=torch.int32)
    marlin = loaded_linear(w.layers[0].gate_up, w.layers[0].gate_up_scale, "ct-channel", 2 * s.intermediate_size,
                           s.hidden_size)  # fmt: skip
    marlin.weight = torch.nn.Parameter(tiles, requires_grad=False)
    reason = _refusal(w, "ct-channel", gate_up_proj=marlin)
    assert reason.startswith("fp8 (channel) weights: layer 0 gate_up weight as vLLM holds it is int32 [")
    assert "not float8_e4m3fn [256, 768] strides [1, 256] (repacked or padded" in reason
    assert gate.reason_key(reason) == ("model", "fp8_loaded_weight")


def test_cutlass_padded_weights_are_refused():
    """K = 136 is not a multiple of 16: CUTLASS's process_weights_after_loading pads the weight to [144, N]."""
    w = synthetic.random_decoder(_shape("llama", I=136), CPU, seed=_seed(), fp8="tensor")
    s = w.shape
    q = w.layers[0].down  # [H, 136]
    padded = torch.zeros(s.hidden_size, 144, dtype=torch.uint8)
    padded[:, :136] = q.view(torch.uint8)
    down = loaded_linear(padded.view(torch.float8_e4m3fn), w.layers[0].down_scale, "fp8-tensor", s.hidden_size, 136)
    reason = _refusal(w, "fp8-tensor", down_proj=down)
    assert reason == ("fp8 (tensor) weights: layer 0 down weight as vLLM holds it is float8_e4m3fn [144, 256] strides "
                      "[1, 144], not float8_e4m3fn [136, 256] strides [1, 136] (repacked or padded by vLLM's GEMM "
                      "kernel; not on the kog path)")


def test_a_projection_left_bf16_is_refused():
    """An ignore list that keeps one projection in bf16: the FP8 kernel reads every projection as float8."""
    w = synthetic.random_decoder(_shape(), CPU, seed=_seed(), fp8="block")
    s = w.shape
    kept = loaded_linear(torch.zeros(s.hidden_size, s.intermediate_size, dtype=torch.bfloat16), None, None,
                         s.hidden_size, s.intermediate_size)  # fmt: skip
    reason = _refusal(w, "fp8-block", down_proj=kept)
    assert reason.startswith("fp8 (block 128x128) weights: layer 0 down weight as vLLM holds it is bfloat16 [256, 384]")


@pytest.mark.parametrize("how", ["column-major", "bf16", "missing", "shape"])
def test_scales_the_kernel_cannot_read_are_refused(how):
    w = synthetic.random_decoder(_shape(), CPU, seed=_seed(), fp8="block")
    lw, s = w.layers[0], w.shape
    nq = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    scale = {"column-major": lw.qkv_scale.t().contiguous().t(),  # a DeepGEMM-style re-layout: strides (1, 4)
             "bf16": lw.qkv_scale.to(torch.bfloat16), "missing": None,
             "shape": lw.qkv_scale[:, :1].contiguous()}[how]  # fmt: skip
    qkv = loaded_linear(lw.qkv, lw.qkv_scale, "fp8-block", nq, s.hidden_size, lw.qkv_bias)
    if scale is None:
        del qkv.weight_scale_inv
    else:
        qkv.weight_scale_inv = torch.nn.Parameter(scale, requires_grad=False)
    reason = _refusal(w, "fp8-block", qkv_proj=qkv)
    assert reason.startswith("fp8 (block 128x128) weights: layer 0 qkv weight_scale_inv as vLLM holds it is ")
    assert reason.endswith(", not float32 [4, 2] contiguous")
    assert gate.reason_key(reason) == ("model", "fp8_loaded_scale")
