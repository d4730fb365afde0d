"""The kernel experiments waiting for a device (benchmarks/experiments/) still apply to this tree, in the order
builds.txt (the builds of the README's device calls) applies them, and the patched kernel compiles for sm_90a with
each build's flags. A change on main that breaks one fails here, not at the start of a device session. Needs git
and nvcc; no GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "benchmarks" / "experiments"
NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"


def _builds() -> dict[str, tuple[list[str], list[str]]]:
    """builds.txt (what build_all.sh builds for the device calls): name -> (patches in order, nvcc flags)."""
    out = {}
    for line in (EXPERIMENTS / "builds.txt").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, patches, flags = (f.strip() for f in line.split("|"))
            out[name] = (patches.split(), flags.split())
    return out


BUILDS = _builds()
# The kernel instantiations each build compiles (monokernel_kernel<D, HP, kSampled, kTP>): Qwen3's greedy TP = 1
# kernel, and for some builds the sampled or TP kernels their code reaches too.
MORE_KERNELS = {
    "asm": ["64, 4, false, true", "64, 4, true, false"],
    "mid": ["64, 4, false, false"],  # Qwen3's kernel is the same SASS as main's; the change is head dim 64's
}
CASES = {
    f"{name}<{kernel.replace(', ', ',')}>": (patches, kernel, flags)
    for name, (patches, flags) in BUILDS.items()
    for kernel in ["128, 2, false, false", *MORE_KERNELS.get(name, [])]
}


def _patched_tree(tmp_path: Path, patches: list[str]) -> Path:
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "results", ".venv", "build")
    for d in ("csrc", "kog_backend", "tests", "integration_tests", "benchmarks", "docs"):
        shutil.copytree(ROOT / d, tree / d, ignore=ignore)
    for p in patches:
        out = subprocess.run(["git", "apply", str(EXPERIMENTS / p)], cwd=tree, capture_output=True, text=True)
        assert out.returncode == 0, f"{p} no longer applies (regenerate it from its branch): {out.stderr[-2000:]}"
    return tree


def test_every_patch_is_built():
    on_disk = {p.name for p in EXPERIMENTS.glob("*.patch")}
    used = {p for patches, _ in BUILDS.values() for p in patches}
    assert on_disk == used, f"patches no build uses: {on_disk - used}; builds without their patch: {used - on_disk}"
    assert set(MORE_KERNELS) <= set(BUILDS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_experiment_applies_and_compiles(tmp_path, name):
    if shutil.which("git") is None:
        pytest.skip("no git")
    patches, instantiation, flags = CASES[name]
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
