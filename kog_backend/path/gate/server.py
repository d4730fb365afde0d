"""vLLM's config of the server: parallelism, LoRA, speculative decoding, dtypes; and the start gate, which says
from the config alone, before the engine starts, whether kog can run on this server at all.

A reason turns kog off for the whole server (counted as `disabled_reason`); the start gate's reason also puts
back stock scheduling (kog_backend.engine.scheduling).
"""

from __future__ import annotations

from typing import Any

from kog_backend.path.gate import environment, model, monokernel

# The features a server may be configured with that kog does not run (`kog doctor`, the operator guide).
SERVER_FEATURES = {
    "pipeline_parallel": "pipeline parallelism",
    "data_parallel": "data parallelism",
    "decode_context_parallel": "decode context parallelism",
    "lora": "LoRA enabled on the server",
    "speculative": "speculative decoding configured",
    "kv_cache_dtype": "KV-cache dtype differs from the model's",
    "model_dtype": "model dtype is not bf16",
    "encoder_decoder": "encoder-decoder model",
    "multimodal": "multimodal model",
    "pooling": "pooling model",
}
REASONS = {
    **SERVER_FEATURES,
    "kv_cache_dtype": SERVER_FEATURES["kv_cache_dtype"] + " ({dtype})",
    "model_dtype": SERVER_FEATURES["model_dtype"] + " ({dtype})",
    "no_model_config": "no model config",
}


def model_dtype_reason(dtype: Any) -> str | None:
    import torch

    if dtype != torch.bfloat16:
        return REASONS["model_dtype"].format(dtype=dtype)
    return None


def server_unsupported_reason(vllm_config: Any) -> str | None:
    pc = vllm_config.parallel_config
    mc = vllm_config.model_config
    if pc.pipeline_parallel_size != 1:
        return SERVER_FEATURES["pipeline_parallel"]
    if pc.data_parallel_size != 1:
        return SERVER_FEATURES["data_parallel"]
    if getattr(pc, "decode_context_parallel_size", 1) != 1 or getattr(pc, "prefill_context_parallel_size", 1) != 1:
        return SERVER_FEATURES["decode_context_parallel"]
    if vllm_config.lora_config is not None:
        return SERVER_FEATURES["lora"]
    if vllm_config.speculative_config is not None:
        return SERVER_FEATURES["speculative"]
    if mc is None:
        return REASONS["no_model_config"]
    if getattr(mc, "is_encoder_decoder", False):
        return SERVER_FEATURES["encoder_decoder"]
    if getattr(mc, "is_multimodal_model", False):
        return SERVER_FEATURES["multimodal"]
    if getattr(mc, "runner_type", "generate") != "generate":
        return SERVER_FEATURES["pooling"]
    reason = model_dtype_reason(mc.dtype)
    if reason is not None:
        return reason
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype not in ("auto", "bfloat16"):
        return REASONS["kv_cache_dtype"].format(dtype=cache_dtype)
    return None


def start_reason(vllm_config: Any, kog_config: Any) -> str | None:
    """Why kog will turn itself off for this server whatever its requests are, as far as the config tells before
    the engine starts, or None: kog switched off, the server's features, vLLM's version, the GPU vLLM's platform
    reports, the model's architecture, sliding window and quantisation, the extension, tensor parallelism without
    its option. The worker checks the same and more (KogWorker, KogModelRunner)."""
    if not kog_config.enabled:
        return environment.REASONS["disabled"]
    reason = server_unsupported_reason(vllm_config) or environment.vllm_version_reason()
    if reason is not None:
        return reason
    try:
        from vllm.platforms import current_platform

        cap = current_platform.get_device_capability()
        if cap is not None:
            reason = environment.gpu_reason((cap.major, cap.minor), current_platform.get_device_name())
    except Exception:  # noqa: BLE001 (no device to ask here: the worker decides)
        reason = None
    if reason is not None:
        return reason
    mc = vllm_config.model_config
    hf = mc.hf_config
    reason = (
        model.architecture_reason(list(getattr(hf, "architectures", None) or []), model.config_num_experts(hf),
                                  kog_config.moe_kernel)
        or (model.moe_layers_reason(hf) if model.config_num_experts(hf) else None)
        or model.sliding_window_reason(getattr(hf, "sliding_window", None), getattr(hf, "use_sliding_window", None))
        or model.quantization_reason(getattr(hf, "quantization_config", None), mc.quantization,
                                     vllm_config.parallel_config.tensor_parallel_size)
    )
    if reason is not None or kog_config.step_impl == "torch":
        return reason
    from kog_backend import ops

    reason = ops.load_reason() or monokernel.tp_option_reason(
        vllm_config.parallel_config.tensor_parallel_size, kog_config.tp_monokernel
    )
    return monokernel.refused(reason) if reason is not None else None
