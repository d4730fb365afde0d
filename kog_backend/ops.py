"""kog_backend._C (the abi3 extension) as torch.ops.kog, loaded once with torch.ops.load_library.

`load_reason()` is None when the extension is loaded and its version matches this package, else the gate's reason
(kog_backend.path.gate.extension: not built, fails to load, stale build); `ops()` returns torch.ops.kog or raises RuntimeError with that reason.
"""

from __future__ import annotations

import glob
import os
import threading

# Must equal kog::version() in csrc/version.cpp (bumped whenever an op's schema changes).
EXPECTED_VERSION = 6

_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


def extension_path() -> str | None:
    found = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_C*.so")))
    return found[0] if found else None


def _load() -> str | None:
    import torch

    from kog_backend.path.gate import extension

    if not hasattr(torch.ops.kog, "version"):
        path = extension_path()
        if path is None:
            return extension.not_built_reason(path)
        try:
            torch.ops.load_library(path)  # loading the same file twice is a no-op
        except (OSError, RuntimeError) as e:
            return extension.load_failed_reason(path, e)
    try:
        version = int(torch.ops.kog.version())
    except (AttributeError, RuntimeError) as e:
        return extension.version_op_reason(e)
    return extension.version_reason(version, EXPECTED_VERSION)


def load_reason() -> str | None:
    with _LOCK:
        if "reason" not in _STATE:
            _STATE["reason"] = _load()
        return _STATE["reason"]  # type: ignore[return-value]


def ops():
    reason = load_reason()
    if reason is not None:
        raise RuntimeError(reason)
    import torch

    return torch.ops.kog


def has_op(name: str) -> bool:
    return load_reason() is None and hasattr(ops(), name)
