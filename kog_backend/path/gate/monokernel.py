"""What the monokernel can run: the extension, the GPU, the shape and its tiling plan, tensor parallelism, every
weight and KV-cache tensor as the kernel reads it, and a launch that failed or aborted.

A reason turns kog off for the whole server (the runner records it as `monokernel: <reason>`, or `TP monokernel:
<reason>` under tensor parallelism); a filtered-draw or penalty reason only keeps such requests at one token per
engine step (burst.py).
"""

from __future__ import annotations

from typing import Any

from kog_backend.path import quant_format
from kog_backend.path.gate import environment, extension, kv_cache, model

REQUIRED_CAPABILITY = environment.REQUIRED_CAPABILITY

REASONS = {
    # how the runner records a reason of this level, and what happens to a launch
    "refused": "monokernel: {reason}",
    "tp_refused": "TP monokernel: {reason}",
    "setup_failed": "monokernel set-up failed: {error}",
    "launch_failed": "monokernel launch failed: {error}",
    "kernel_abort": "kernel abort: {detail}",
    "fp8_input_range": "kernel abort: {detail}; the FP8 projections run in fp32 (fp8_gemv 0) from now on",
    # the device (the extension: extension.py)
    "not_cuda": "device {device} is not a CUDA GPU",
    "capability": "compute capability {capability}: the monokernel is built for sm_90a (H100/H200) only",
    "moe_tp": "mixture of experts at tensor-parallel size {tp}: the MoE kernel runs on one GPU",
    "residency": "the device holds {held} blocks of the monokernel at once (occupancy x available SMs), its grid is "
                 "{grid} (another process or a partition holding SMs?)",
    # the shape
    "architecture": "architecture {arch} (llama, qwen2 and qwen3 dense only)",
    "qkv_bias_arch": "attention_bias {bias} does not match architecture {arch}",
    "qk_norm_arch": "qk-norm {qk_norm} does not match architecture {arch}",
    "layer_count": "{layers} layers / {caches} KV caches for a {num_layers}-layer model",
    "lm_head_rows": "lm_head has {rows} rows for {entries} vocabulary entries",
    "qkv_bias_undeclared": "layer {layer} has a QKV bias that the shape does not declare",
    "context": "max_model_len {max_model_len} exceeds the RoPE cache's {rows} rows",
    "fp8_option_off": "fp8 ({layout}) weights: the FP8 kernel is off (kog option fp8_weights; not yet verified on a "
                      "GPU)",
    # tensor parallelism
    "tp_option_off": "tensor parallelism {tp}: the TP monokernel is off (kog option tp_monokernel; verified with "
                     "ranks sharing one GPU, not yet on several GPUs)",
    "tp_needs_buffer": "tensor parallelism {tp} needs the ranks' shared buffer (tp.setup_tp_monokernel)",
    "tp_sharding": "the weights are sharded {shards} ways, the group has {world} ranks",
    "tp_world": "tensor parallelism {world} (the monokernel exchanges partials between at most {most} ranks)",
    "tp_shared_buffer": "shared buffer: {reason}",
    "tp_setup_failed": "set-up failed: {error}",
    "filtered_tp": "top-k/top-p/min-p bursts: not under tensor parallelism",
    "penalties_tp": "penalties in bursts: not under tensor parallelism",
    # one weight tensor (its name: "embed", "layer 3 qkv", ...)
    "tensor_missing": "{name} is missing",
    "tensor_dtype": "{name} is {dtype}, not bf16",
    "tensor_device": "{name} is on {device}, not {expected}",
    "tensor_shape": "{name} has shape {shape}, expected {expected}",
    "tensor_contiguous": "{name} is not contiguous",
    "tensor_alignment": "{name} is not 16-byte aligned",
    # FP8 weights (DecoderWeights.fp8)
    "fp8_unknown_layout": "FP8 layout {fp8!r}: the FP8 kernel reads tensor, channel or block scales",
    "tensor_dtype_fp8": "{name} is {dtype}, not float8_e4m3fn (an FP8 model's projection)",
    "tensor_dtype_scale": "{name} is {dtype}, not float32 (an FP8 weight's scale)",
    "fp8_scale_undeclared": "{name} is set but the projections are bf16 (DecoderWeights.fp8 is None)",
}


def refused(reason: str, tp: bool = False) -> str:
    """The reason the runner records when this level refuses (kog off for the server)."""
    return REASONS["tp_refused" if tp else "refused"].format(reason=reason)


