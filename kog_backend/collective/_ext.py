"""Loads kog_backend._C (the abi3 extension) and returns torch.ops.kog, checking the collective's ops exist."""

from __future__ import annotations

import glob
import os
import threading

_LOCK = threading.Lock()
_OPS = None

REQUIRED_OPS = ("allreduce", "allreduce_init", "allreduce_dispose", "allreduce_layout", "allreduce_constants",
                "ipc_alloc", "ipc_free", "ipc_get_handle", "ipc_open", "ipc_close", "ipc_copy")


def extension_path() -> str | None:
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = sorted(glob.glob(os.path.join(pkg, "_C.*so")))  # not the test-only _C_test
    return found[0] if found else None


def load_ops():
    """torch.ops.kog with the collective's ops; raises ImportError with the reason when unavailable."""
    global _OPS
    with _LOCK:
        if _OPS is not None:
            return _OPS
        import torch

        if not hasattr(torch.ops.kog, "allreduce"):
            path = extension_path()
            if path is None:
                raise ImportError("kog_backend._C is not built (run `python setup.py build_ext --inplace`)")
            torch.ops.load_library(path)  # a second load of the same file is a no-op
        missing = [name for name in REQUIRED_OPS if not hasattr(torch.ops.kog, name)]
        if missing:
            raise ImportError(f"kog_backend._C lacks the collective's ops {missing}")
        _OPS = torch.ops.kog
        return _OPS
