"""What the kog path needs to know about a loaded model: its shape and views of vLLM's own tensors.

Nothing here copies a weight: every tensor is the vLLM parameter itself (TP-local shard), so the torch step
and the monokernel read exactly the bytes the stock path reads.

Shapes (TP-local, bf16, row-major [out, in]):
  embed       [V_pad/tp, H]        vocab padded to a multiple of 64 by vLLM
  qkv         [(nh + 2 nkv) D, H]  rows Q | K | V
  qkv_bias    [(nh + 2 nkv) D]     Qwen2 only
  q_norm      [D]                  Qwen3 only (k_norm likewise)
  o_proj      [H, nh D]
  gate_up     [2 I, H]             rows gate | up
  down        [H, I]
  norms       [H]
  lm_head     [V_pad/tp, H]        the same tensor as embed when tied
  cos_sin     [max_pos, D]         cos in [:, :D/2], sin in [:, D/2:], the model's dtype; llama3 scaling included
FP8 weights (DecoderWeights.fp8: a quant_format layout, TP = 1): qkv, o_proj, gate_up and down are float8_e4m3fn
[out, in] row-major (views of vLLM's loaded parameters, `.t()` of its [in, out] column-major ones for the tensor
and channel layouts), each with its fp32 scale: tensor [] or [1]; channel [out, 1]; block [ceil(out/128),
ceil(in/128)]. Embedding, LM head, norms and qkv_bias stay bf16.
KV cache per layer: logical [num_blocks, nkv, block_size, 2 D] (K in [..., :D], V in [..., D:]); read its
strides, the memory order is NHD by default but HND under VLLM_KV_CACHE_LAYOUT or a KV connector.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kog_backend.path import quant_format
from kog_backend.path.gate import kv_cache as kv_gate
from kog_backend.path.gate import model as model_gate
from kog_backend.path.gate.model import SUPPORTED_ARCHS, SUPPORTED_HEAD_DIMS  # noqa: F401  (read here by tools, tests)
from kog_backend.path.gate.server import model_dtype_reason
from kog_backend.path.quant_format import Fp8Format


class UnsupportedModel(Exception):
    """The loaded model cannot run on the kog path; str(e) is the gate's reason."""