def setup_failed(error: Any) -> str:
    return REASONS["setup_failed"].format(error=error)


def launch_failed(error: Any) -> str:
    return REASONS["launch_failed"].format(error=error)


def kernel_abort(detail: str) -> str:
    return REASONS["kernel_abort"].format(detail=detail)


def fp8_input_range(detail: str) -> str:
    """An FP8 launch of the f16 form aborted on an input beyond its range (sync.cuh kSiteFp8Range): kog stays on, its
    FP8 projections move to the fp32 form (bf16 input)."""
    return REASONS["fp8_input_range"].format(detail=detail)


def fp8_option_reason(fp8: str | None, fp8_weights: bool) -> str | None:
    """FP8 projections (DecoderWeights.fp8, a quant_format layout) run on the FP8 kernel only with the kog option
    fp8_weights."""
    if fp8 is not None and not fp8_weights:
        return REASONS["fp8_option_off"].format(layout=quant_format.Fp8Format("fp8", fp8).describe())
    return None


def tp_option_reason(tp_size: int, tp_monokernel: bool) -> str | None:
    """Tensor parallelism runs on the TP monokernel only with the kog option tp_monokernel."""
    if tp_size > 1 and not tp_monokernel:
        return REASONS["tp_option_off"].format(tp=tp_size)
    return None


def tp_reason(shape: Any, world: int) -> str | None:
    """Why a model sharded `world` ways cannot run on the TP monokernel (None: it can, or world is 1)."""
    from kog_backend.monokernel.layout import CONFIG

    if world < 2:
        return None
    if world > CONFIG["kMaxTP"]:
        return REASONS["tp_world"].format(world=world, most=CONFIG["kMaxTP"])
    if shape.tp_size != world:
        return REASONS["tp_sharding"].format(shards=shape.tp_size, world=world)
    return None


def tp_shared_buffer_reason(reason: str) -> str:
    return REASONS["tp_shared_buffer"].format(reason=reason)


def tp_setup_failed(error: Any) -> str:
    return REASONS["tp_setup_failed"].format(error=error)


def filtered_sampling_reason(plan: Any, tensor_parallel: bool) -> str | None:
    """None when launches may draw with top-k / top-p / min-p (burst_sampling.cuh), else why not."""
    if tensor_parallel:
        return REASONS["filtered_tp"]
    return plan.filtered_sampling_reason


def penalty_reason(tensor_parallel: bool) -> str | None:
    """None when launches may apply vLLM's penalties (penalties.cuh), else why not."""
    return REASONS["penalties_tp"] if tensor_parallel else None


def residency_reason(held: int, grid: int) -> str | None:
    """The kernel's blocks wait for each other: a grid the device cannot hold all at once would hang (the kernel
    aborts it after ~1 ms, sync.cuh; this refuses it up front)."""
    if held < grid:
        return REASONS["residency"].format(held=held, grid=grid)
    return None


def context_reason(max_model_len: int, rope_rows: int) -> str | None:
    """Every position up to max_model_len needs a row of the RoPE cache the kernel reads."""
    if max_model_len > rope_rows:
        return REASONS["context"].format(max_model_len=max_model_len, rows=rope_rows)
    return None


def tensor_reason(name: str, t: Any, shape: tuple[int, ...] | tuple[tuple[int, ...], ...], device: Any,
                  dtype: Any = None) -> str | None:
    """One tensor the kernel reads: `dtype` (default bf16; float8_e4m3fn for an FP8 projection, float32 for its
    scale), on `device`, of `shape` (or one of several shapes), contiguous, 16-byte aligned."""
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    if t is None:
        return REASONS["tensor_missing"].format(name=name)
    if t.dtype != dtype:
        key = {torch.float8_e4m3fn: "tensor_dtype_fp8", torch.float32: "tensor_dtype_scale"}.get(dtype, "tensor_dtype")
        return REASONS[key].format(name=name, dtype=t.dtype)
    if t.device != device:
        return REASONS["tensor_device"].format(name=name, device=t.device, expected=device)
    shapes = shape if shape and isinstance(shape[0], tuple) else (shape,)
    if tuple(t.shape) not in shapes:
        expected = " or ".join(str(e) for e in shapes)
        return REASONS["tensor_shape"].format(name=name, shape=tuple(t.shape), expected=expected)
    if not t.is_contiguous():
        return REASONS["tensor_contiguous"].format(name=name)
    if t.data_ptr() % 16:
        return REASONS["tensor_alignment"].format(name=name)
    return None


