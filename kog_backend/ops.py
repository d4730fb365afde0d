"""kog_backend._C (the abi3 extension) as torch.ops.kog, loaded once with torch.ops.load_library.

`load_reason()` is None when the extension is loaded and its version matches this package, else the gate's reason
(kog_backend.path.gate.extension: not built, fails to load, stale build); `ops()` returns torch.ops.kog or raises
RuntimeError with that reason.

The test-only extension kog_backend._C_test (csrc/testing/: launchers of device building blocks and of fault
injection) is torch.ops.kog_test, through `kog_test_load_reason()` and `kog_test_ops()` alike. Only the GPU tests
and the inject_fault="hold_sms" option load it; the serving path never does.
"""

from __future__ import annotations

import glob
import os
import threading

# Must equal KOG_OPS_VERSION in csrc/version.h, the version op of both extensions (bumped whenever an op's schema
# changes).
EXPECTED_VERSION = 9

_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


def _find(stem: str, folder: str | None = None) -> str | None:
    # `_C.abi3.so` (or `_C.cpython-3xx-....so`): "<stem>.*so", so that `_C_test.abi3.so` never stands in for `_C`.
    folder = folder or os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(folder, f"{stem}.*so")))
    return found[0] if found else None


def extension_path() -> str | None:
    return _find("_C")


def kog_test_extension_path() -> str | None:
    return _find("_C_test")


def _load_library(name: str, namespace, path: str | None) -> str | None:
    """Loads `path` unless `namespace` (torch.ops.<ns>) already has its version op; then checks that version. The
    reasons are the gate's (kog_backend.path.gate.extension)."""
    import torch

    from kog_backend.path.gate import extension

    if not hasattr(namespace, "version"):
        if path is None:
            return extension.not_built_reason(path, name)
        try:
            torch.ops.load_library(path)  # loading the same file twice is a no-op
        except (OSError, RuntimeError) as e:
            return extension.load_failed_reason(path, e, name)
    try:
        version = int(namespace.version())
    except (AttributeError, RuntimeError) as e:
        return extension.version_op_reason(e, name)
    return extension.version_reason(version, EXPECTED_VERSION, name)


def _load() -> str | None:
    import torch

    return _load_library("_C", torch.ops.kog, extension_path())


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


def classes():
    """torch.classes.kog: the monokernel op's argument classes (MonokernelLaunch, SampledLaunch, RunAheadLaunch,
    csrc/monokernel_launch.h); raises RuntimeError with load_reason() as ops() does."""
    ops()
    import torch

    return torch.classes.kog


def has_op(name: str) -> bool:
    return load_reason() is None and hasattr(ops(), name)


def kog_test_load_reason() -> str | None:
    """None when kog_backend._C_test is loaded at this package's version, else why not (tests skip with it)."""
    with _LOCK:
        if "test_reason" not in _STATE:
            import torch

            _STATE["test_reason"] = _load_library("_C_test", torch.ops.kog_test, kog_test_extension_path())
        return _STATE["test_reason"]  # type: ignore[return-value]


def kog_test_ops():
    """torch.ops.kog_test (the test-only launchers); raises RuntimeError with kog_test_load_reason() otherwise."""
    reason = kog_test_load_reason()
    if reason is not None:
        raise RuntimeError(reason)
    import torch

    return torch.ops.kog_test
