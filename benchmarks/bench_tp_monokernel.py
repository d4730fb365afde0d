"""Tensor-parallel monokernel: time per token at world size W, with and without its cross-rank exchanges.

One process per rank (rank r on GPU r % device_count; when the ranks share a GPU they run under CUDA MPS with a
grid of SMs / W blocks each). Each rank builds the same random full-weight model (real shapes), keeps its vLLM TP
shard and KV heads (kog_backend.monokernel.tp), and times launches of K greedy tokens at context `ctx` with CUDA
events (median of --reps):

  exchange     the TP kernel as shipped: O / down partials and LM-head keys pushed to every rank, polled for
  no exchange  the same launch on a table with tp_size = 1: each rank treats its own partial as the sum (wrong
               tokens, timing only), so  (exchange - no exchange) / (2 L + 1)  is the in-kernel cost of one
               all-reduce (2 per layer, plus the LM-head key exchange)

bytes/token per rank = its shard's weights (model_spec.weight_bytes_per_token) + its KV heads' context.
With the ranks sharing one GPU only the protocol's own overhead means anything (no link is crossed, and the ranks
split one GPU's bandwidth): the table says so. Prints a table last; writes JSON to $OUT/bench_tp_monokernel.json
when $OUT is set.

  python benchmarks/bench_tp_monokernel.py --world 2 [--shapes llama-3.2-1b,qwen3-1.7b] [--ctx 32] [--k 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_monokernel import time_steps  # noqa: E402  (median of CUDA-event-timed launches)

BS = 16


def rank_bench(rank: int, world: int, shapes: list[str], ctx: int, k: int, reps: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    from kog_backend import ops
    from kog_backend.collective import groupcomm
    from kog_backend.collective.ipc import SharedBuffer
    from kog_backend.monokernel import Monokernel, layout, synthetic, tp

    dev = torch.device("cuda", torch.cuda.current_device())
    group = dist.group.WORLD
    share = max(1, world // torch.cuda.device_count())  # ranks per GPU
    sms = torch.cuda.get_device_properties(dev).multi_processor_count // share
    rows = []
    for name in shapes:
        s = synthetic.make_shape(*synthetic.SHAPES[name], max_position=ctx + k + 64)
        full = synthetic.random_decoder(s, dev, seed=1)
        nblocks = (ctx + k) // BS + 8
        caches = synthetic.paged_kv_caches(s, nblocks, BS, dev)
        bt = synthetic.shuffled_block_table(nblocks, nblocks - 1, nblocks, dev, seed=3)
        synthetic.fill_context(caches, bt, ctx, s.head_dim, seed=4)
        w = tp.shard_decoder(full, rank, world)
        caches = tp.shard_kv_caches(caches, rank, world)
        del full
        torch.cuda.empty_cache()
        buf, reason = SharedBuffer.create(ops.ops(), group, dev.index, tp.tp_buffer_layout(w.shape, world).nbytes)
        if buf is None:
            return [{"error": f"shared buffer: {reason}"}]
        mk = Monokernel(w, caches, dev, max_model_len=ctx + k + 8, max_tokens_per_launch=k, sm_count=sms,
                        tp_buffer=buf)  # fmt: skip
        ids = torch.tensor([42], device=dev)
        positions = torch.tensor([ctx], device=dev)
        slots = torch.tensor([int(bt[ctx // BS]) * BS + ctx % BS], device=dev)
        kv_bytes = ctx * w.shape.kv_bytes_per_position  # this rank's KV heads
        row = dict(shape=name, world=world, rank=rank, ranks_per_gpu=share, grid=mk.plan.grid, k=k, ctx=ctx,
                   weight_bytes=w.weight_bytes_per_token(), kv_bytes=kv_bytes, layers=s.num_layers)  # fmt: skip
        # no exchange: tp_rank 0 and W = 1 make every push target delta[0], which must then be this rank's own
        # buffer (0), not rank 0's: otherwise rank r > 0 signals rank 0's counters and its own waits time out
        # (measured: 1.2 s per token on world 2; layout.tp_fields_error now refuses such a table).
        alone = mk.variant_table(tp_size=1, tp_rank=0, tp_delta=[0] * layout.CONFIG["kMaxTP"])
        for label, tbl in (("exchange", None), ("no exchange", alone)):
            if rank == 0:  # progress, so that a run that stops says where
                print(f"world {world}: {name} built (grid {mk.plan.grid} per rank), timing {label}", flush=True)
            # every rank idle, then fresh counters everywhere: a variant's counters do not count W x chunks
            torch.cuda.synchronize()
            groupcomm.barrier(group)
            mk.reset_counters()
            groupcomm.barrier(group)
            t = time_steps(lambda: mk.generate(ids, positions, bt, slots, k, model_table=tbl), reps)
            row[label] = t / k * 1e6
            diag = mk.diagnostics()
            if diag:
                row[f"{label} timeout"] = diag
        rows.append(row)
        torch.cuda.synchronize()
        groupcomm.barrier(group)
        buf.close(group=group)
        del mk, w, caches
        torch.cuda.empty_cache()
    return rows


def table(rows: list[dict]) -> str:
    out = ["shape         W  ranks/GPU  us/token  no-exchange  per all-reduce us  GB/s per rank  errors"]
    for r in rows:
        if "error" in r:
            out.append(f"error: {r['error']}")
            continue
        per_ar = (r["exchange"] - r["no exchange"]) / (2 * r["layers"] + 1)
        gbs = (r["weight_bytes"] + r["kv_bytes"]) / (r["exchange"] * 1e-6) / 1e9
        errs = "; ".join(v for kk, v in r.items() if kk.endswith("timeout")) or "-"
        out.append(f"{r['shape']:<13} {r['world']:>2} {r['ranks_per_gpu']:>10} {r['exchange']:>9.1f} "
                   f"{r['no exchange']:>12.1f} {per_ar:>18.2f} {gbs:>14.0f}  {errs}")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2])
    ap.add_argument("--shapes", default="llama-3.2-1b,qwen3-1.7b")
    ap.add_argument("--ctx", type=int, default=32)
    ap.add_argument("--k", type=int, default=16, help="tokens per launch")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    import torch

    from kog_backend.collective.testing import mps, run_ranks

    shapes = args.shapes.split(",")
    results = []
    for world in args.world:
        shared = torch.cuda.device_count() < world
        with mps(enable=shared) as status:
            if shared and not status.startswith("mps"):
                print(f"world {world}: ranks would share a GPU without MPS ({status}); skipped", flush=True)
                continue
            per_rank = run_ranks(rank_bench, world, args=(shapes, args.ctx, args.k, args.reps), timeout_s=900)
        # the slowest rank sets the pace of a coupled launch
        for i in range(len(per_rank[0])):
            rows = [pr[i] for pr in per_rank]
            if any("error" in r for r in rows):
                results.append(next(r for r in rows if "error" in r))
                continue
            worst = max(rows, key=lambda r: r["exchange"])
            worst = dict(worst, **{"no exchange": max(r["no exchange"] for r in rows)})
            results.append(worst)
    note = ""
    if results and any(r.get("ranks_per_gpu", 1) > 1 for r in results):
        note = ("\nranks share one GPU (MPS): per all-reduce = the protocol's own overhead on one GPU, not a link's "
                "latency; GB/s is a share of one GPU")  # fmt: skip
    print(f"\nGPU: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}; random weights, real shapes; "
          f"ctx {args.ctx}, K {args.k}, median of {args.reps} launches per rank, slowest rank shown{note}")  # fmt: skip
    print(table(results), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_tp_monokernel.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
