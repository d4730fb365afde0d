"""Checks of the environment a kog worker starts in. Each returns None or a reason; a reason turns kog off for
the whole server (logged once as an error-free warning, counted as `disabled_reason`), and vLLM serves stock."""

from __future__ import annotations

from kog_backend import SUPPORTED_VLLM

REQUIRED_CAPABILITY = (9, 0)  # sm_90 (H100/H200): the monokernel is built for sm_90a only


def vllm_version_reason(version: str | None = None) -> str | None:
    if version is None:
        import vllm

        version = vllm.__version__
    parts = version.split(".")
    if ".".join(parts[:2]) != SUPPORTED_VLLM:
        return f"vLLM {version} is not supported (kog_backend is built on vLLM {SUPPORTED_VLLM}.x internals)"
    return None


def gpu_reason(capability: tuple[int, int] | None = None, name: str | None = None) -> str | None:
    if capability is None:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU"
        capability = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
    if tuple(capability) != REQUIRED_CAPABILITY:
        return (
            f"GPU {name or ''} has compute capability {capability[0]}.{capability[1]}; "
            f"kog needs {REQUIRED_CAPABILITY[0]}.{REQUIRED_CAPABILITY[1]} (Hopper: H100/H200)"
        ).replace("GPU  has", "GPU has")
    return None


def environment_reason() -> str | None:
    return vllm_version_reason() or gpu_reason()
