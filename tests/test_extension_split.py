"""The production extension kog_backend._C and the test-only kog_backend._C_test: which ops each binds, one ops
version for both, the loader never taking one for the other, and the diagnostics switches in one header."""

from __future__ import annotations

import glob
import os
import re

import pytest

from kog_backend import ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")


def _defs(path: str) -> list[str]:
    """Op names of the m.def(...) schemas in a binding file."""
    return re.findall(r'm\.def\(\s*"(\w+)\(', open(path).read())


def test_production_extension_binds_no_test_op():
    prod = _defs(os.path.join(CSRC, "torch_bindings.cpp"))
    assert "monokernel_step" in prod and "allreduce" in prod
    assert [n for n in prod if n.endswith("_test")] == []
    # no test launcher among the production sources either
    assert glob.glob(os.path.join(CSRC, "*_test.cu")) == []


def test_test_extension_binds_every_test_launcher():
    test = _defs(os.path.join(CSRC, "testing", "test_bindings.cpp"))
    assert test[0] == "version"
    assert sorted(test[1:]) == sorted(
        ["hold_sms_test", "philox_test", "philox_uniform_test", "gumbel_noise_words_test", "gumbel_argmax_test",
         "moe_route_test"]
    )
    assert "TORCH_LIBRARY(kog_test," in open(os.path.join(CSRC, "testing", "test_bindings.cpp")).read()


def test_one_ops_version_for_both_extensions():
    version = int(re.search(r"#define KOG_OPS_VERSION (\d+)", open(os.path.join(CSRC, "version.h")).read()).group(1))
    assert version == ops.EXPECTED_VERSION
    assert "KOG_OPS_VERSION" in open(os.path.join(CSRC, "version.cpp")).read()
    assert "KOG_OPS_VERSION" in open(os.path.join(CSRC, "testing", "test_bindings.cpp")).read()


@pytest.mark.parametrize(
    "files, want_c, want_test",
    [
        (["_C.abi3.so", "_C_test.abi3.so"], "_C.abi3.so", "_C_test.abi3.so"),
        (["_C_test.abi3.so"], None, "_C_test.abi3.so"),
        (["_C.cpython-311-x86_64-linux-gnu.so"], "_C.cpython-311-x86_64-linux-gnu.so", None),
    ],
)
def test_loader_never_takes_one_extension_for_the_other(tmp_path, files, want_c, want_test):
    for f in files:
        (tmp_path / f).write_bytes(b"")
    got_c, got_test = ops._find("_C", str(tmp_path)), ops._find("_C_test", str(tmp_path))
    assert (got_c and os.path.basename(got_c)) == want_c
    assert (got_test and os.path.basename(got_test)) == want_test


def test_test_extension_absent_gives_a_reason(monkeypatch):
    monkeypatch.setattr(ops, "_STATE", {})
    monkeypatch.setattr(ops, "kog_test_extension_path", lambda: None)
    torch = pytest.importorskip("torch")
    if hasattr(torch.ops.kog_test, "version"):
        pytest.skip("kog_backend._C_test is already loaded in this process")
    assert ops.kog_test_load_reason() == "kog_backend._C_test is not built (python setup.py build_ext --inplace)"
    with pytest.raises(RuntimeError, match="_C_test is not built"):
        ops.kog_test_ops()


@pytest.mark.skipif(ops.load_reason() is not None, reason=f"extension not loadable: {ops.load_reason()}")
def test_loaded_production_extension_has_no_test_op():
    import torch

    assert not any(hasattr(torch.ops.kog, n) for n in ("philox_test", "gumbel_argmax_test", "hold_sms_test"))


def test_diagnostics_switches_only_in_their_header():
    """Every KOG_BENCH_* switch is read in csrc/include/kog/diagnostics.cuh; production code uses its diag:: names."""
    hits = []
    for path in glob.glob(os.path.join(CSRC, "**", "*.c*"), recursive=True) + glob.glob(
        os.path.join(CSRC, "**", "*.h"), recursive=True
    ):
        if os.path.basename(path) == "diagnostics.cuh":
            continue
        for i, line in enumerate(open(path), 1):
            if "KOG_BENCH_" in line:
                hits.append(f"{os.path.relpath(path, ROOT)}:{i}")
    assert hits == []
