"""Whether a model would run on the kog path, from its config.json alone (no weights, no GPU, no server).

The gate's reasons (kog_backend.path.gate.model, and the tiling plan's, plan.make_plan), from the config's fields,
each naming the field. `kog doctor --model` prints them; tests/test_coverage.py walks
every published config of the families kog covers (tools/fixtures/shapes.MODEL_CONFIGS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kog_backend.monokernel.plan import Plan, make_plan
from kog_backend.path import quant_format
from kog_backend.path.gate import model as gate
from kog_backend.path.gate.model import SUPPORTED_ARCHS
from kog_backend.path.model_spec import DecoderShape

H100_SMS = 132  # H100 SXM and H200: the grid of one launch
GIB = 1024**3
# GPU memory a card reports (torch.cuda.mem_get_info total), by name: what `kog doctor --gpu` takes.
GPU_MEMORY = {"h100": 79.2 * GIB, "h200": 139.8 * GIB}
# What vLLM holds besides weights and KV cache at batch 1 (CUDA graphs, activations, the sampler's buffers) plus
# kog's own buffers (scratch, partials, tagged words, sampling work): a bound, not a measurement of each model.
RUNTIME_OVERHEAD = 3 * GIB


def shape_from_config(cfg: Mapping[str, Any], tp_size: int = 1) -> DecoderShape | str:
    """The DecoderShape vLLM would load for this config.json, or why the kog path would refuse it."""
    archs = list(cfg.get("architectures") or [])
    reason = gate.architecture_reason(archs, gate.config_num_experts(cfg))
    if reason is not None:
        return reason
    arch = SUPPORTED_ARCHS[archs[0]]
    H, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    D = int(cfg.get("head_dim") or H // nh)
    reason = (
        gate.sliding_window_reason(cfg.get("sliding_window"), cfg.get("use_sliding_window"))
        or gate.rope_scaling_reason(cfg.get("rope_scaling") or cfg.get("rope_parameters"))
        or gate.quantization_reason(cfg.get("quantization_config"), None, tp_size)
        or gate.torch_dtype_reason(cfg.get("torch_dtype") or cfg.get("dtype"))
        or gate.config_bias_reason(arch, cfg.get("mlp_bias"), cfg.get("attention_bias"))
        or gate.head_dim_reason(D)
        or gate.tp_divisible_reason(nh, nkv, int(cfg["intermediate_size"]), tp_size)
    )
    if reason is not None:
        return reason
    qkv_bias = arch == "qwen2"
    vocab = int(cfg["vocab_size"])
    padded = -(-vocab // (64 * tp_size)) * 64  # vLLM pads the vocabulary to 64 per rank
    return DecoderShape(
        arch=arch, num_layers=int(cfg["num_hidden_layers"]), hidden_size=H, num_heads=nh // tp_size,
        num_kv_heads=nkv // tp_size, head_dim=D, intermediate_size=int(cfg["intermediate_size"]) // tp_size,
        vocab_size=vocab, padded_vocab_local=padded, vocab_start=0, rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qk_norm=arch == "qwen3", tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position=int(cfg.get("max_position_embeddings", 4096)), tp_size=tp_size, qkv_bias=qkv_bias,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Verdict:
    shape: DecoderShape | None
    plan: Plan | None
    reason: str | None  # None: the kog path takes it

    @property
    def ok(self) -> bool:
        return self.reason is None


def verdict(cfg: Mapping[str, Any], sm_count: int = H100_SMS, tp_size: int = 1) -> Verdict:
    """The gate's answer for this config on a GPU of `sm_count` SMs (the shape checks and the tile plan)."""
    shape = shape_from_config(cfg, tp_size)
    if isinstance(shape, str):
        return Verdict(None, None, shape)
    fp8 = isinstance(quant_format.weight_format(cfg.get("quantization_config")), quant_format.Fp8Format)
    plan = make_plan(shape, sm_count, weight_bytes=1 if fp8 else 2)
    if isinstance(plan, str):
        return Verdict(shape, None, plan)
    return Verdict(shape, plan, None)


def weight_bytes(cfg: Mapping[str, Any]) -> int:
    """Bytes of the stored parameters as vLLM holds them (tied embedding once): bf16, except the decoder layers'
    projections of a dense model with FP8 weights (quant_format.Fp8Format: one byte each; their scales, under 0.1%
    of those bytes even per channel, are not counted). Embedding, LM head and norms stay bf16 in every FP8 format."""
    from kog_backend.tools.bench.model_bytes import normalized
    from kog_backend.tools.fixtures.shapes import BF16_BYTES, param_count, projection_params

    cfg = normalized(cfg)
    total = param_count(cfg) * BF16_BYTES
    fp8 = isinstance(quant_format.weight_format(cfg.get("quantization_config")), quant_format.Fp8Format)
    if fp8 and not gate.config_num_experts(cfg):
        total -= cfg["num_hidden_layers"] * projection_params(cfg) * (BF16_BYTES - 1)
    return total


def kv_bytes_per_token(cfg: Mapping[str, Any]) -> int:
    H, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    D = int(cfg.get("head_dim") or H // nh)
    return 2 * int(cfg["num_hidden_layers"]) * nkv * D * 2


@dataclasses.dataclass(frozen=True)
class MemoryFit:
    gpu_bytes: float
    weights: int
    kv_per_token: int
    max_context: int  # tokens of KV cache left at `utilization`; < 1: the weights do not fit

    @property
    def fits(self) -> bool:
        return self.max_context >= 1

    def describe(self, utilization: float) -> str:
        head = (f"weights {self.weights / GIB:.1f} GiB, KV {self.kv_per_token / 1024:.0f} KiB per token, "
                f"{utilization:.2f} x {self.gpu_bytes / GIB:.1f} GiB")
        if not self.fits:
            return f"{head}: does not fit (the stock path cannot load it either)"
        return f"{head}: fits, KV cache for ~{self.max_context} tokens (--max-model-len at most that)"


def memory_fit(cfg: Mapping[str, Any], gpu_bytes: float, utilization: float = 0.9) -> MemoryFit:
    """Weights + KV cache + RUNTIME_OVERHEAD against `utilization` of a card's memory (vLLM's
    --gpu-memory-utilization, default 0.9): how many tokens of context the rest holds."""
    w, kv = weight_bytes(cfg), kv_bytes_per_token(cfg)
    room = gpu_bytes * utilization - w - RUNTIME_OVERHEAD
    return MemoryFit(gpu_bytes, w, kv, int(room // kv) if room > 0 else 0)
