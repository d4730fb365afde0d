"""GPU tests of kog's all-reduce: 2 and 4 processes (sharing one GPU through CUDA IPC when there is only
one), a gloo group for the handle exchange.

Per world size, in one set of processes: the start-up check passes; integer-valued inputs give results
bitwise equal to torch's sum for every dtype, both algorithms and in place; random inputs give the same
bits on every rank and from both algorithms; STRESS_CALLS consecutive calls of changing size, dtype and
algorithm, starting just below the epoch wrap, each checked on the device against an expected value
computed on the device (synchronised once at the end); a CUDA graph of three calls replayed with new
inputs, interleaved with eager calls; and a rank that never arrives makes the others raise TimeoutError
naming it. A separate test runs KogCommunicator (vLLM's CudaCommunicator subclass) eagerly and in a graph.

Run on the device:  python integration_tests/test_collective_gpu.py [2 4] [--communicator]   (or pytest)
Without CUDA MPS the ranks' kernels time-slice (milliseconds per call): the stress test then runs
KOG_AR_STRESS_CALLS_NO_MPS calls (default 2000) instead of 100,000, and the report says so.
"""

from __future__ import annotations

import json
import os
import sys
import time

try:
    import pytest
except ImportError:  # the device image may lack pytest: run this file as a script there
    pytest = None

STRESS_CALLS = int(os.environ.get("KOG_AR_STRESS_CALLS", "100000"))
STRESS_CALLS_NO_MPS = int(os.environ.get("KOG_AR_STRESS_CALLS_NO_MPS", "2000"))
SUITE_CFG = {
    "oneshot_max": 32 * 1024,
    "twoshot_max": 256 * 1024,
    "timeout_s": 30.0,        # generous: without MPS a call can wait several time slices
    "short_timeout_s": 0.5,   # the missing-rank test
    "refresh_log2": 4,        # full-slot refresh every 16 calls, so the stress test exercises it often
}


