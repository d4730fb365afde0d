"""Multi-process harness for the collective's GPU tests and benchmark.

`run_ranks` spawns one process per rank (gloo group over TCP, rank r on GPU r % device_count, so several
ranks may share one GPU) and returns every rank's JSON-able result. `mps` starts a private CUDA MPS daemon
for the duration of a block: without MPS, kernels of different processes on one GPU never run at the same
time (the GPU time-slices between contexts), so a rank spinning on a peer's data only sees it after a
context switch: correct but milliseconds per call; with MPS they run concurrently.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

MPS_ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mps_quit(exe: str, env: dict[str, str]) -> None:
    try:
        subprocess.run([exe], input="quit\n", env=env, text=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pass


@contextlib.contextmanager
def mps(enable: bool = True, root: str = "/tmp/kog-mps"):
    """Yields "mps", "mps (external)" or "no-mps: <why>"; children spawned inside inherit the MPS env."""
    if not enable:
        yield "no-mps: not requested"
        return
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        yield "mps (external)"
        return
    exe = shutil.which("nvidia-cuda-mps-control")
    if exe is None:
        yield "no-mps: nvidia-cuda-mps-control not found"
        return
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{root}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{root}/log")
    for k in MPS_ENV:
        os.makedirs(env[k], exist_ok=True)
    started = subprocess.run([exe, "-d"], env=env, capture_output=True, text=True, timeout=30)
    for _ in range(10):
        if started.returncode == 0 or "already running" not in (started.stderr + started.stdout):
            break
        # a daemon on this private root is still there: one that outlived a killed run, or one quit a moment ago
        # and still shutting down (`quit` returns before the daemon exits). Quit it, give it a second, retry.
        _mps_quit(exe, env)
        time.sleep(1.0)
        started = subprocess.run([exe, "-d"], env=env, capture_output=True, text=True, timeout=30)
    if started.returncode != 0:
        yield f"no-mps: daemon did not start: {(started.stderr or started.stdout).strip()[:200]}"
        return
    probe = "import torch; x = torch.ones(4, device='cuda'); torch.cuda.synchronize(); print('probe', float(x.sum()))"
    try:
        r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=90)
        ok, why = r.returncode == 0 and "probe 4.0" in r.stdout, r.stderr.strip()[-300:]
    except subprocess.TimeoutExpired:
        ok, why = False, "probe timed out"
    if not ok:
        _mps_quit(exe, env)
        yield f"no-mps: a client could not use the daemon: {why}"
        return
    saved = {k: os.environ.get(k) for k in MPS_ENV}
    os.environ.update({k: env[k] for k in MPS_ENV})
    try:
        yield "mps"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _mps_quit(exe, env)


def _entry(rank: int, fn, world: int, port: int, out_dir: str, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    result = fn(rank, world, *args)
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def run_ranks(fn, world: int, args: tuple = (), timeout_s: float = 300.0) -> list:
    """fn(rank, world, *args) -> JSON-able, in `world` spawned processes; raises on error or timeout."""
    import torch.multiprocessing as mp

    out_dir = tempfile.mkdtemp(prefix="kog-ar-")
    ctx = mp.start_processes(_entry, args=(fn, world, free_port(), out_dir, args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.time() + timeout_s
    while not ctx.join(timeout=5):
        if time.time() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{world} ranks did not finish within {timeout_s} s")
    results = []
    for r in range(world):
        with open(os.path.join(out_dir, f"{r}.json")) as f:
            results.append(json.load(f))
    shutil.rmtree(out_dir, ignore_errors=True)
    return results
