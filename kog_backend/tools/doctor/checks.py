"""The checks of `kog doctor`, from what a Probe saw. Pure: no import of torch or vLLM here.

Statuses:
  ok    as kog needs it
  warn  kog runs, with something limited (tensor parallelism unavailable, the slow torch step, ...)
  fail  kog would not run here: vLLM serves every step stock (or, for a missing package, does not start)
  skip  not applicable (no GPU, one GPU)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kog_backend import SUPPORTED_VLLM
from kog_backend.config import WORKER_CLS
from kog_backend.path.gate.environment import REQUIRED_CAPABILITY, gpu_reason, vllm_version_reason

SUPPORTED_TORCH = "2.11"
NCCL_WHEEL = "nvidia-nccl-cu13"
PLUGIN_GROUPS = ("vllm.general_plugins", "vllm.platform_plugins")
STATUSES = ("ok", "warn", "fail", "skip")


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str
    summary: str
    fix: str = ""

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status


def run_checks(probe: Any, p2p: bool = True) -> list[Check]:
    gpus = probe.gpus()
    out = [
        check_install(probe),
        check_torch(probe),
        check_vllm(probe),
        check_runner_env(probe),
        check_gpus(gpus),
        check_driver(probe, gpus),
        check_extension(probe),
        check_nccl(probe, gpus),
    ]
    out.append(check_p2p(probe, gpus) if p2p else Check("P2P", "skip", "not checked (--skip-p2p)"))
    return out


def check_install(probe: Any) -> Check:
    version = probe.package_version("kog-backend")
    missing = [g for g in PLUGIN_GROUPS if "kog" not in probe.entry_point_names(g)]
    if version is None:
        return Check("kog_backend", "warn", "imported from a source tree, not installed: `--backend kog` is not registered",
                     "pip install --no-build-isolation -e .")
    if missing:
        return Check("kog_backend", "warn", f"{version} installed, but entry point(s) {', '.join(missing)} missing",
                     "reinstall: pip install --force-reinstall --no-deps -e .")
    plugins = probe.env("VLLM_PLUGINS")
    allowed = None if plugins is None else {p.strip() for p in plugins.split(",")}
    if allowed is not None and "kog" not in allowed:
        return Check("kog_backend", "warn", f"{version} installed, but VLLM_PLUGINS={plugins!r} does not load it: no `--backend kog`",
                     "add kog to VLLM_PLUGINS, or unset it")
    if probe.env("KOG_DISABLE_PLATFORM") not in (None, "", "0"):
        return Check("kog_backend", "warn", f"{version} installed, KOG_DISABLE_PLATFORM is set: no `--backend kog`",
                     f"unset KOG_DISABLE_PLATFORM, or use --worker-cls {WORKER_CLS}")
    others = [n for n in probe.entry_point_names("vllm.platform_plugins") if n != "kog" and (allowed is None or n in allowed)]
    if others:
        return Check("kog_backend", "warn", f"{version} installed, but platform plugin(s) {', '.join(others)} also are: "
                     "vLLM allows one, so kog leaves `--backend kog` off", f"use --worker-cls {WORKER_CLS}")
    return Check("kog_backend", "ok", f"{version}, vLLM plugin entry points registered")


def check_torch(probe: Any) -> Check:
    v = probe.torch_version()
    if v is None:
        return Check("torch", "fail", "not installed", f"pip install torch=={SUPPORTED_TORCH}.0")
    if not v.startswith(SUPPORTED_TORCH + "."):
        return Check("torch", "fail", f"{v}; kog's extension and vLLM {SUPPORTED_VLLM} need torch {SUPPORTED_TORCH}.x",
                     f"pip install torch=={SUPPORTED_TORCH}.0")
    return Check("torch", "ok", f"{v} (CUDA {probe.torch_cuda_version() or 'none'})")


def check_vllm(probe: Any) -> Check:
    v = probe.package_version("vllm")
    if v is None:
        return Check("vLLM", "fail", "not installed", f"pip install vllm=={SUPPORTED_VLLM}.0")
    reason = vllm_version_reason(v)
    if reason:
        return Check("vLLM", "fail", reason + "; kog turns itself off and vLLM serves stock", f"pip install vllm=={SUPPORTED_VLLM}.0")
    return Check("vLLM", "ok", v)


def check_runner_env(probe: Any) -> Check:
    """kog replaces vLLM's V2 model runner; anything that forces V1 turns kog off."""
    if probe.env("VLLM_USE_V2_MODEL_RUNNER") == "0":
        return Check("model runner", "fail", "VLLM_USE_V2_MODEL_RUNNER=0 forces vLLM's V1 runner; kog needs V2",
                     "unset VLLM_USE_V2_MODEL_RUNNER")
    lp = probe.entry_point_names("vllm.logits_processors")
    if lp:
        return Check("model runner", "fail", f"logits-processor plugin(s) {', '.join(lp)} installed: vLLM then uses its V1 runner",
                     "uninstall the package that provides them")
    return Check("model runner", "ok", "V2 (vLLM's default for dense models)")


