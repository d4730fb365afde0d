"""Builds kog_backend._C (csrc/*.cu, *.cpp) and the test-only kog_backend._C_test (csrc/testing/) with torch's
extension tooling.

The extensions use only TORCH_LIBRARY registrations (no Python C API), so they are built against the limited API
(`_C.abi3.so`, `_C_test.abi3.so`) and load on any CPython through `torch.ops.load_library`. `_C` is the product
(torch.ops.kog); `_C_test` holds the launchers that only tests call (torch.ops.kog_test, kog_backend.ops.test_ops()).

Environment:
  KOG_BUILD_EXT=0        install the Python package only (the .so files were built elsewhere and carried).
  KOG_BUILD_TEST_EXT=0   build kog_backend._C only, without the test-only kog_backend._C_test.
  KOG_CUDA_ARCH=90a      gencode target (sm_90a: the monokernel uses Hopper-only instructions).
  KOG_NVCC_THREADS=2     parallel nvcc threads.
  KOG_TRACE=1            compile the monokernel's timeline marks in (benchmarks/bench_monokernel.py --trace);
                         off by default: they cost ~4% at batch 1 even when unused (csrc/include/kog/trace.cuh).
  KOG_NVCC_FLAGS="..."   extra nvcc flags for diagnostic builds (csrc/include/kog/diagnostics.cuh lists them all), e.g.
                         "-DKOG_BENCH_NO_MATH", "-DKOG_BENCH_NO_COPY", "-DKOG_BENCH_NO_ATTN" or
                         "-DKOG_BENCH_RELAXED_MASK=31" (docs/tuning.md, "Bounds": what each one removes from the step);
                         "-DKOG_BENCH_SALT=n" (the code shifted by 16 n bytes) and "-DKOG_BENCH_SALT_MID=n" (a never-run
                         branch: ptxas schedules anew) change nothing the step runs, for measuring how much code
                         generation alone moves it.
"""

import glob
import os

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _ext_modules():
    if os.environ.get("KOG_BUILD_EXT", "1") == "0":
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    arch = os.environ.get("KOG_CUDA_ARCH", "90a")
    nvcc = [
        "-O3",
        "-std=c++17",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        f"--threads={os.environ.get('KOG_NVCC_THREADS', '2')}",
        "-Xptxas=-v" if os.environ.get("KOG_PTXAS_VERBOSE") else "",
        "-DKOG_TRACE" if os.environ.get("KOG_TRACE") == "1" else "",
        *os.environ.get("KOG_NVCC_FLAGS", "").split(),
    ]

    def extension(name, folder, include_dirs):
        sources = sorted(
            os.path.relpath(p, ROOT)
            for p in glob.glob(os.path.join(ROOT, folder, "*.cu")) + glob.glob(os.path.join(ROOT, folder, "*.cpp"))
        )
        return CUDAExtension(
            name=name,
            sources=sources,
            include_dirs=[os.path.join(ROOT, d) for d in include_dirs],
            py_limited_api=True,
            extra_compile_args={
                "cxx": ["-O3", "-std=c++17", "-DPy_LIMITED_API=0x030A0000"],
                "nvcc": [a for a in nvcc if a],
            },
        )

    exts = [extension("kog_backend._C", "csrc", ["csrc/include"])]
    if os.environ.get("KOG_BUILD_TEST_EXT", "1") != "0":
        # csrc/ on the include path for version.h: both extensions report the same ops version.
        exts.append(extension("kog_backend._C_test", "csrc/testing", ["csrc/include", "csrc"]))
    return exts, {"build_ext": BuildExtension}


ext_modules, cmdclass = _ext_modules()
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"bdist_wheel": {"py_limited_api": "cp310"}} if ext_modules else {},
)
