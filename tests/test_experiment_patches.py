"""The kernel experiments waiting for a device (benchmarks/experiments/) still apply to this tree, in the order
their README builds them, and the patched kernel compiles for sm_90a with each experiment's flags. A change on main
that breaks one fails here, not at the start of a device session. Needs git and nvcc; no GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "benchmarks" / "experiments"
NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"

# name: (patches in order, kernel instantiation to compile, nvcc flags) -- the builds of the README.
BUILDS = {
    "pt": (["pass-template.patch"], "128, 2, false, false", []),
    "pt-o": (["pass-template.patch", "tagged-stages.patch"], "128, 2, false, false", ["-DKOG_EXP_TAGGED_O"]),
    "pt-ogud": (["pass-template.patch", "tagged-stages.patch"], "128, 2, false, false",
                ["-DKOG_EXP_TAGGED_O", "-DKOG_EXP_TAGGED_GU", "-DKOG_EXP_TAGGED_DOWN"]),
    "pt-ogud-tp-sampled": (["pass-template.patch", "tagged-stages.patch"], "64, 4, true, true",
                           ["-DKOG_EXP_TAGGED_O", "-DKOG_EXP_TAGGED_GU", "-DKOG_EXP_TAGGED_DOWN"]),
    "fm": (["pass-template.patch", "fused-mlp.patch"], "128, 2, false, false", ["-DKOG_EXP_FUSED_MLP"]),
    "fm-tp-sampled": (["pass-template.patch", "fused-mlp.patch"], "64, 4, true, true", ["-DKOG_EXP_FUSED_MLP"]),
    "fmo": (["pass-template.patch", "fused-mlp.patch"], "64, 4, true, false",
            ["-DKOG_EXP_FUSED_MLP", "-DKOG_EXP_FUSED_O"]),
    "fmo-tp": (["pass-template.patch", "fused-mlp.patch"], "128, 2, false, true",
               ["-DKOG_EXP_FUSED_MLP", "-DKOG_EXP_FUSED_O"]),
    "fmoc": (["pass-template.patch", "fused-mlp.patch"], "128, 2, false, false",
             ["-DKOG_EXP_FUSED_MLP", "-DKOG_EXP_FUSED_O", "-DKOG_EXP_FUSED_COMBINE"]),
    "p1024": (["icache-probe.patch"], "128, false, false", ["-DKOG_BENCH_ICACHE_PROBE=1024"]),
    "mma": (["mma-gemv.patch"], "128, false, false", []),
    "mma-tp-sampled": (["mma-gemv.patch"], "64, true, true", []),
    "stream": (["stream-tokens.patch"], "128, false, false", []),
    "stream-tp": (["stream-tokens.patch"], "64, false, true", []),
}  # fmt: skip


def _patched_tree(tmp_path: Path, patches: list[str]) -> Path:
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "results", ".venv", "build")
    for d in ("csrc", "kog_backend", "tests", "integration_tests", "benchmarks", "docs"):
        shutil.copytree(ROOT / d, tree / d, ignore=ignore)
    for p in patches:
        out = subprocess.run(["git", "apply", str(EXPERIMENTS / p)], cwd=tree, capture_output=True, text=True)
        assert out.returncode == 0, f"{p} no longer applies (regenerate it from its branch): {out.stderr[-2000:]}"
    return tree


def test_every_patch_is_built_by_some_case():
    on_disk = {p.name for p in EXPERIMENTS.glob("*.patch")}
    used = {p for patches, _, _ in BUILDS.values() for p in patches}
    assert on_disk == used, f"patches without a build case: {on_disk - used}; cases without a patch: {used - on_disk}"


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_experiment_applies_and_compiles(tmp_path, name):
    if shutil.which("git") is None:
        pytest.skip("no git")
    patches, instantiation, flags = BUILDS[name]
    tree = _patched_tree(tmp_path, patches)
    if not NVCC.exists():
        pytest.skip(f"no nvcc at {NVCC}")
    src = tmp_path / "one.cu"
    src.write_text('#include "kog/monokernel.cuh"\n'
                   f"template __global__ void kog::monokernel_kernel<{instantiation}>(const __grid_constant__ "
                   "kog::StepArgs);\n")  # fmt: skip
    out = subprocess.run(
        [str(NVCC), "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
         *flags, f"-I{tree / 'csrc' / 'include'}", "-cubin", "-o", str(tmp_path / "one.cubin"), str(src)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
