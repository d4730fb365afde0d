"""Per-call latency of kog's all-reduce (one-shot, two-shot), NCCL (torch.distributed) and vLLM's custom
all-reduce, bf16, at 2-256 KB, eager and inside CUDA graphs, for any world size.

  python benchmarks/bench_allreduce.py --world 2 4 [--sizes-kb 2 4 8 16 64 256] [--out results.json]

One process per rank (gloo group for set-up; rank r on GPU r % device_count). When the ranks share fewer
GPUs than there are ranks, every "remote" store lands in the same GPU's memory: the figures then measure
only the protocol's own overhead (launch, polling, L2 round trips), not NVLink, and NCCL cannot run at all
(it refuses two ranks on one GPU). Without CUDA MPS, kernels of different processes on one GPU time-slice
and the figures are meaningless (the script says which case it ran). The caveat is printed with the table.

Timing: eager = CUDA events around `--iters` back-to-back calls (includes Python dispatch and launch);
graph = `--graph-calls` calls captured in one CUDA graph, replayed `--graph-replays` times, per call.
Each rank times itself; the table shows the slowest rank.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CAVEAT_ONE_GPU = ("CAVEAT: all ranks share ONE GPU: these figures are the protocol's own overhead (launch, "
                  "polling, same-GPU L2 traffic), not NVLink latency; NCCL cannot run with two ranks on one GPU.")
CAVEAT_NO_MPS = ("CAVEAT: no CUDA MPS: kernels of different processes on one GPU time-slice, so these "
                 "figures are dominated by context switches and mean nothing.")


def _barrier(group):
    from kog_backend.collective import groupcomm

    groupcomm.barrier(group)


def _time_eager(fn, iters, warmup, group):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    _barrier(group)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def _time_graph(fn, calls, replays, group, capture_ctx=contextlib.nullcontext):
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with capture_ctx(), torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    _barrier(group)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (replays * calls)


def _vllm_custom_ar(group, dev, world, one_gpu):
    """vLLM's CustomAllreduce on the gloo group, or (None, why). On one GPU its P2P/NVLink probes answer
    "no" for a GPU paired with itself although IPC works, so they are bypassed there (benchmark only)."""
    try:
        from vllm.distributed.device_communicators import custom_all_reduce as car
    except Exception as e:  # noqa: BLE001
        return None, f"vLLM not importable: {type(e).__name__}: {e}"
    if not car.custom_ar:
        return None, "vLLM's _C has no custom all-reduce ops"
    if one_gpu:
        from vllm.platforms import current_platform

        car._can_p2p = lambda rank, world_size: True
        type(current_platform).is_fully_connected = classmethod(lambda cls, ids: True)
    try:
        ca = car.CustomAllreduce(group, dev)
    except Exception as e:  # noqa: BLE001
        return None, f"CustomAllreduce failed: {type(e).__name__}: {e}"
    if ca.disabled:
        return None, "CustomAllreduce disabled itself (see its log)"
    return ca, None


def bench_worker(rank, world, cfg):
    import torch
    import torch.distributed as dist

    from kog_backend.collective import dispatch, layout
    from kog_backend.collective.allreduce import KogAllReduce

    group = dist.group.WORLD
    dev = torch.device("cuda", torch.cuda.current_device())
    one_gpu = torch.cuda.device_count() < world
    th = dispatch.Thresholds(oneshot_max=256 * 1024, twoshot_max=1024 * 1024)
    ar = KogAllReduce(group, dev, thresholds=th, timeout_s=60.0, trap_on_timeout=False)
    res = {"rank": rank, "device": torch.cuda.get_device_name(dev), "one_gpu": one_gpu,
           "kog_disabled": ar.disabled_reason, "notes": {}, "us": {}}

    nccl = None
    if one_gpu:
        res["notes"]["nccl"] = "not run: NCCL refuses two ranks on one GPU"
    else:
        nccl = dist.new_group(backend="nccl")
    ca = None
    if cfg["vllm"]:
        ca, why = _vllm_custom_ar(group, dev, world, one_gpu)
        if why:
            res["notes"]["vllm_custom_ar"] = why
    else:
        res["notes"]["vllm_custom_ar"] = "not requested"

    it, wu, gc, gr = cfg["iters"], cfg["warmup"], cfg["graph_calls"], cfg["graph_replays"]
    for kb in cfg["sizes_kb"]:
        nbytes = int(kb * 1024)
        x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=dev)
        y = torch.empty_like(x)
        row = res["us"].setdefault(str(kb), {})
        if not ar.disabled:
            for algo, name in ((layout.ALGO_ONESHOT, "kog_1shot"), (layout.ALGO_TWOSHOT, "kog_2shot")):
                if algo == layout.ALGO_TWOSHOT and nbytes % (16 * world):
                    continue
                fn = lambda x=x, y=y, algo=algo: ar.all_reduce(x, out=y, algo=algo)
                row[f"{name}_eager"] = _time_eager(fn, it, wu, group)
                row[f"{name}_graph"] = _time_graph(fn, gc, gr, group)
            torch.cuda.synchronize()
            if ar.failed():
                res["kog_error"] = ar.error_message()
                break
        if nccl is not None:
            fn = lambda y=y: dist.all_reduce(y, group=nccl)
            row["nccl_eager"] = _time_eager(fn, it, wu, group)
            row["nccl_graph"] = _time_graph(fn, gc, gr, group)
        if ca is not None and nbytes < ca.max_size:
            fn = lambda x=x: ca.custom_all_reduce(x)
            row["vllm_ca_eager"] = _time_eager(fn, it, wu, group)
            row["vllm_ca_graph"] = _time_graph(fn, gc, gr, group, capture_ctx=ca.capture)
    torch.cuda.synchronize()
    ar.close()
    if ca is not None:
        ca.close()
    return res


COLUMNS = ("kog_1shot_eager", "kog_1shot_graph", "kog_2shot_eager", "kog_2shot_graph", "nccl_eager", "nccl_graph",
           "vllm_ca_eager", "vllm_ca_graph")


def table(world, results, mps_status) -> str:
    r0 = results[0]
    lines = [f"all-reduce latency per call (us, slowest rank), bf16, world {world}, {r0['device']}, {mps_status}"]
    if r0["one_gpu"]:
        lines.append(CAVEAT_ONE_GPU)
    if r0["one_gpu"] and not mps_status.startswith("mps"):
        lines.append(CAVEAT_NO_MPS)
    if r0["kog_disabled"]:
        lines.append(f"kog disabled: {r0['kog_disabled']}")
    for k, v in r0["notes"].items():
        lines.append(f"{k}: {v}")
    lines.append("size KB | " + " | ".join(COLUMNS))
    for kb in r0["us"]:
        cells = []
        for c in COLUMNS:
            vals = [r["us"].get(kb, {}).get(c) for r in results]
            cells.append("-" if any(v is None for v in vals) else f"{max(vals):.2f}")
        lines.append(f"{kb:>7} | " + " | ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes-kb", type=float, nargs="+", default=[2, 4, 8, 16, 64, 256])
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--graph-calls", type=int, default=50)
    p.add_argument("--graph-replays", type=int, default=20)
    p.add_argument("--no-vllm", action="store_true", help="skip vLLM's custom all-reduce")
    p.add_argument("--no-mps", action="store_true", help="do not start CUDA MPS when ranks share a GPU")
    p.add_argument("--out", default="", help="write all per-rank results as JSON here")
    args = p.parse_args(argv)

    import torch

    from kog_backend.collective.testing import mps, run_ranks

    cfg = {"sizes_kb": args.sizes_kb, "iters": args.iters, "warmup": args.warmup, "graph_calls": args.graph_calls,
           "graph_replays": args.graph_replays, "vllm": not args.no_vllm}
    need_mps = torch.cuda.device_count() < max(args.world) and not args.no_mps
    everything = {}
    with mps(enable=need_mps) as status:
        if torch.cuda.device_count() < max(args.world) and not status.startswith("mps"):
            # time-sliced ranks take milliseconds per call: keep the run short, the figures mean nothing anyway
            cfg.update(iters=min(args.iters, 50), warmup=min(args.warmup, 5), graph_calls=min(args.graph_calls, 10),
                       graph_replays=min(args.graph_replays, 3))
            print(f"{status}: iterations cut to {cfg}", flush=True)
        for world in args.world:
            t0 = time.time()
            try:
                results = run_ranks(bench_worker, world, args=(cfg,), timeout_s=600)
            except Exception as e:  # noqa: BLE001 - report and go on with the next world size
                print(f"world {world}: FAILED: {type(e).__name__}: {e}", flush=True)
                continue
            everything[world] = {"mps": status, "ranks": results}
            print(table(world, results, status), flush=True)
            print(f"(world {world} took {time.time() - t0:.0f} s)\n", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
