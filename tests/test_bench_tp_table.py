"""The pure-Python parts of benchmarks/bench_tp_monokernel.py (the GPU part runs on the device)."""

from __future__ import annotations

import benchmark_scripts


def _module():
    return benchmark_scripts.load("bench_tp_monokernel")


def test_table_reports_the_cost_of_one_all_reduce():
    mod = _module()
    row = {"shape": "llama-3.2-1b", "world": 2, "ranks_per_gpu": 2, "exchange": 700.0, "no exchange": 634.0,
           "layers": 16, "weight_bytes": 1.25e9, "kv_bytes": 0}  # fmt: skip
    lines = mod.table([row, {"error": "shared buffer: no"}]).splitlines()
    assert lines[0].split()[:4] == ["shape", "W", "ranks/GPU", "us/token"]
    cols = lines[1].split()
    assert cols[:5] == ["llama-3.2-1b", "2", "2", "700.0", "634.0"]
    assert cols[5] == "2.00"  # (700 - 634) / (2 x 16 + 1)
    assert cols[6] == str(round(1.25e9 / 700e-6 / 1e9))
    assert lines[2] == "error: shared buffer: no"