def check_gpus(gpus: list[Any]) -> Check:
    if not gpus:
        return Check("GPU", "fail", "no GPU: the kog path needs an sm_90 GPU (H100/H200)")
    bad = [(g, gpu_reason(g.capability, g.name)) for g in gpus]
    bad = [(g, r) for g, r in bad if r]
    names = ", ".join(f"{g.index}: {g.name} sm_{g.capability[0]}{g.capability[1]} {g.memory_gib:g} GiB" for g in gpus)
    if bad:
        return Check("GPU", "fail", f"{bad[0][1]} ({names})",
                     f"run on sm_{REQUIRED_CAPABILITY[0]}{REQUIRED_CAPABILITY[1]} (Hopper); elsewhere vLLM serves stock")
    return Check("GPU", "ok", names)


def check_driver(probe: Any, gpus: list[Any]) -> Check:
    if not gpus:
        return Check("driver", "skip", "no GPU")
    release, cuda = probe.driver()
    torch_cuda = probe.torch_cuda_version()
    if release is None:
        return Check("driver", "warn", "NVML unavailable: driver version unknown (torch sees the GPU, so it works)")
    supported = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "?"
    if cuda and torch_cuda and _ver(supported) < _ver(torch_cuda):
        return Check("driver", "fail", f"{release} supports CUDA {supported}; torch is built for CUDA {torch_cuda}",
                     "upgrade the NVIDIA driver")
    return Check("driver", "ok", f"{release} (CUDA {supported})")


def check_extension(probe: Any) -> Check:
    ok, detail = probe.extension()
    if ok:
        return Check("extension", "ok", f"kog_backend._C loads ({detail})")
    return Check("extension", "warn", f"monokernel unavailable, kog turns itself off and vLLM serves stock: {detail}",
                 "build it: KOG_BUILD_EXT=1 pip install --no-build-isolation -e . (needs nvcc 13)")


def check_nccl(probe: Any, gpus: list[Any]) -> Check:
    wheel = probe.package_version(NCCL_WHEEL)
    runtime = probe.nccl_version() if gpus else None
    if wheel is None:
        return Check("NCCL", "warn", f"{NCCL_WHEEL} not installed: tensor parallelism may not start", f"pip install {NCCL_WHEEL}")
    return Check("NCCL", "ok", f"{NCCL_WHEEL} {wheel}" + (f", torch loads NCCL {runtime}" if runtime else ""))


def check_p2p(probe: Any, gpus: list[Any]) -> Check:
    if not gpus:
        return Check("P2P", "skip", "no GPU")
    if len(gpus) == 1:
        return Check("P2P", "skip", "one GPU: nothing to check (tensor parallelism needs several)")
    failures, rates = [], []
    for a in gpus:
        for b in gpus:
            if a.index == b.index:
                continue
            r = probe.p2p(a.index, b.index)
            if not (r.peer_access and r.copy_ok):
                why = r.error or ("no peer access" if not r.peer_access else "copied bytes differ")
                failures.append(f"{a.index}->{b.index}: {why}")
            elif r.gbps:
                rates.append(r.gbps)
    if failures:
        return Check("P2P", "warn", f"{len(failures)} GPU pair(s) fail: {'; '.join(failures[:4])}; tensor-parallel kog runs stock",
                     "see docs/troubleshooting.md#p2p")
    rate = f", {min(rates):.0f}-{max(rates):.0f} GB/s" if rates else ""
    return Check("P2P", "ok", f"all {len(gpus) * (len(gpus) - 1)} ordered pairs: peer access and an intact copy{rate}")


def exit_status(checks: list[Check]) -> int:
    """0: kog would run (warnings allowed); 1: at least one check failed, kog would not run."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def _ver(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())
