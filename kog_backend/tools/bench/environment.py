"""What a result was measured on: date, commit, package versions (no torch import), GPU (in a child)."""

from __future__ import annotations

import datetime
import os
import subprocess
from importlib import metadata
from typing import Any

import kog_backend


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def commit(explicit: str | None = None) -> str:
    """--commit, else $KOG_COMMIT, else `git rev-parse HEAD` of this checkout, else "unknown"
    (a copied working tree without .git, as on the device machine, needs one of the first two)."""
    if explicit:
        return explicit
    if os.environ.get("KOG_COMMIT"):
        return os.environ["KOG_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(kog_backend.__file__)))  # above the package
    try:
        out = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def driver_version() -> str | None:
    """NVIDIA driver release (e.g. 580.159.03) through NVML: nvidia-ml-py, else vLLM's bundled copy."""
    nvml = None
    try:
        import pynvml as nvml  # type: ignore[no-redef]
    except ImportError:
        try:
            from vllm.third_party import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
        try:
            v = nvml.nvmlSystemGetDriverVersion()
        finally:
            nvml.nvmlShutdown()
    except Exception:  # NVML missing or no driver: report unknown
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def gpu_host_info() -> dict[str, Any]:
    """GPU name, count, capability, driver and versions. Imports torch: call in a child process."""
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "vllm": package_version("vllm"),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    if info["gpu_count"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = "sm_%d%d" % torch.cuda.get_device_capability(0)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    info["driver"] = driver_version()
    return info
