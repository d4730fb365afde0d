"""FP8 (e4m3) weight-only linear: the torch reference of what the FP8 monokernel is to compute.

    W[n, k] = float32(W_fp8[n, k]) * scale(n, k)         dequantisation, per layout (kog_backend.path.quant_format)
    y[n]    = sum_k float32(x_bf16[k]) * W[n, k]         fp32 accumulation; rounded once to bf16 by `linear`

scale(n, k), by layout, for W_fp8 of [N, K]:
  tensor   s                    s: [] or [1]
  channel  s[n, 0]              s: [N, 1]
  block    s[n // 128, k // 128]  s: [ceil(N/128), ceil(K/128)] (the last row/column of blocks may be partial)

Activations stay bf16 (weight-only) unless quantise_x: then quantise_input gives them stock's dynamic e4m3
quantisation (DecoderWeights.fp8_act, the kernel's ModelArgs::fp8_act). For the three formats
`kog make-checkpoint --fp8` writes, stock vLLM 0.26 on Hopper (sm_90) does not compute the bf16-input form: it
quantises the activations to FP8 as well and runs an FP8 x FP8 GEMM (the venv's vllm/model_executor/...):
  fp8 per tensor, compressed-tensors tensor / channel:
      CutlassFP8ScaledMMLinearKernel (kernels/linear/__init__.py:325-333; Marlin, the weight-only FP8 kernel, is
      skipped on capability >= 8.9, kernels/linear/scaled_mm/marlin.py:46-55; FlashInfer's needs >= 10.0,
      flashinfer.py:50) with dynamic per-token FP8 activations (layers/quantization/fp8.py:314-320,
      compressed_tensors_w8a8_fp8.py:49-52).
  block 128x128:
      FlashInfer / DeepGEMM, DeepGEMM, or CUTLASS block-FP8 (kernels/linear/__init__.py:355-364, the first whose
      package and GPU are there), each with per-token, per-128-column-group FP8 activations
      (layers/quantization/fp8.py:300-309; scaled_mm/cutlass.py:297-310).
  compressed-tensors without input_activations (W8A16; not what `kog make-checkpoint --fp8 channel` writes):
      a weight-only FP8 kernel with bf16 activations, as here (compressed_tensors_w8a16_fp8.py, Humming or Marlin
      from kernels/linear/__init__.py:379-383; Marlin refuses capability >= 8.9 unless VLLM_TEST_FORCE_FP8_MARLIN,
      and whether Humming loads on sm_90 is not checked here).
And for the per-tensor layout, vLLM does not keep the checkpoint's weights as they are: a fused module (qkv_proj,
gate_up_proj) has one scale per shard on disk, and at load vLLM requantises every shard with the largest of them
(layers/quantization/utils/w8a8_utils.py:76-107), so the loaded weight is the checkpoint's re-rounded. The kernel
reads vLLM's loaded parameters; a reference for it dequantises those (one scale per fused module), not the files.
"""

from __future__ import annotations

import torch

from kog_backend.path.quant_format import BLOCK


def dequantise(weight: torch.Tensor, scale: torch.Tensor, layout: str) -> torch.Tensor:
    """float32 [N, K] from an FP8 weight [N, K] and its scale in `layout` (tensor, channel or block)."""
    n, k = weight.shape
    w = weight.float()
    s = scale.float()
    if layout == "tensor":
        if s.numel() != 1:
            raise ValueError(f"per-tensor scale of shape {list(s.shape)}")
        return w * s.reshape(())
    if layout == "channel":
        if tuple(s.shape) != (n, 1):
            raise ValueError(f"per-channel scale of shape {list(s.shape)}, expected [{n}, 1]")
        return w * s
    if layout == "block":
        bn, bk = BLOCK
        expected = (-(-n // bn), -(-k // bk))
        if tuple(s.shape) != expected:
            raise ValueError(f"block scale of shape {list(s.shape)}, expected {list(expected)}")
        full = s.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
        return w * full
    raise ValueError(f"unknown layout {layout!r}")


E4M3_MAX = 448.0
# vLLM's _FP8_MIN_SCALING_FACTOR (input_quant_fp8.py)
MIN_SCALE = 1.0 / (E4M3_MAX * 512.0)


def quantise_input(x: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] (bf16) as stock vLLM 0.26 quantises a linear layer's input on Hopper (QuantFP8, dynamic): the e4m3
    values [..., K] and the fp32 scales, [..., ceil(K / 128)] for block weights (one per 128-element group:
    s = max(amax / 448, MIN_SCALE), q = e4m3(x / s)), else [..., 1] (one per token: q = e4m3(x * (1 / s))).
    Division and reciprocal correctly rounded, e4m3 round-to-nearest-even after the clamp to +-448, as the
    kernel's quantise_input_e4m3 (csrc/include/kog/fp8_act.cuh) computes them."""
    xf = x.float()
    k = xf.shape[-1]
    if layout == "block":
        g = BLOCK[1]
        groups = -(-k // g)
        padded = torch.nn.functional.pad(xf, (0, groups * g - k)).unflatten(-1, (groups, g))
        s = (padded.abs().amax(dim=-1) / E4M3_MAX).clamp(min=MIN_SCALE)
        q = (padded / s.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).flatten(-2)[..., :k]
        return q, s
    if layout not in ("tensor", "channel"):
        raise ValueError(f"unknown layout {layout!r}")
    s = (xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=MIN_SCALE)
    q = (xf * s.reciprocal()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, s


def dequantise_input(q: torch.Tensor, s: torch.Tensor, layout: str) -> torch.Tensor:
    """float32 [..., K] of quantise_input's result."""
    if layout == "block":
        return q.float() * s.repeat_interleave(BLOCK[1], dim=-1)[..., : q.shape[-1]]
    return q.float() * s


def linear_fp32(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, layout: str,
                quantise_x: bool = False) -> torch.Tensor:
    """x [..., K] (bf16) @ dequantise(weight, scale).T in fp32: [..., N] float32, before the output rounding.
    quantise_x: x through quantise_input first (its dequantised fp32 values enter the product)."""
    xf = dequantise_input(*quantise_input(x, layout), layout) if quantise_x else x.float()
    return torch.matmul(xf, dequantise(weight, scale, layout).t())


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, layout: str,
           out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
           quantise_x: bool = False) -> torch.Tensor:
    """linear_fp32 (+ bias, bf16 [N], joining the fp32 sum) rounded once to out_dtype (bf16: what the kernel writes,
    as torch_step.linear for bf16 weights)."""
    y = linear_fp32(x, weight, scale, layout, quantise_x)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)
