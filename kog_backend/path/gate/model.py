"""The model: its config.json and the weights vLLM loaded. Each reason names the config field that causes it.

model_spec reads a loaded model and coverage reads a config.json; both ask these functions. A reason turns kog
off for the whole server (the stock path serves the model). Of the quantised models, FP8 weights in the layouts
the FP8 kernel reads (quant_format: tensor, channel, block 128x128) pass at TP = 1, and model_spec checks each
projection as vLLM holds it after loading (fp8_loaded_reason); every other method runs stock. An FP8 checkpoint's
scales can also be checked against its tensor index (fp8_checkpoint_reason, `kog doctor --model`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kog_backend.path import quant_format
from kog_backend.path.quant_format import Fp8Format

# config.json `architectures[0]` -> the kernel's family ("llama": Llama and Mistral)
SUPPORTED_ARCHS = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
# Mixture-of-experts architectures vLLM 0.26 serves; of them, the MoE kernel (csrc/include/kog/moe_stages.cuh)
# implements MOE_KERNEL_ARCHS, taken only with the kog option moe_kernel (off until its GPU tests pass).
MOE_KERNEL_ARCHS = {"Qwen3MoeForCausalLM": "qwen3"}
MOE_ARCHS = (
    "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
    "GptOssForCausalLM", "OlmoeForCausalLM",
)  # fmt: skip
SUPPORTED_HEAD_DIMS = (64, 128)
ROPE_TYPES = ("default", "llama3")  # what the RoPE cache the kernel reads holds

REASONS = {
    "architecture": "architectures {archs} is not supported (dense Llama, Mistral, Qwen2, Qwen3 only)",
    "mixture_of_experts": "architectures {archs}: mixture-of-experts is not on the kog path yet",
    "moe_dense_layers": "mlp_only_layers {dense} / decoder_sparse_step {step}: the MoE kernel runs models whose every "
                        "layer is sparse",
    "moe_quantized": "quantization {method} with mixture of experts: the MoE kernel streams bf16 experts",
    "moe_backend": "vLLM's MoE backend {backend}: the MoE kernel reads the experts as the Triton backend holds them "
                   "(w13 rows [0, I) gate, [I, 2 I) up; FlashInfer's CUTLASS backend swaps them)",
    "moe_parallel": "mixture of experts split over GPUs (tensor parallelism {tp}, layer {layer} w13 {got} for {want}): "
                    "kog's MoE block runs on one GPU, without the experts' all-reduce",
    "moe_shared_expert": "layer {layer} has a shared expert: kog's MoE block has none",
    "moe_router": "layer {layer}: vLLM routes with {router} (scoring {scoring}, renormalize {renormalize}); kog's MoE "
                  "block routes by softmax top-k, renormalised as norm_topk_prob {norm}",
    "sliding_window": "sliding_window {window}: sliding-window attention is not supported",
    "rope_scaling": "rope_scaling {kind!r} is not supported (default and llama3 only)",
    "quantization": "quantization_config {method}: not supported",
    "fp8_tp": "fp8 ({layout}) weights at tensor parallelism {tp}: not on the kog path yet (the FP8 kernel is TP = 1 "
              "only)",
    "fp8_loaded_weight": "fp8 ({layout}) weights: {name} as vLLM holds it is {got}, not float8_e4m3fn {expected} "
                         "(repacked or padded by vLLM's GEMM kernel; not on the kog path)",
    "fp8_loaded_scale": "fp8 ({layout}) weights: {name} as vLLM holds it is {got}, not float32 {expected} contiguous",
    "fp8_weight_dtype": "fp8 ({layout}) checkpoint: weight {weight} is {dtype}, not float8_e4m3fn",
    "fp8_scale_missing": "fp8 ({layout}) checkpoint: {weight} has no {scale} tensor",
    "fp8_scale_shape": "fp8 ({layout}) checkpoint: scale {scale} has shape {shape}, expected {expected} for a "
                       "weight of {weight_shape}",
    "fp8_scale_dtype": "fp8 ({layout}) checkpoint: scale {scale} is {dtype} (float32, bfloat16 or float16 only)",
    "torch_dtype": "torch_dtype {dtype} (bf16 only; serve it with --dtype bfloat16)",
    "mlp_bias": "mlp_bias: the MLP projections have a bias",
    "o_proj_bias": "attention_bias: o_proj has a bias (only Qwen2's QKV bias is supported)",
    "qkv_bias_mixed": "attention_bias: some layers have a QKV bias and some do not",
    "head_dim": "head_dim {head_dim} (64 or 128 only)",
    "tp_divisible": "num_attention_heads {heads} / num_key_value_heads {kv_heads} / intermediate_size "
                    "{intermediate} not divisible by tensor parallelism {tp}",
    "no_layers": "{model} has no .model.layers",
    "mlp_not_dense": "layer {layer} MLP {mlp} is not a dense gate/up/down MLP",
    "rotary_class": "rope_scaling: rotary embedding {name} is not supported (default and llama3 only)",
    "rotary_partial": "rope_scaling / partial_rotary_factor: only full-head neox-style RoPE is supported",
    "sinks": "attention sinks are not supported",
}


def architecture_reason(archs: list[str], num_experts: int | None = None, moe_kernel: bool = False) -> str | None:
    """Why the config's `architectures` are not on the kog path, or None. A mixture-of-experts model (a MOE_ARCHS
    architecture, or any config with experts: num_experts, num_local_experts or n_routed_experts) has its own
    reason, unless moe_kernel (the kog option) is on and its architecture is one the MoE kernel implements."""
    if archs and archs[0] in SUPPORTED_ARCHS and not num_experts:
        return None
    if moe_kernel and archs and archs[0] in MOE_KERNEL_ARCHS:
        return None
    if num_experts or (archs and archs[0] in MOE_ARCHS):
        return REASONS["mixture_of_experts"].format(archs=archs)
    return REASONS["architecture"].format(archs=archs)


def _config_field(cfg: Any) -> Any:
    """A field reader (None when absent) of a config.json dict or a transformers config."""
    return cfg.get if isinstance(cfg, Mapping) else (lambda k: getattr(cfg, k, None))


def moe_layers_reason(cfg: Any) -> str | None:
    """A Qwen3-MoE config whose layers are not all sparse (mlp_only_layers, decoder_sparse_step > 1): the MoE kernel
    has no dense layer."""
    get = _config_field(cfg)
    dense, step = list(get("mlp_only_layers") or []), get("decoder_sparse_step") or 1
    if dense or step != 1:
        return REASONS["moe_dense_layers"].format(dense=dense, step=step)
    return None


def config_num_experts(cfg: Any) -> int | None:
    """Routed experts per layer of a config.json dict or a transformers config (None: a dense model). The field's name
    differs by family: num_experts (Qwen2/3-MoE, OLMoE), num_local_experts (Mixtral, GPT-OSS), n_routed_experts
    (DeepSeek)."""
    get = _config_field(cfg)
    for field in ("num_experts", "num_local_experts", "n_routed_experts"):
        if get(field):
            return int(get(field))
    return None


def moe_block_reason(layer: int, tp: int, w13_shape: tuple[int, ...], moe: Any, backend: Any, shared_expert: Any,
                     router: Any) -> str | None:
    """A Qwen3-MoE layer as vLLM 0.26 built it that kog's MoE block would not read or compute as vLLM does: an
    unquantized MoE backend (UnquantizedFusedMoEMethod.unquantized_backend) other than TRITON, the one that keeps w13
    as the checkpoint's gate and up rows (fused_moe/oracle/unquantized.py picks it first on SM 90; --moe-backend or
    another GPU may pick FlashInfer's, which reorders w13); experts split over GPUs (tensor parallelism shards each
    expert's rows and all-reduces the sum; expert parallelism keeps E / ep experts); a shared expert
    (Qwen3MoeSparseMoeBlock builds one for shared_expert_intermediate_size > 0); or a router other than vLLM's softmax
    top-k (FusedTopKRouter) with the config's renormalisation (a routing simulator,
    fused_moe/router/router_factory.py). router None: not checked (the modules' stand-in has none)."""
    name = getattr(backend, "name", str(backend))
    if name != "TRITON":
        return REASONS["moe_backend"].format(backend=name)
    want = (moe.num_experts, 2 * moe.intermediate_size)
    if tp > 1 or tuple(w13_shape[:2]) != want:
        return REASONS["moe_parallel"].format(tp=tp, layer=layer, got=list(w13_shape[:2]), want=list(want))
    if shared_expert is not None:
        return REASONS["moe_shared_expert"].format(layer=layer)
    if router is not None:
        scoring, renormalize = getattr(router, "scoring_func", None), getattr(router, "renormalize", None)
        if type(router).__name__ != "FusedTopKRouter" or scoring != "softmax" or renormalize != moe.norm_topk_prob:
            return REASONS["moe_router"].format(layer=layer, router=type(router).__name__, scoring=scoring,
                                                renormalize=renormalize, norm=moe.norm_topk_prob)
    return None


def sliding_window_reason(window: int | None, use_sliding_window: bool | None) -> str | None:
    """Mistral sets only the window (null in 7B-v0.3); Qwen2/Qwen3 also the switch (off in every published config)."""
    if window and (use_sliding_window is None or use_sliding_window):
        return REASONS["sliding_window"].format(window=window)
    return None


def rope_scaling_reason(rope: dict | None) -> str | None:
    """Default RoPE and Llama 3's scaling are what the RoPE cache the kernel reads holds; YaRN, dynamic NTK,
    linear and longrope are not checked against vLLM on the kog path (no listed config uses them)."""
    kind = (rope or {}).get("rope_type") or (rope or {}).get("type") or "default"
    if kind not in ROPE_TYPES:
        return REASONS["rope_scaling"].format(kind=kind)
    return None


def quantization_reason(qcfg: Mapping[str, Any] | None, method: str | None = None, tp_size: int = 1) -> str | None:
    """qcfg: config.json's quantization_config; method: vLLM's --quantization, or the dtype of a quantised
    parameter; tp_size: tensor parallelism. The FP8 formats (kog_backend.path.quant_format) pass at TP = 1 (the
    loaded weights are checked later, fp8_loaded_reason); any other method is named."""
    fmt = quant_format.weight_format(qcfg, method)
    if fmt is None:
        return None
    if isinstance(fmt, Fp8Format):
        return fp8_tp_reason(fmt.describe(), tp_size)
    return REASONS["quantization"].format(method=fmt)


def fp8_tp_reason(layout: str, tp_size: int) -> str | None:
    """The FP8 kernel instantiations are TP = 1 only. layout: as reasons name it (Fp8Format.describe)."""
    if tp_size > 1:
        return REASONS["fp8_tp"].format(layout=layout, tp=tp_size)
    return None


def _describe_tensor(t: Any) -> str:
    if t is None:
        return "missing"
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)} strides {list(t.stride())}"