def _refuse(reason: str | None) -> None:
    if reason is not None:
        raise UnsupportedModel(reason)


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    arch: str  # "llama" (Llama, Mistral) | "qwen3" | "qwen2"
    num_layers: int
    hidden_size: int
    num_heads: int  # TP-local
    num_kv_heads: int  # TP-local
    head_dim: int
    intermediate_size: int  # TP-local
    vocab_size: int  # logical vocabulary (never sample a padded row)
    padded_vocab_local: int  # rows of this rank's LM head shard
    vocab_start: int  # first logical id held by this rank's LM head shard
    rms_eps: float
    qk_norm: bool
    tied_embeddings: bool
    max_position: int
    tp_size: int = 1
    tp_rank: int = 0
    qkv_bias: bool = False  # Qwen2: a bias on the QKV projection

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def gqa_ratio(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def kv_bytes_per_position(self) -> int:
        """bf16 K and V of one context position over all layers (this rank's KV heads): what attention reads per
        position of its context."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2


@dataclasses.dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    qkv_bias: torch.Tensor | None = None  # [(nh + 2 nkv) D], Qwen2
    # FP8 weights' fp32 scales (None for bf16 weights), laid out by DecoderWeights.fp8 (module docstring); gate_up's
    # rows are gate | up, as its weight's.
    qkv_scale: torch.Tensor | None = None
    o_scale: torch.Tensor | None = None
    gate_up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None


# LayerWeights projection -> the field of its FP8 scale
SCALE_FIELDS = {"qkv": "qkv_scale", "o_proj": "o_scale", "gate_up": "gate_up_scale", "down": "down_scale"}


@dataclasses.dataclass
class DecoderWeights:
    shape: DecoderShape
    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    cos_sin: torch.Tensor
    fp8: str | None = None  # None: bf16 projections; else their FP8 layout (quant_format.LAYOUTS)

    @property
    def projection_bytes(self) -> int:
        """Bytes of one element of the four layer projections: 2 (bf16) or 1 (FP8); plan.make_plan's weight_bytes."""
        return 1 if self.fp8 is not None else 2

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (embedding: one row; tied LM head counted once; FP8 projections at
        one byte per element, plus their fp32 scales)."""
        n = sum(t.numel() * t.element_size() for lw in self.layers for t in _tensors(lw) if t is not None)
        n += self.lm_head.numel() * self.lm_head.element_size()
        n += self.final_norm.numel() * self.final_norm.element_size()
        n += self.embed.shape[1] * self.embed.element_size()
        return n


def _tensors(lw: LayerWeights) -> list[torch.Tensor | None]:
    """A layer's tensors, the same objects (dataclasses.astuple would deep-copy them)."""
    return [getattr(lw, f.name) for f in dataclasses.fields(lw)]


@dataclasses.dataclass(frozen=True)
class KVCacheView:
    """K and V views of one layer's paged cache: [num_blocks, block_size, nkv, D] each (strided)."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def block_size(self) -> int:
        return self.k.shape[1]

    @property
    def num_blocks(self) -> int:
        return self.k.shape[0]


def kv_cache_view(kv_cache: torch.Tensor, head_dim: int) -> KVCacheView:
    _refuse(kv_gate.layout_reason(kv_cache, head_dim))
    kv = kv_cache.permute(0, 2, 1, 3)  # [blocks, block_size, nkv, 2D], strided
    return KVCacheView(k=kv[..., :head_dim], v=kv[..., head_dim:])


def _rms_eps(norm: Any) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None:
        eps = getattr(norm, "eps")
    return float(eps)


def from_vllm_model(model: torch.nn.Module, vllm_config: Any, moe_kernel: bool = False) -> Any:
    """Views of a loaded vLLM Llama/Qwen3 model (`runner.model`): DecoderWeights; with moe_kernel (the kog option), a
    Qwen3-MoE model's as moe_step.MoeDecoderWeights (vLLM's fused experts and the routers). Raises UnsupportedModel
    with a reason."""
    hf = vllm_config.model_config.hf_config
    archs = list(getattr(hf, "architectures", None) or [])
    num_experts = model_gate.config_num_experts(hf)
    _refuse(model_gate.architecture_reason(archs or [type(model).__name__], num_experts, moe_kernel))
    moe = None
    if num_experts:  # (architecture_reason passed it: a MoE kernel architecture, with the option on)
        from kog_backend.reference.moe_step import MoeShape

        _refuse(model_gate.moe_layers_reason(hf))
        moe = MoeShape(num_experts=int(num_experts), top_k=int(hf.num_experts_per_tok),
                       intermediate_size=int(hf.moe_intermediate_size), norm_topk_prob=bool(hf.norm_topk_prob))
        arch = model_gate.MOE_KERNEL_ARCHS[archs[0]]
    else:
        arch = SUPPORTED_ARCHS[archs[0]]
    _refuse(model_gate.layers_reason(model))
    inner = model.model
    _refuse(model_gate.sliding_window_reason(getattr(hf, "sliding_window", None),
                                             getattr(hf, "use_sliding_window", None)))
    params = {n: p for n, p in model.named_parameters()}
    quantised = [n for n, p in params.items() if p.dtype not in (torch.bfloat16, torch.float16, torch.float32)]
    first = next(iter(quantised), None)
    qcfg = getattr(hf, "quantization_config", None)
    method = vllm_config.model_config.quantization or (f"{params[first].dtype} parameter {first}" if first else None)
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    _refuse(model_gate.quantization_reason(qcfg, method, tp_size))
    fmt = quant_format.weight_format(qcfg, method)  # an Fp8Format the gate took, or None (bf16)
    if moe is not None and method is not None:
        _refuse(model_gate.REASONS["moe_quantized"].format(method=method))
    dtype = vllm_config.model_config.dtype
    _refuse(model_dtype_reason(dtype))

    if moe is not None:
        return _moe_weights(model, hf, moe, arch, vllm_config)
    layers = []
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        _refuse(model_gate.mlp_reason(i, mlp))
        projections = {"qkv": attn.qkv_proj, "o_proj": attn.o_proj, "gate_up": mlp.gate_up_proj,
                       "down": mlp.down_proj}  # fmt: skip
        if fmt is None:
            views = {name: m.weight for name, m in projections.items()}
        else:
            views = {}
            for name, m in projections.items():
                views[name], views[SCALE_FIELDS[name]] = fp8_projection(fmt, m, f"layer {i} {name}")
        layers.append(
            LayerWeights(
                input_norm=layer.input_layernorm.weight,
                q_norm=attn.q_norm.weight if hasattr(attn, "q_norm") else None,
                k_norm=attn.k_norm.weight if hasattr(attn, "k_norm") else None,
                post_norm=layer.post_attention_layernorm.weight,
                qkv_bias=getattr(attn.qkv_proj, "bias", None),
                **views,
            )
        )
    shape, cos_sin = _attention_shape(model, hf, arch, vllm_config, layers[0].down.shape[1],
                                      qkv_bias=layers[0].qkv_bias is not None)
    _refuse(model_gate.bias_reason(
        mlp_bias=any(getattr(m, "bias", None) is not None for layer in inner.layers
                     for m in (layer.mlp.gate_up_proj, layer.mlp.down_proj)),
        o_proj_bias=any(getattr(layer.self_attn.o_proj, "bias", None) is not None for layer in inner.layers),
        qkv_bias_per_layer=[lw.qkv_bias is not None for lw in layers],
    ))  # fmt: skip
    return DecoderWeights(
        shape=shape,
        embed=inner.embed_tokens.weight,
        layers=layers,
        final_norm=inner.norm.weight,
        lm_head=model.lm_head.weight,
        cos_sin=cos_sin,
        fp8=fmt.layout if fmt is not None else None,
    )


def _attention_shape(model: Any, hf: Any, arch: str, vllm_config: Any, intermediate_size: int,
                     qkv_bias: bool) -> tuple[DecoderShape, torch.Tensor]:
    """The DecoderShape of a loaded model's attention, norms and vocabulary, and the RoPE cache the kernel reads
    (after the gate's head dim, RoPE and sinks checks)."""
    inner = model.model
    attn0 = inner.layers[0].self_attn
    head_dim = attn0.head_dim
    _refuse(model_gate.head_dim_reason(head_dim))
    _refuse(model_gate.rope_scaling_reason(getattr(hf, "rope_scaling", None) or getattr(hf, "rope_parameters", None)))
    rope = attn0.rotary_emb
    _refuse(model_gate.rotary_reason(rope, head_dim))
    _refuse(model_gate.sinks_reason(attn0.attn))
    lm, embed = model.lm_head, inner.embed_tokens.weight
    shard_indices = getattr(lm, "shard_indices", None)
    shape = DecoderShape(
        arch=arch, num_layers=len(inner.layers), hidden_size=embed.shape[1], num_heads=attn0.num_heads,
        num_kv_heads=attn0.num_kv_heads, head_dim=head_dim, intermediate_size=intermediate_size,
        vocab_size=int(hf.vocab_size), padded_vocab_local=lm.weight.shape[0],
        vocab_start=int(shard_indices.org_vocab_start_index) if shard_indices is not None else 0,
        rms_eps=_rms_eps(inner.layers[0].input_layernorm), qk_norm=hasattr(attn0, "q_norm"),
        tied_embeddings=lm.weight.data_ptr() == embed.data_ptr(), max_position=rope.cos_sin_cache.shape[0],
        tp_size=vllm_config.parallel_config.tensor_parallel_size, tp_rank=getattr(lm, "tp_rank", 0),
        qkv_bias=qkv_bias,
    )  # fmt: skip
    cos_sin = rope.cos_sin_cache
    dtype = vllm_config.model_config.dtype
    if cos_sin.dtype != dtype:
        cos_sin = cos_sin.to(dtype)  # what vLLM's rope does on first use (rotary_embedding/base.py)
    return shape, cos_sin


def _moe_weights(model: Any, hf: Any, moe: Any, arch: str, vllm_config: Any) -> Any:
    """A Qwen3-MoE model's views (moe_step.MoeDecoderWeights): per layer the attention's and norms' parameters, the
    router (mlp.gate) and vLLM's fused experts (mlp.experts.routed_experts.w13_weight [E, 2 I, H], w2_weight
    [E, H, I]; the MoE kernel's gate checks their shapes, weights_reason)."""
    from kog_backend.reference.moe_step import MoeDecoderWeights, MoeLayerWeights

    inner = model.model
    layers = []
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        # vLLM 0.26's FusedMoE(...) builds a MoERunner (fused_moe/layer.py): its routed_experts module holds the
        # fused weights and the quant method (fused_moe/runner/moe_runner.py, routed_experts.py).
        experts = getattr(mlp, "experts", None)
        experts = getattr(experts, "routed_experts", experts)
        if experts is None or not hasattr(mlp, "gate") or not hasattr(experts, "w13_weight"):
            _refuse(model_gate.REASONS["mlp_not_dense"].format(layer=i, mlp=type(mlp).__name__))
        _refuse(model_gate.moe_block_reason(
            i, vllm_config.parallel_config.tensor_parallel_size, tuple(experts.w13_weight.shape), moe,
            getattr(getattr(experts, "quant_method", None), "unquantized_backend", None),
            getattr(mlp, "shared_expert", None), getattr(mlp.experts, "router", None),
        ))  # fmt: skip
        layers.append(MoeLayerWeights(
            input_norm=layer.input_layernorm.weight, qkv=attn.qkv_proj.weight, q_norm=attn.q_norm.weight,
            k_norm=attn.k_norm.weight, o_proj=attn.o_proj.weight, post_norm=layer.post_attention_layernorm.weight,
            router=mlp.gate.weight, w13=experts.w13_weight, w2=experts.w2_weight,
        ))  # fmt: skip
    _refuse(model_gate.bias_reason(
        mlp_bias=any(getattr(layer.mlp.gate, "bias", None) is not None for layer in inner.layers),
        o_proj_bias=any(getattr(layer.self_attn.o_proj, "bias", None) is not None for layer in inner.layers),
        qkv_bias_per_layer=[getattr(layer.self_attn.qkv_proj, "bias", None) is not None for layer in inner.layers],
    ))  # fmt: skip
    shape, cos_sin = _attention_shape(model, hf, arch, vllm_config, moe.intermediate_size, qkv_bias=False)
    return MoeDecoderWeights(shape=shape, moe=moe, embed=inner.embed_tokens.weight, layers=layers,
                             final_norm=inner.norm.weight, lm_head=model.lm_head.weight, cos_sin=cos_sin)


def fp8_projection(fmt: Fp8Format, module: Any, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, scale) of one FP8 projection as the kernel reads them, views of a vLLM linear module's parameters
    after process_weights_after_loading (vLLM 0.26 on sm_90; the venv's vllm/model_executor/...):

      tensor   weight [K, N] column-major (strides (1, K)): the `.t()` of row-major [N, K] storage
               (layers/quantization/fp8.py Fp8LinearMethod.process_weights_after_loading, or online/fp8.py for
               --quantization fp8; compressed_tensors_w8a8_fp8.py for compressed-tensors); weight_scale fp32 [] (one
               per module: a fused module's shards requantised to their largest scale at load,
               utils/w8a8_utils.py requantize_with_max_scale) or [1] (online)
      channel  the same weight; weight_scale fp32 [N, 1], the shards' rows concatenated
      block    weight [N, K] row-major (kernels/linear/scaled_mm/BlockScaledMMLinearKernel.py); weight_scale_inv
               (fp8) or weight_scale (compressed-tensors) fp32 [ceil(N/128), ceil(K/128)] row-major, a multiplier

    N, K: the module's logical output_size_per_partition / input_size_per_partition. What the kernel cannot read is
    refused here (the gate's reason): CUTLASS's padding of K or N to a multiple of 16
    (kernels/linear/scaled_mm/cutlass.py), Marlin's int32 tiles (VLLM_TEST_FORCE_FP8_MARLIN, or a weight-only
    compressed-tensors scheme), a projection left bf16 by an ignore list, a missing or re-laid-out scale."""
    n, k = int(module.output_size_per_partition), int(module.input_size_per_partition)
    weight, scale = module.weight, getattr(module, fmt.scale_name, None)
    _refuse(model_gate.fp8_loaded_reason(fmt, name, weight, scale, n, k))
    return (weight if fmt.layout == "block" else weight.t()), scale
