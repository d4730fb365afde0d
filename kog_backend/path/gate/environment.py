"""The environment a kog worker starts in: kog switched on, vLLM's version, the GPU, vLLM's V2 model runner.

A reason here turns kog off for the whole server before a model loads (the worker logs it once and reports it
as `disabled_reason`); vLLM then serves every step stock.
"""

from __future__ import annotations

from kog_backend import SUPPORTED_VLLM

REQUIRED_CAPABILITY = (9, 0)  # sm_90 (H100/H200): the monokernel is built for sm_90a only

REASONS = {
    "disabled": "disabled by configuration (--backend stock / kog.enabled=false)",
    "v1_runner": "vLLM chose its V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0, a logits-processor plugin, or a "
                 "feature V2 lacks)",
    "vllm_version": "vLLM {version} is not supported (kog_backend is built on vLLM {supported}.x internals)",
    "no_gpu": "no CUDA GPU",
    "gpu_capability": "GPU{name} has compute capability {capability}; kog needs {required} (Hopper: H100/H200)",
}


def vllm_version_reason(version: str | None = None) -> str | None:
    if version is None:
        import vllm

        version = vllm.__version__
    if ".".join(version.split(".")[:2]) != SUPPORTED_VLLM:
        return REASONS["vllm_version"].format(version=version, supported=SUPPORTED_VLLM)
    return None


def gpu_reason(capability: tuple[int, int] | None = None, name: str | None = None) -> str | None:
    """Why this GPU (default: the current one) cannot run kog, or None."""
    if capability is None:
        import torch

        if not torch.cuda.is_available():
            return REASONS["no_gpu"]
        capability = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
    if tuple(capability) != REQUIRED_CAPABILITY:
        return REASONS["gpu_capability"].format(
            name=f" {name}" if name else "", capability=f"{capability[0]}.{capability[1]}",
            required=f"{REQUIRED_CAPABILITY[0]}.{REQUIRED_CAPABILITY[1]}",
        )  # fmt: skip
    return None


def environment_reason() -> str | None:
    return vllm_version_reason() or gpu_reason()


def worker_reason(enabled: bool, uses_v2_runner: bool) -> str | None:
    """Why a KogWorker stays exactly vLLM's worker: kog switched off, vLLM's V1 runner, or the environment."""
    if not enabled:
        return REASONS["disabled"]
    if not uses_v2_runner:
        return REASONS["v1_runner"]
    return environment_reason()
