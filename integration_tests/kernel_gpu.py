"""Module-level guard of the kernel-level GPU tests (the extension's ops called directly, no vLLM engine)."""

from __future__ import annotations

import pytest


def require_sm90_extension() -> None:
    """Skips the calling test module unless an sm_90 GPU is present and kog_backend._C loads."""
    import torch

    from kog_backend import ops

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU", allow_module_level=True)
    if ops.load_reason() is not None:
        pytest.skip(f"extension: {ops.load_reason()}", allow_module_level=True)


def require_test_extension() -> None:
    """Skips the calling test module unless the test-only extension kog_backend._C_test (torch.ops.kog_test) loads."""
    from kog_backend import ops

    reason = ops.kog_test_load_reason()
    if reason is not None:
        pytest.skip(f"test extension: {reason}", allow_module_level=True)