def fp8_loaded_reason(fmt: Fp8Format, name: str, weight: Any, scale: Any, n: int, k: int) -> str | None:
    """One projection of N output rows and K inputs as vLLM holds it after loading (model_spec.fp8_projection):
    `weight` the module's weight parameter, float8_e4m3fn [K, N] strides (1, K) (the `.t()` of row-major [N, K]
    bytes: the tensor and channel layouts, CUTLASS's column-major B) or [N, K] strides (K, 1) (block); `scale` its
    scale parameter, float32, contiguous, of the layout's shape ([] or [1]; [N, 1]; [ceil(N/128), ceil(K/128)]).
    Anything else is a layout vLLM's GEMM kernel made for itself (Marlin's int32 tiles, CUTLASS's padding to
    multiples of 16) or a projection the checkpoint left unquantised."""
    import torch

    layout = fmt.describe()
    shape, strides = ((n, k), (k, 1)) if fmt.layout == "block" else ((k, n), (1, k))
    if weight is None or weight.dtype != torch.float8_e4m3fn or tuple(weight.shape) != shape or (
            weight.stride() != strides):  # fmt: skip
        return REASONS["fp8_loaded_weight"].format(
            layout=layout, name=f"{name} weight", got=_describe_tensor(weight),
            expected=f"{list(shape)} strides {list(strides)}")  # fmt: skip
    shapes = fmt.scale_shapes(n, k)
    if scale is None or scale.dtype != torch.float32 or tuple(scale.shape) not in shapes or not scale.is_contiguous():
        return REASONS["fp8_loaded_scale"].format(
            layout=layout, name=f"{name} {fmt.scale_name}", got=_describe_tensor(scale),
            expected=" or ".join(str(list(e)) for e in shapes))  # fmt: skip
    return None


