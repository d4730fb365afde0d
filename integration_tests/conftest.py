"""GPU + vLLM integration tests. They run on the H200 device (see README: "GPU tests") and skip elsewhere.

Checkpoints are random-weight models with real shapes, written once per test run under $KOG_TEST_CKPT_DIR
(default /tmp/kog-test-ckpt) by kog_backend.tools.fixtures.checkpoints.
"""

from __future__ import annotations

import os

import pytest


def _gpu_reason() -> str | None:
    try:
        from kog_backend.path.gate import gpu_reason
    except ImportError as e:
        return str(e)
    return gpu_reason()


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def checkpoint():
    """checkpoint(shape, fp8=None) -> directory of a random-weight checkpoint (written on first use); fp8: its FP8
    checkpoint of that layout (`kog make-checkpoint --fp8`), quantised from the same bf16 weights."""
    root = os.environ.get("KOG_TEST_CKPT_DIR", "/tmp/kog-test-ckpt")
    made: dict[str, str] = {}

    def get(shape: str, fp8: str | None = None) -> str:
        name = f"{shape}-fp8-{fp8}" if fp8 else shape
        if name not in made:
            from kog_backend.tools.fixtures.checkpoints import write_checkpoint

            out = os.path.join(root, name)
            write_checkpoint(shape, out, seed=0, fp8=fp8)
            made[name] = out
        return made[name]

    return get