def device_reason(device: Any, sm_count: int | None) -> str | None:
    """A CUDA device of compute capability 9.0 (not asked when the caller gives sm_count) and a current extension."""
    from kog_backend import ops as kog_ops
    from kog_backend.monokernel import layout

    if device.type != "cuda":
        return REASONS["not_cuda"].format(device=device)
    if sm_count is None:
        import torch

        if not torch.cuda.is_available():
            return environment.REASONS["no_gpu"]
        cap = torch.cuda.get_device_capability(device)
        if tuple(cap) != REQUIRED_CAPABILITY:
            return REASONS["capability"].format(capability=f"{cap[0]}.{cap[1]}")
    reason = kog_ops.load_reason() or extension.step_op_reason(kog_ops.has_op("monokernel_step"))
    if reason is not None:
        return reason
    return layout.extension_mismatch(kog_ops.ops())


def shape_reason(s: Any, tp_world: int) -> str | None:
    """The DecoderShape against the kernel's instantiations; tp_world: ranks whose shared buffer the caller
    provides (1: no group)."""
    if s.arch not in ("llama", "qwen3", "qwen2"):
        return REASONS["architecture"].format(arch=s.arch)
    if s.qkv_bias != (s.arch == "qwen2"):
        return REASONS["qkv_bias_arch"].format(bias=s.qkv_bias, arch=s.arch)
    if s.tp_size != tp_world:
        if tp_world == 1:
            return REASONS["tp_needs_buffer"].format(tp=s.tp_size)
        return REASONS["tp_sharding"].format(shards=s.tp_size, world=tp_world)
    reason = tp_reason(s, tp_world) or model.head_dim_reason(s.head_dim)
    if reason is not None:
        return reason
    if s.qk_norm != (s.arch == "qwen3"):
        return REASONS["qk_norm_arch"].format(qk_norm=s.qk_norm, arch=s.arch)
    return None


def layer_count_reason(layers: int, caches: int, num_layers: int) -> str | None:
    if layers != num_layers or caches != num_layers:
        return REASONS["layer_count"].format(layers=layers, caches=caches, num_layers=num_layers)
    return None


def fp8_scale_shapes(layout: str, n: int, k: int) -> tuple[tuple[int, ...], ...]:
    """Shapes of the fp32 scale of an FP8 projection of n rows and k columns the kernel reads in `layout`
    (ModelArgs::fp8_scaling), as vLLM holds them: one value ([] or [1]); one per row ([n, 1]); one per 128 x 128
    block ([ceil(n/128), ceil(k/128)], row-major)."""
    return quant_format.Fp8Format("fp8", layout).scale_shapes(n, k)


