"""`kog make-checkpoint --fp8 {tensor,channel,block}`: names, shapes, dtypes and config of each format as vLLM 0.26
loads it (its own config parsers and scale-parameter constructors, on CPU), and the stored FP8 weights dequantise to
the bf16 checkpoint of the same seed within e4m3's rounding: |W_fp8 * s - W| <= 2^-4 |W| + 2^-10 s per element."""

from __future__ import annotations

import argparse
import json
import os
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
from checkpoint_files import offline_hub, read_tensors  # noqa: E402,F401 (offline_hub: autouse)

from kog_backend.path import quant_format  # noqa: E402
from kog_backend.path.quant_format import BLOCK, Fp8Format  # noqa: E402
from kog_backend.tools.fixtures import checkpoints, fp8_checkpoints, shapes  # noqa: E402

SHAPE = "tiny-qwen3"
LAYOUTS = ("tensor", "channel", "block")
SCALE = {"tensor": ("weight_scale", torch.float32), "channel": ("weight_scale", torch.bfloat16),
         "block": ("weight_scale_inv", torch.float32)}
SLACK = 1 + 2**-20  # fp32 rounding of W / s and of W_fp8 * s


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    out = {"bf16": checkpoints.write_checkpoint(SHAPE, str(root / "bf16"), device="cpu")}
    for layout in LAYOUTS:
        out[layout] = checkpoints.write_checkpoint(SHAPE, str(root / layout), device="cpu", fp8=layout)
    return out


def _expand(scale: torch.Tensor, layout: str, n: int, k: int) -> torch.Tensor:
    """The scale of every element [n, k], by index arithmetic (independent of the reference's dequantise)."""
    s = scale.double()
    if layout == "tensor":
        return s.reshape(()).expand(n, k)
    if layout == "channel":
        return s.expand(n, k)
    rows = torch.arange(n) // BLOCK[0]
    cols = torch.arange(k) // BLOCK[1]
    return s[rows][:, cols]


