"""The standalone GPU probes under benchmarks/probes/ compile for sm_90a against the kernel's own headers (they
use csrc/include/kog/sync.cuh, so a change there must not break them unnoticed). Needs nvcc; no GPU."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"


@pytest.mark.parametrize("probe", sorted(p.name for p in (ROOT / "benchmarks" / "probes").glob("*.cu")))
def test_probe_compiles(tmp_path, probe):
    if not NVCC.exists():
        pytest.skip(f"no nvcc at {NVCC}")
    out = subprocess.run(
        [str(NVCC), "-O3", "-std=c++17", "-arch=sm_90a", f"-I{ROOT / 'csrc' / 'include'}",
         str(ROOT / "benchmarks" / "probes" / probe), "-o", str(tmp_path / "probe")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
