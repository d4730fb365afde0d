"""What `kog doctor` reads from the machine. Every method fails soft (returns None / [] / an error string);
`checks.py` decides what that means. Tests replace this class with a fake."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from importlib import metadata
from typing import Any

P2P_TEST_BYTES = 64 * 2**20  # large enough to time, small enough for a quick check


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    capability: tuple[int, int]
    memory_gib: float


@dataclasses.dataclass(frozen=True)
class P2PResult:
    src: int
    dst: int
    peer_access: bool  # torch.cuda.can_device_access_peer
    copy_ok: bool  # the copied bytes arrived intact
    gbps: float | None = None
    error: str | None = None


class Probe:
    def python_version(self) -> str:
        return platform.python_version()

    def package_version(self, dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    def entry_point_names(self, group: str) -> list[str]:
        return sorted({ep.name for ep in metadata.entry_points(group=group)})

    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    def torch_version(self) -> str | None:
        try:
            import torch
        except ImportError:
            return None
        return torch.__version__

    def torch_cuda_version(self) -> str | None:
        try:
            import torch
        except ImportError:
            return None
        return torch.version.cuda

    def gpus(self) -> list[GpuInfo]:
        try:
            import torch
        except ImportError:
            return []
        if not torch.cuda.is_available():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(GpuInfo(i, p.name, (p.major, p.minor), round(p.total_memory / 2**30, 1)))
        return out

    def driver(self) -> tuple[str | None, int | None]:
        """(driver release such as "580.159.03", CUDA version the driver supports such as 13000), via NVML."""
        nvml = _nvml()
        if nvml is None:
            return None, None
        try:
            nvml.nvmlInit()
            try:
                release = nvml.nvmlSystemGetDriverVersion()
                cuda = nvml.nvmlSystemGetCudaDriverVersion()
            finally:
                nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - no driver / NVML unusable: unknown
            return None, None
        return (release.decode() if isinstance(release, bytes) else str(release)), int(cuda)

    def nccl_version(self) -> str | None:
        try:
            import torch

            v = torch.cuda.nccl.version()
        except Exception:  # noqa: BLE001 - torch built without NCCL, or it cannot load
            return None
        return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)

    def extension(self) -> tuple[bool, str]:
        """(loaded, detail) for kog_backend._C, as the kog path loads it (`kog_backend.ops.load_reason`:
        built, loads, and its version matches this package)."""
        try:
            from kog_backend import ops

            reason = ops.load_reason()
        except Exception as e:  # noqa: BLE001 - torch missing, an ABI mismatch: report it verbatim
            return False, f"{type(e).__name__}: {e}"
        if reason is not None:
            return False, reason
        return True, ops.extension_path() or "kog_backend._C"

    def p2p(self, src: int, dst: int) -> P2PResult:
        import torch

        access = bool(torch.cuda.can_device_access_peer(src, dst))
        try:
            n = P2P_TEST_BYTES // 4
            a = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device=f"cuda:{src}")
            b = torch.full((n,), -1, dtype=torch.int32, device=f"cuda:{dst}")
            b.copy_(a)  # warm-up
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            b.fill_(-1)
            torch.cuda.synchronize(dst)
            t0 = time.perf_counter()
            b.copy_(a)
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            dt = time.perf_counter() - t0
            ok = bool(torch.equal(a.cpu(), b.cpu()))  # compared on the host, not through another peer copy
            del a, b
        except Exception as e:  # noqa: BLE001 - a failing copy is the finding
            return P2PResult(src, dst, access, False, None, f"{type(e).__name__}: {e}")
        return P2PResult(src, dst, access, ok, P2P_TEST_BYTES / dt / 1e9)


def _nvml() -> Any:
    try:
        import pynvml  # nvidia-ml-py

        return pynvml
    except ImportError:
        pass
    try:
        from vllm.third_party import pynvml  # vLLM ships a copy

        return pynvml
    except ImportError:
        return None
