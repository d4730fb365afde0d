"""CPU test suite. Tests marked `gpu` or `vllm_gpu` (pyproject.toml) run only on an sm_90 GPU and are skipped,
with the reason, everywhere else. torch is imported only when such a test was collected."""

from __future__ import annotations

import functools

import pytest

GPU_MARKERS = ("gpu", "vllm_gpu")


@functools.lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    """None on an sm_90 GPU, otherwise why GPU tests cannot run here."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed"
    from kog_backend.path.gate import gpu_reason

    return gpu_reason()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if any(item.get_closest_marker(m) for m in GPU_MARKERS)]
    if not gpu_items:
        return
    reason = gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)