def fp8_checkpoint_reason(fmt: Fp8Format, index: Mapping[str, tuple[tuple[int, ...], str]]) -> str | None:
    """Every weight the format stores in FP8 has its scale, of the layout's shape and a float dtype.

    index: every tensor of the checkpoint, name -> (shape, torch dtype name) (kog_backend.path.checkpoint_index).
    A checkpoint of bf16 weights that vLLM quantises at load (fmt.online) has no scales to check."""
    if fmt.online:
        return None
    layout = fmt.describe()
    for weight in quant_format.quantised_weights(fmt, index):
        shape, dtype = index[weight]
        if dtype != quant_format.WEIGHT_DTYPE:
            return REASONS["fp8_weight_dtype"].format(layout=layout, weight=weight, dtype=dtype)
        scale = weight.removesuffix("weight") + fmt.scale_name
        if scale not in index:
            return REASONS["fp8_scale_missing"].format(layout=layout, weight=weight, scale=fmt.scale_name)
        scale_shape, scale_dtype = index[scale]
        expected = fmt.scale_shapes(*shape)
        if tuple(scale_shape) not in expected:
            return REASONS["fp8_scale_shape"].format(
                layout=layout, scale=scale, shape=list(scale_shape),
                expected=" or ".join(str(list(e)) for e in expected), weight_shape=list(shape))
        if scale_dtype not in quant_format.SCALE_DTYPES:
            return REASONS["fp8_scale_dtype"].format(layout=layout, scale=scale, dtype=scale_dtype)
    return None


