"""The pure-Python parts of benchmarks/bench_monokernel.py (the kernel timings run on the device): --fp8 and the
table's weights column."""

from __future__ import annotations

import pytest

import benchmark_scripts


def _module():
    return benchmark_scripts.load("bench_monokernel")


def test_fp8_flag():
    mod = _module()
    ap = mod.build_parser()
    assert ap.parse_args([]).fp8 is None
    for layout in ("tensor", "channel", "block"):
        assert ap.parse_args(["--fp8", layout]).fp8 == layout
    with pytest.raises(SystemExit):
        ap.parse_args(["--fp8", "int8"])
    assert (mod.weights_label(None), mod.weights_label("block")) == ("bf16", "fp8-block")


def test_table_names_the_weights():
    mod = _module()
    row = dict(shape="llama-3.1-8b", weights="fp8-block", variant="full", ctx=32, us=2000.0, gbs=4016.0, share=0.85,
               weight_gb=8.03, floor_us=1700.0)
    lines = mod.format_rows([row, dict(row, weights="bf16")], 4725.0)
    assert lines[1].split() == ["shape", "weights", "variant", "ctx", "us/step", "floor", "us", "GB/s", "share"]
    assert lines[2].split() == ["llama-3.1-8b", "fp8-block", "full", "32", "2000.0", "1700.0", "4016", "85.0%"]
    assert lines[3].split()[1] == "bf16"