def weights_reason(weights: Any, device: Any) -> str | None:
    """Every weight tensor as the kernel reads it: bf16 (the four projections of an FP8 model: float8_e4m3fn, with
    their float32 scales), on the device, the shape's size, contiguous, aligned."""
    import torch

    from kog_backend.monokernel.layout import FP8_SCALING
    from kog_backend.monokernel.plan import lm_rows

    s = weights.shape
    fp8 = getattr(weights, "fp8", None)
    moe = getattr(weights, "moe", None)  # moe_step.MoeDecoderWeights: a Qwen3-MoE model (the MoE kernel)
    if fp8 not in FP8_SCALING:
        return REASONS["fp8_unknown_layout"].format(fp8=fp8)
    H, D, I = s.hidden_size, s.head_dim, s.intermediate_size
    nq = (s.num_heads + 2 * s.num_kv_heads) * D
    n_lm = lm_rows(s)
    checks = [
        ("embed", weights.embed, (weights.embed.shape[0], H)),
        ("final_norm", weights.final_norm, (H,)),
        ("lm_head", weights.lm_head, (weights.lm_head.shape[0], H)),
        ("cos_sin", weights.cos_sin, (weights.cos_sin.shape[0], D)),
    ]
    if weights.lm_head.shape[0] < n_lm:
        return REASONS["lm_head_rows"].format(rows=weights.lm_head.shape[0], entries=n_lm)
    wdtype = torch.float8_e4m3fn if fp8 is not None else None
    for i, lw in enumerate(weights.layers):
        checks += [(f"layer {i} input_norm", lw.input_norm, (H,)), (f"layer {i} post_norm", lw.post_norm, (H,))]
        projections = (("qkv", "qkv_scale", nq, H), ("o_proj", "o_scale", H, s.num_heads * D),
                       ("gate_up", "gate_up_scale", 2 * I, H), ("down", "down_scale", H, I))  # fmt: skip
        if moe is not None:  # the experts in vLLM's fused layout, and the router
            projections = projections[:2]
            E, Im = moe.num_experts, moe.intermediate_size
            checks += [(f"layer {i} router", lw.router, (E, H)), (f"layer {i} w13", lw.w13, (E, 2 * Im, H)),
                       (f"layer {i} w2", lw.w2, (E, H, Im))]  # fmt: skip
        for name, scale, n, k in projections:
            checks.append((f"layer {i} {name}", getattr(lw, name), (n, k), wdtype))
            if fp8 is not None:
                checks.append((f"layer {i} {scale}", getattr(lw, scale), fp8_scale_shapes(fp8, n, k), torch.float32))
            elif getattr(lw, scale, None) is not None:
                return REASONS["fp8_scale_undeclared"].format(name=f"layer {i} {scale}")
        if s.qk_norm:
            checks += [(f"layer {i} q_norm", lw.q_norm, (D,)), (f"layer {i} k_norm", lw.k_norm, (D,))]
        if s.qkv_bias:
            checks += [(f"layer {i} qkv_bias", lw.qkv_bias, (nq,))]
        elif lw.qkv_bias is not None:
            return REASONS["qkv_bias_undeclared"].format(layer=i)
    for name, t, shp, *dtype in checks:
        reason = tensor_reason(name, t, shp, device, *dtype)
        if reason is not None:
            return reason
    return None


def plan_or_reason(weights: Any, sm_count: int, tp_world: int = 1, fp8_full_slots: bool = False) -> Any:
    """The launch plan of `weights` on `sm_count` SMs, or why there is none: moe_plan_or_reason's MoePlan for a
    Qwen3-MoE model (moe_step.MoeDecoderWeights), else make_plan's Plan (bf16 or FP8 projections; fp8_full_slots:
    make_plan's)."""
    moe = getattr(weights, "moe", None)
    if moe is not None:
        return moe_plan_or_reason(weights.shape, moe, sm_count, tp_world)
    from kog_backend.monokernel.plan import make_plan

    return make_plan(weights.shape, sm_count, weights.projection_bytes, fp8_full_slots)


def moe_plan_or_reason(s: Any, moe: Any, sm_count: int, tp_world: int) -> Any:
    """The MoE kernel's plan (moe_plan.MoePlan) for shape s with experts moe (moe_step.MoeShape), or why there is
    none: it runs on one GPU, with bf16 weights, for the shapes moe_plan has an instantiation for."""
    from kog_backend.monokernel.moe_plan import make_moe_plan

    world = max(s.tp_size, tp_world)
    if world > 1:
        return REASONS["moe_tp"].format(tp=world)
    return make_moe_plan(s, moe, sm_count)


def unsupported_reason(weights: Any, kv_caches: list[Any], device: Any, sm_count: int | None = None,
                       tp_world: int = 1) -> str | None:
    """None when the monokernel can run this model on `device`, else why not (the stock path serves it).
    sm_count: the grid (default: every SM of the device, whose capability is then checked too)."""
    import torch

    device = torch.device(device)
    s = weights.shape
    reason = device_reason(device, sm_count) or shape_reason(s, tp_world)
    if reason is not None:
        return reason
    reason = layer_count_reason(len(weights.layers), len(kv_caches), s.num_layers)
    if reason is not None:
        return reason
    fp8 = getattr(weights, "fp8", None)
    if fp8 is not None:
        # the FP8 kernel instantiations are TP = 1 only
        reason = model.fp8_tp_reason(quant_format.layout_name(fp8), max(s.tp_size, tp_world))
        if reason is not None:
            return reason
    if sm_count is None:
        sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    plan = plan_or_reason(weights, sm_count, tp_world)
    if isinstance(plan, str):
        return plan
    reason = weights_reason(weights, device)
    if reason is not None:
        return reason
    for i, kv in enumerate(kv_caches):
        reason = kv_cache.monokernel_reason(i, kv, s.num_kv_heads, s.head_dim, device, kv_caches[0] if i else None)
        if reason is not None:
            return reason
    return None
