"""The extension kog_backend._C: built, loadable, of this package's ops version, and compiled from the same
argument-table layout and kernel constants as this package's Python mirror (kog_backend.monokernel.layout).

ops.load_reason and layout.extension_mismatch find the facts and ask these functions; the runner records a
reason as `monokernel: <reason>` and kog is off for the server (an extension from other sources would read the
argument table at other offsets, so the monokernel must not run).
"""

from __future__ import annotations

from typing import Any

REASONS = {
    # {name}: _C, or _C_test (the test-only extension, csrc/testing/; GPU tests and inject_fault="hold_sms")
    "not_built": "kog_backend.{name} is not built (python setup.py build_ext --inplace)",
    "load_failed": "kog_backend.{name} at {path} failed to load: {error}",
    "no_version_op": "kog_backend.{name} has no usable version op: {error}",
    "version": "kog_backend.{name} is version {version}, this package expects {expected} (rebuild the extension)",
    "no_step_op": "kog_backend._C has no monokernel_step op (stale build)",
    "no_layout_op": "kog_backend._C has no monokernel_layout / monokernel_config op (stale build): rebuild it",
    "layout": "kog_backend._C was built from other sources (its argument-table layout differs from this "
              "package's): rebuild it (./scripts/setup.sh, or pip install -e .)",
    "constants": "kog_backend._C was built with other kernel constants ({what}): rebuild it",
}


def not_built_reason(path: str | None, name: str = "_C") -> str | None:
    """path: the extension file found next to the package, or None."""
    return REASONS["not_built"].format(name=name) if path is None else None


def load_failed_reason(path: str, error: Any, name: str = "_C") -> str:
    return REASONS["load_failed"].format(name=name, path=path, error=error)


def version_op_reason(error: Any, name: str = "_C") -> str:
    return REASONS["no_version_op"].format(name=name, error=error)


def version_reason(version: int, expected: int, name: str = "_C") -> str | None:
    if version != expected:
        return REASONS["version"].format(name=name, version=version, expected=expected)
    return None


def step_op_reason(has_step_op: bool) -> str | None:
    return None if has_step_op else REASONS["no_step_op"]


def mismatch_reason(has_layout_ops: bool, same_layout: bool, differing: list[str], constants: int,
                    expected_constants: int) -> str | None:
    """The loaded extension against this package's tables: its layout op's answer, and the names of the kernel
    constants whose values differ (build-flag constants excluded) out of `constants` it reported."""
    if not has_layout_ops:
        return REASONS["no_layout_op"]
    if not same_layout:
        return REASONS["layout"]
    if constants != expected_constants or differing:
        what = ", ".join(differing[:4]) if differing else f"{constants} constants, {expected_constants} expected"
        return REASONS["constants"].format(what=what)
    return None