def torch_dtype_reason(dtype: str | None) -> str | None:
    """config.json's torch_dtype (None: vLLM's default, bf16 for the listed families)."""
    if dtype not in (None, "bfloat16"):
        return REASONS["torch_dtype"].format(dtype=dtype)
    return None


def bias_reason(mlp_bias: bool, o_proj_bias: bool, qkv_bias_per_layer: list[bool] | None = None) -> str | None:
    """Biases: Qwen2's QKV bias (every layer or none) is the only one the kernel adds."""
    if mlp_bias:
        return REASONS["mlp_bias"]
    if o_proj_bias:
        return REASONS["o_proj_bias"]
    if qkv_bias_per_layer and len(set(qkv_bias_per_layer)) > 1:
        return REASONS["qkv_bias_mixed"]
    return None


def config_bias_reason(arch: str, cfg_mlp_bias: Any, cfg_attention_bias: Any) -> str | None:
    """config.json's mlp_bias and attention_bias: Llama / Mistral / Qwen3 put attention_bias on q, k, v and o_proj."""
    return bias_reason(bool(cfg_mlp_bias), bool(cfg_attention_bias) and arch != "qwen2")


def head_dim_reason(head_dim: int) -> str | None:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return REASONS["head_dim"].format(head_dim=head_dim)
    return None


def tp_divisible_reason(heads: int, kv_heads: int, intermediate: int, tp: int) -> str | None:
    if heads % tp or kv_heads % tp or intermediate % tp:
        return REASONS["tp_divisible"].format(heads=heads, kv_heads=kv_heads, intermediate=intermediate, tp=tp)
    return None


def layers_reason(model: Any) -> str | None:
    """A loaded vLLM model with decoder layers at .model.layers (every supported architecture's layout)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        return REASONS["no_layers"].format(model=type(model).__name__)
    return None


def mlp_reason(layer: int, mlp: Any) -> str | None:
    if not hasattr(mlp, "gate_up_proj"):
        return REASONS["mlp_not_dense"].format(layer=layer, mlp=type(mlp).__name__)
    return None


def rotary_reason(rope: Any, head_dim: int) -> str | None:
    """vLLM's rotary embedding module: the plain or Llama 3 one, neox style over the whole head."""
    if type(rope).__name__ not in ("RotaryEmbedding", "Llama3RotaryEmbedding"):
        return REASONS["rotary_class"].format(name=type(rope).__name__)
    if not rope.is_neox_style or rope.rotary_dim != head_dim:
        return REASONS["rotary_partial"]
    return None


def sinks_reason(attention: Any) -> str | None:
    return REASONS["sinks"] if getattr(attention, "sinks", None) is not None else None