def _bits(t):
    import torch

    return t.view({torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[t.dtype])


def _equal_bits(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


# ------------------------------------------------------------------------------------------ subtests


def _exact(ar, rank, world, dev, cfg):
    """Integer-valued inputs: bitwise equal to torch.stack(inputs).sum(0), every dtype and algorithm."""
    import torch

    from kog_backend.collective import layout

    one, two, unit = cfg["oneshot_max"], cfg["twoshot_max"], 16 * world
    cases = [(0, 16), (0, 4096), (0, 16384), (0, one), (1, unit), (1, unit * 37), (1, one + unit),
             (1, two // unit * unit)]
    bad, n_cases = [], 0
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        esize = torch.empty(0, dtype=dtype).element_size()
        for case, (algo, nbytes) in enumerate(cases):
            n = nbytes // esize
            inputs = []
            for r in range(world):
                g = torch.Generator(device=dev).manual_seed(1000 * case + r)
                inputs.append(torch.randint(-8, 9, (n,), generator=g, device=dev).to(dtype))
            ref = torch.stack(inputs).sum(0)
            out = torch.full_like(inputs[rank], float("nan"))
            ar.all_reduce(inputs[rank], out=out, algo=algo)
            auto_algo, _ = ar.choose(inputs[rank])
            inplace = inputs[rank].clone()
            ar.all_reduce(inplace, out=inplace, algo=algo)
            torch.cuda.synchronize()
            n_cases += 1
            if not _equal_bits(out, ref) or not _equal_bits(inplace, ref):
                bad.append(f"{dtype} algo {algo} {nbytes} B: {(out != ref).sum().item()} wrong")
            if auto_algo != (layout.ALGO_ONESHOT if nbytes <= one else layout.ALGO_TWOSHOT):
                bad.append(f"dispatch chose {auto_algo} for {nbytes} B")
    ar.raise_if_failed()
    return {"ok": not bad, "cases": n_cases, "bad": bad}


def _identical(ar, rank, world, dev, group):
    """Random (non-integer) inputs: every rank and both algorithms produce the same bits."""
    import torch
    import torch.distributed as dist

    bad, checked = [], 0
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float32, 1e-5)):
        for nbytes in (16 * world * 64, 16 * world * 512):
            n = nbytes // torch.empty(0, dtype=dtype).element_size()
            inputs = [torch.randn(n, generator=torch.Generator(device=dev).manual_seed(77 + r), device=dev).to(dtype)
                      for r in range(world)]
            outs = [ar.all_reduce(inputs[rank], algo=a) for a in (0, 1)]
            torch.cuda.synchronize()
            if not _equal_bits(outs[0], outs[1]):
                bad.append(f"{dtype} {nbytes} B: one-shot and two-shot differ")
            exact = torch.stack([x.double() for x in inputs]).sum(0)
            if not torch.allclose(outs[0].double(), exact, rtol=tol, atol=tol * world):
                bad.append(f"{dtype} {nbytes} B: far from the fp64 sum")
            mine = outs[0].view(torch.uint8).cpu()  # gloo has no int16
            gathered = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(gathered, mine, group=group)
            if not all(torch.equal(g, gathered[0]) for g in gathered):
                bad.append(f"{dtype} {nbytes} B: ranks disagree")
            checked += 1
    ar.raise_if_failed()
    return {"ok": not bad, "cases": checked, "bad": bad}


def _stress(ar, rank, world, dev, group, cfg, calls):
    """`calls` consecutive calls of changing size/dtype/algorithm, starting 5000 calls before the epoch wrap;
    every output compared on the device with an expected value computed on the device."""
    import random

    import torch

    from kog_backend.collective import groupcomm, layout

    # Jump every rank's epoch to 0xFFFFEC77 (-5001 as int32). Only safe once every rank's earlier calls have
    # finished (the jump breaks the set alternation for one call): synchronize, then a barrier.
    torch.cuda.synchronize()
    groupcomm.barrier(group)
    ar._epochs.fill_(-5001)
    rng = random.Random(1234)  # same sequence on every rank
    one, two, unit = cfg["oneshot_max"], cfg["twoshot_max"], 16 * world
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    sizes = []
    for k in range(64):
        if k % 2 == 0:
            sizes.append((layout.ALGO_ONESHOT, 16 * rng.randint(1, one // 16)))
        else:
            sizes.append((layout.ALGO_TWOSHOT, unit * rng.randint(one // unit + 1, two // unit)))
    S = world * (world + 1) // 2
    xs, es, algos = [], [], []
    for k, (algo, nbytes) in enumerate(sizes):
        dtype = dtypes[k % 3]
        n = nbytes // torch.empty(0, dtype=dtype).element_size()
        g = torch.Generator(device=dev).manual_seed(k)
        base = torch.randint(-4, 5, (n,), generator=g, device=dev).to(dtype)
        xs.append(base * (rank + 1))
        es.append(base * S)
        algos.append(algo)
    mism = torch.zeros((), dtype=torch.int64, device=dev)
    ranks = range(world)
    torch.cuda.synchronize()
    t0 = time.time()
    for i in range(calls):
        k = i % 64
        c = [((i * 37 + r * 11) % 61) - 30 for r in ranks]  # per call and rank: stale data cannot match
        x = xs[k] + c[rank]
        out = ar.all_reduce(x, algo=algos[k])
        mism += (out != es[k] + sum(c)).sum()
    torch.cuda.synchronize()
    dt = time.time() - t0
    failed = ar.failed()
    return {"ok": int(mism.item()) == 0 and not failed, "calls": calls, "mismatches": int(mism.item()),
            "timed_out": ar.error_message() if failed else None, "seconds": round(dt, 2),
            "us_per_call": round(dt / calls * 1e6, 1), "final_epoch": int(ar._epochs[0].item()) & 0xFFFFFFFF}


def _graph(ar, rank, world, dev, cfg):
    """Three calls captured in one graph (one-shot, two-shot, and a call on the first's output), replayed
    with new inputs, with eager calls in between."""
    import torch

    n1 = 2048  # 4 KB bf16: one-shot
    unit = 16 * world // 2
    n2 = (cfg["oneshot_max"] // 2 // unit + 3) * unit  # bf16 elements, above one-shot: two-shot
    idx1 = torch.arange(n1, device=dev)
    idx2 = torch.arange(n2, device=dev)
    x1 = torch.zeros(n1, dtype=torch.bfloat16, device=dev)
    x2 = torch.zeros(n2, dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            y1 = ar.all_reduce(x1)
            y2 = ar.all_reduce(x2)
            y3 = ar.all_reduce(y1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1 = ar.all_reduce(x1)
        y2 = ar.all_reduce(x2)
        y3 = ar.all_reduce(y1)
    mism = torch.zeros((), dtype=torch.int64, device=dev)
    replays = 50
    for it in range(replays):
        f1 = lambda r, it=it: (idx1 % 13 - 6) + (it % 7) + r
        f2 = lambda r, it=it: (idx2 % 11 - 5) * (r + 1) - (it % 5)
        x1.copy_(f1(rank))
        x2.copy_(f2(rank))
        graph.replay()
        want1 = sum(f1(r) for r in range(world)).to(torch.bfloat16)
        want2 = sum(f2(r) for r in range(world)).to(torch.bfloat16)
        mism += (y1 != want1).sum() + (y2 != want2).sum() + (y3 != want1 * world).sum()
        if it % 2:
            z = ar.all_reduce(x2)
            mism += (z != want2).sum()
    torch.cuda.synchronize()
    failed = ar.failed()
    return {"ok": int(mism.item()) == 0 and not failed, "replays": replays, "mismatches": int(mism.item()),
            "timed_out": ar.error_message() if failed else None}


def _timeout(ar, rank, world, group, cfg):
    """The last rank never calls: the others must raise TimeoutError naming it, after about the timeout."""
    import torch

    from kog_backend.collective import groupcomm

    missing = world - 1
    ar.set_timeout(cfg["short_timeout_s"], trap_on_timeout=False)
    res = {"missing": missing}
    if rank != missing:
        x = torch.ones(1024, dtype=torch.bfloat16, device=torch.cuda.current_device())
        t0 = time.time()
        ar.all_reduce(x, algo=0)
        torch.cuda.synchronize()
        res["seconds"] = round(time.time() - t0, 3)
        try:
            ar.raise_if_failed()
            res["raised"] = None
        except TimeoutError as e:
            res["raised"] = str(e)
        try:
            ar.all_reduce(x, algo=0)
            res["later_call"] = None
        except TimeoutError as e:
            res["later_call"] = str(e)
        res["ok"] = (res["raised"] is not None and f"for rank {missing}" in res["raised"]
                     and res["later_call"] is not None and res["seconds"] >= 0.8 * cfg["short_timeout_s"])
    else:
        res["ok"] = True
    groupcomm.barrier(group)
    return res


def suite_worker(rank, world, cfg, stress_calls):
    import torch
    import torch.distributed as dist

    from kog_backend.collective import dispatch
    from kog_backend.collective.allreduce import KogAllReduce

    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    th = dispatch.Thresholds(oneshot_max=cfg["oneshot_max"], twoshot_max=cfg["twoshot_max"])
    t0 = time.time()
    ar = KogAllReduce(group, dev, thresholds=th, timeout_s=cfg["timeout_s"], trap_on_timeout=False,
                      refresh_log2=cfg["refresh_log2"])
    res = {"disabled_reason": ar.disabled_reason, "setup_s": round(time.time() - t0, 2)}
    if ar.disabled:
        return res
    res["exact"] = _exact(ar, rank, world, dev, cfg)
    res["identical"] = _identical(ar, rank, world, dev, group)
    res["stress"] = _stress(ar, rank, world, dev, group, cfg, stress_calls)
    res["graph"] = _graph(ar, rank, world, dev, cfg)
    res["timeout"] = _timeout(ar, rank, world, group, cfg)
    ar.close()
    return res


def communicator_worker(rank, world):
    """KogCommunicator built like vLLM builds a TP group's communicator (gloo stands in for NCCL, which
    refuses two ranks on one GPU): kog takes single-row tensors, the stock chain the rest, graphs work."""
    os.environ["VLLM_DISABLE_PYNCCL"] = "1"
    os.environ["VLLM_ALLREDUCE_USE_SYMM_MEM"] = "0"
    import torch
    import torch.distributed as dist
    from vllm.distributed.parallel_state import set_custom_all_reduce

    from kog_backend.collective.communicator import KogCommunicator

    set_custom_all_reduce(False)
    dev = torch.device("cuda", torch.cuda.current_device())
    comm = KogCommunicator(dist.group.WORLD, dev, dist.group.WORLD, unique_name="tp:0")
    res = {"kog_disabled_reason": comm.kog_disabled_reason}
    if comm.kog_ar is None:
        res["ok"] = False
        return res
    bad = []
    one = torch.full((1, 2048), rank + 1.0, dtype=torch.bfloat16, device=dev)
    many = torch.full((8, 2048), rank + 1.0, dtype=torch.bfloat16, device=dev)
    want = float(world * (world + 1) // 2)
    if not torch.all(comm.all_reduce(one) == want) or comm.kog_calls != 1:
        bad.append("single-row tensor")
    if not torch.all(comm.all_reduce(many) == want) or comm.kog_calls != 1 or not comm.kog_fallbacks:
        bad.append("batched tensor should go stock")
    x = torch.zeros((1, 2048), dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        comm.all_reduce(x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = comm.all_reduce(x)
    for it in range(10):
        x.fill_(rank + it)
        g.replay()
        if not torch.all(y == float(sum(r + it for r in range(world)))):
            bad.append(f"graph replay {it}")
    torch.cuda.synchronize()
    res.update(ok=not bad, bad=bad, kog_calls=comm.kog_calls, fallbacks=dict(comm.kog_fallbacks))
    comm.destroy()
    return res


# ------------------------------------------------------------------------------------------ drivers


def run_suite(world: int, mps_status: str) -> list[dict]:
    from kog_backend.collective.testing import run_ranks

    calls = STRESS_CALLS if mps_status.startswith("mps") else STRESS_CALLS_NO_MPS
    return run_ranks(suite_worker, world, args=(SUITE_CFG, calls), timeout_s=600)


def check_suite(results: list[dict]) -> list[str]:
    problems = []
    for r, res in enumerate(results):
        if res.get("disabled_reason"):
            problems.append(f"rank {r}: disabled: {res['disabled_reason']}")
            continue
        for name in ("exact", "identical", "stress", "graph", "timeout"):
            if not res[name]["ok"]:
                problems.append(f"rank {r}: {name}: {json.dumps(res[name])[:400]}")
    return problems


if pytest is not None:
    @pytest.fixture(scope="module")
    def mps_status():
        from kog_backend.collective.testing import mps

        with mps() as status:
            yield status

    @pytest.mark.gpu
    @pytest.mark.parametrize("world", [2, 4])
    def test_collective_suite(world, mps_status):
        results = run_suite(world, mps_status)
        assert not check_suite(results), check_suite(results)

    @pytest.mark.vllm_gpu
    def test_kog_communicator(mps_status):
        pytest.importorskip("vllm")
        from kog_backend.collective.testing import run_ranks

        results = run_ranks(communicator_worker, 2, timeout_s=300)
        assert all(r["ok"] for r in results), results


def _report_suite(world: int, status: str) -> tuple[bool, bool]:
    """Runs and prints one world size; returns (passed, disabled_by_the_start_up_check)."""
    t0 = time.time()
    try:
        results = run_suite(world, status)
        problems = check_suite(results)
    except Exception as e:  # noqa: BLE001 - report and continue with the next world size
        results, problems = [], [f"{type(e).__name__}: {e}"]
    print(f"world {world} ({status}): {'PASS' if not problems else 'FAIL'} in {time.time() - t0:.0f} s", flush=True)
    for p in problems:
        print("   ", p)
    for r, res in enumerate(results):
        print(f"    rank {r}: " + json.dumps(res)[:1500], flush=True)
    return not problems, bool(results) and all(res.get("disabled_reason") for res in results)


def main(argv: list[str]) -> int:
    from kog_backend.collective.testing import mps, run_ranks

    worlds = [int(w) for w in argv[1:] if w.isdigit()] or ([] if "--communicator" in argv else [2, 4])
    failures, retry = 0, []
    with mps() as status:
        print(f"MPS: {status}", flush=True)
        for world in worlds:
            passed, disabled = _report_suite(world, status)
            if disabled and status.startswith("mps"):
                retry.append(world)  # e.g. IPC refused under MPS: run again with time-slicing below
            else:
                failures += not passed
        if "--communicator" in argv:
            t0 = time.time()
            try:
                results = run_ranks(communicator_worker, 2, timeout_s=300)
                ok = all(r["ok"] for r in results)
            except Exception as e:  # noqa: BLE001
                results, ok = [f"{type(e).__name__}: {e}"], False
            failures += not ok
            print(f"KogCommunicator (world 2): {'PASS' if ok else 'FAIL'} in {time.time() - t0:.0f} s: {results}",
                  flush=True)
    for world in retry:
        failures += not _report_suite(world, "no-mps: retry after the start-up check failed under MPS")[0]
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main(sys.argv))