def _projection_weights(cfg) -> list[str]:
    return [f"model.layers.{i}.{p}.weight" for i in range(cfg["num_hidden_layers"]) for p in quant_format.PROJECTIONS]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_names_shapes_dtypes_config(written, layout):
    bf16, fp8 = read_tensors(written["bf16"]), read_tensors(written[layout])
    fmt = fp8_checkpoints.FORMATS[layout]
    scale_name, scale_dtype = SCALE[layout]
    quantised = _projection_weights(shapes.SHAPES[SHAPE])
    assert len(quantised) == 14
    scales = {w.removesuffix("weight") + scale_name for w in quantised}
    assert set(fp8) == set(bf16) | scales  # every bf16 tensor, plus one scale per quantised weight
    for name, t in fp8.items():
        if name in scales:
            w = bf16[name.removesuffix(scale_name) + "weight"]
            assert t.dtype == scale_dtype, name
            assert tuple(t.shape) == {"tensor": (), "channel": (w.shape[0], 1),
                                      "block": (-(-w.shape[0] // 128), -(-w.shape[1] // 128))}[layout], name
        elif name in quantised:
            assert t.dtype == torch.float8_e4m3fn and t.shape == bf16[name].shape, name
        else:  # embedding, norms (the tiny shape's LM head is tied): bf16 and bit-identical
            assert t.dtype == torch.bfloat16 and torch.equal(t, bf16[name]), name
    with open(os.path.join(written[layout], "config.json")) as f:
        cfg = json.load(f)
    assert cfg["quantization_config"] == fp8_checkpoints.quantization_config(fmt)
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == shapes.SHAPES[SHAPE]
    assert quant_format.weight_format(cfg["quantization_config"]) == fmt
    marker = checkpoints.read_marker(written[layout])
    assert marker["fp8"] == layout and marker["config"] == cfg
    assert checkpoints.is_current(written[layout], SHAPE, fp8=layout)
    assert not checkpoints.is_current(written[layout], SHAPE)
    assert not checkpoints.is_current(written["bf16"], SHAPE, fp8=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dequantised_weights_are_the_bf16_source_within_e4m3_rounding(written, layout):
    bf16, fp8 = read_tensors(written["bf16"]), read_tensors(written[layout])
    scale_name = SCALE[layout][0]
    worst = 0.0
    for name in _projection_weights(shapes.SHAPES[SHAPE]):
        q, w = fp8[name], bf16[name].double()
        s = _expand(fp8[name.removesuffix("weight") + scale_name], layout, *w.shape)
        bound = (2**-4 * w.abs() + 2**-10 * s) * SLACK
        err = (q.double() * s - w).abs()
        assert (err <= bound).all(), f"{name}: worst {(err / bound).max().item():.3f} of the bound"
        worst = max(worst, (err / bound).max().item())
        # The bound is not loose, and wrong scales break it: 2^-3 larger is outside it.
        assert not ((q.double() * s * (1 + 2**-3) - w).abs() <= bound).all(), name
    assert worst > 0.5, worst


def test_scale_is_amax_over_448_per_group():
    w = (torch.randn(300, 200) * 0.05).to(torch.bfloat16)
    w[17, 3] = 1.75  # a row's, a block's and the tensor's maximum
    for layout, expect in (("tensor", lambda: w.float().abs().max()),
                           ("channel", lambda: w.float().abs().amax(1, keepdim=True)),
                           ("block", lambda: torch.stack([torch.stack([w.float()[i:i + 128, j:j + 128].abs().max()
                                                                       for j in range(0, 200, 128)])
                                                          for i in range(0, 300, 128)]))):
        fmt = fp8_checkpoints.FORMATS[layout]
        q, s = fp8_checkpoints.quantise(w, fmt)
        torch.testing.assert_close(s.float(), (expect() / 448).to(s.dtype).float(), rtol=0, atol=0)
        assert q.float().abs().max().item() == 448.0  # the group holding 1.75 reaches e4m3's largest value


def test_formats_parse_in_vllm():
    """vLLM's own config parsers take the configs, with the layout and the unquantised LM head."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    tensor = Fp8Config.from_config(fp8_checkpoints.quantization_config(fp8_checkpoints.FORMATS["tensor"]))
    assert tensor.is_checkpoint_fp8_serialized and tensor.weight_block_size is None
    assert tensor.activation_scheme == "dynamic" and tensor.ignored_layers == ["lm_head"]
    block = Fp8Config.from_config(fp8_checkpoints.quantization_config(fp8_checkpoints.FORMATS["block"]))
    assert block.is_checkpoint_fp8_serialized and block.weight_block_size == [128, 128]
    channel = CompressedTensorsConfig.from_config(
        fp8_checkpoints.quantization_config(fp8_checkpoints.FORMATS["channel"]))
    scheme = channel.target_scheme_map["Linear"]
    assert scheme["weights"].strategy == "channel" and scheme["input_activations"].dynamic
    assert CompressedTensorsConfig._is_fp8_w8a8(scheme["weights"], scheme["input_activations"])
    assert channel.ignore == ["lm_head"] and channel.quant_format == "float-quantized"


@pytest.mark.parametrize("layout", ["channel", "block"])
@pytest.mark.parametrize("n,k", [(512, 256), (200, 300), (128, 4096)])
def test_scale_shapes_are_vllms(layout, n, k):
    """The scale shape of a weight [n, k] is the one vLLM's scale parameter has (layers/quantization/utils/
    fp8_utils.py create_fp8_scale_parameter)."""
    from vllm.model_executor.layers.quantization.utils.fp8_utils import create_fp8_scale_parameter
    from vllm.model_executor.parameter import BlockQuantScaleParameter, ChannelQuantScaleParameter

    kind = ChannelQuantScaleParameter if layout == "channel" else BlockQuantScaleParameter
    with mock.patch("vllm.model_executor.parameter.get_tensor_model_parallel_rank", return_value=0), \
            mock.patch("vllm.model_executor.parameter.get_tensor_model_parallel_world_size", return_value=1):
        param = create_fp8_scale_parameter(kind, [n], k, list(BLOCK) if layout == "block" else None, None)
    fmt = Fp8Format("compressed-tensors", layout)
    assert fmt.scale_shapes(n, k) == (tuple(param.shape),)
    q, s = fp8_checkpoints.quantise(torch.randn(n, k).to(torch.bfloat16), fmt)
    assert tuple(s.shape) == tuple(param.shape) and tuple(q.shape) == (n, k)


def test_make_checkpoint_fp8_flag(tmp_path, capsys):
    from kog_backend.tools.commands import make_checkpoint

    p = argparse.ArgumentParser()
    make_checkpoint.add_arguments(p)
    out = str(tmp_path / "c")
    assert make_checkpoint.run(p.parse_args(["--shape", SHAPE, "--out", out, "--device", "cpu", "--fp8", "block"])) == 0
    assert capsys.readouterr().out.strip() == out
    assert checkpoints.read_marker(out)["fp8"] == "block"
    assert make_checkpoint.run(p.parse_args(["--shape", SHAPE, "--out", str(tmp_path / "d"), "--device", "cpu",
                                             "--fp8", "tensor", "--dtype", "float16"])) == 2
    assert not os.path.exists(tmp_path / "d")
    assert checkpoints.default_checkpoint_dir(SHAPE, 3, "channel").endswith(f"{SHAPE}-fp8-channel-seed3")
