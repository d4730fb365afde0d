"""Monokernel time per decode step on one H200, next to the device-to-device copy bandwidth of the same run.

Random bf16 weights with the real shapes (Llama-3.2-1B, Qwen3-1.7B, Llama-3.1-8B), built directly on the GPU; a
paged KV cache (block 16, shuffled block table) with random context. Each figure is the median of --reps launches
timed one by one with CUDA events (the weights are >= 2.5 GB, 40x the L2, so nothing stays cached).

  bytes/step = weights read (model_spec.weight_bytes_per_token) + K/V read (ctx x layers x kv heads x 2D x 2 B)
  GB/s = bytes/step / time; share = GB/s / copy GB/s (copy counts bytes read + written)

Variants (Llama-3.2-1B, ctx 32) say where the time goes: the LM head cut to one chunk, half the layers, a
shallower weight ring, no / deeper L2 prefetch beyond the ring; --hold 1:12,12:1,1:1 times the loader's hold around
hand-offs (ModelArgs::stage_end_copies:attn_end_copies, csrc/include/kog/handoff_hold.cuh) on every shape, and
--single-ctx 256 one attention split per KV head at short contexts (ModelArgs::attn_single_ctx), --prefetch 3,6 a
constant L2 lead beyond the ring and --stall-prefetch 2,4,8 the L2 prefetch while the loader waits for a slot
(ModelArgs::prefetch_chunks / stall_prefetch_chunks), --inflight 2,3 at most that many bulk copies in flight per SM
(ModelArgs::max_inflight), --set 'stage_end_copies=3;stage_end_copies=3,max_inflight=3' any ModelArgs overrides
together (e.g. 'tagged_handoffs=1' makes the gate/up -> down hand-off through tagged words in a
-DKOG_TAGGED_HANDOFFS=1 build). --trace prints a typical layer's timeline
(Monokernel.trace_table, kog_backend/monokernel/timeline.py). Prints a table last; writes JSON to $OUT/bench_monokernel.json when $OUT is set.

  python benchmarks/bench_monokernel.py [--shapes llama-3.2-1b,...] [--ctx 32,1024,4096] [--reps 50] [--fp8 block]

--fp8 tensor|channel|block: the four projections of every layer in FP8 (e4m3) with fp32 scales of that layout,
quantised from the same random bf16 weights (synthetic.random_decoder(shape, device, seed, fp8=layout)), embedding,
LM head and norms bf16; bytes/step are then what the FP8 model reads (model_spec.weight_bytes_per_token: one byte per
projection weight plus its scales) + K/V, so GB/s and the share of copy bandwidth count the bytes actually read.

--tokens 32 also times 32-token launches (Monokernel.generate, as vLLM's bursts run) and reports their time per
token: what a change at the token boundary (the LM head's argmax, the next token's first weights) moves. With
--trace as well, where each boundary of such a launch goes (timeline.token_boundaries). --sampling
temperature,llama,qwen3,min-p times such launches drawing as vLLM's sampler does (SAMPLING_MODES: temperature alone,
the Llama 3.x and Qwen3 generation configs, min-p, penalties; csrc/include/kog/burst_sampling.cuh, penalties.cuh),
per token computed (a launch that defers a token ends there: its time is divided by the tokens it computed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kog_backend.monokernel import Monokernel, synthetic  # noqa: E402
from kog_backend.monokernel.plan import lm_rows  # noqa: E402
from kog_backend.monokernel.timeline import (  # noqa: E402
    format_boundaries,
    format_timeline,
    summarize,
    token_boundaries,
)

BS = 16
# vLLM's sampling settings a sampled burst draws with (--sampling): name -> Monokernel.generate's filters.
SAMPLING_MODES = {
    "temperature": dict(temperature=0.6),
    "llama": dict(temperature=0.6, top_p=0.9),
    "qwen3": dict(temperature=0.6, top_k=20, top_p=0.95),
    "min-p": dict(temperature=1.0, min_p=0.05),
    # penalties (csrc/include/kog/penalties.cuh) with the Llama generation config, and greedy with one
    "llama+penalties": dict(temperature=0.6, top_p=0.9, repetition_penalty=1.1, presence_penalty=1.5),
    "greedy+repetition": dict(temperature=0.0, repetition_penalty=1.1),
}
PENALTY_KEYS = ("repetition_penalty", "frequency_penalty", "presence_penalty")


def copy_bandwidth(dev, gib: float = 4.0, reps: int = 20) -> float:
    """GB/s of a device-to-device copy, counting bytes read plus written (median)."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    src.random_()
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(times) / 1e9


def time_steps(fn, reps: int, warmup: int = 5) -> float:
    """Median seconds of fn() over reps launches, each between its own pair of events."""
    for _ in range(warmup):
        fn()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in evs:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in evs) * 1e-3


def bench_shape(name: str, ctxs: list[int], reps: int, copy_gbs: float, dev, variants: bool,
                trace: bool = False, holds: tuple[tuple[int, int], ...] = (), single_ctx: int = 0,
                prefetch: tuple[int, ...] = (), stall_prefetch: tuple[int, ...] = (),
                inflight: tuple[int, ...] = (), sets: tuple[dict[str, int], ...] = (), tokens: int = 1,
                sampling: tuple[str, ...] = (), fp8: str | None = None, fp8_full_slots: bool = False) -> list[dict]:
    s = synthetic.make_shape(*synthetic.SHAPES[name], max_position=max(ctxs) + 64 + tokens)
    w = synthetic.random_decoder(s, dev, seed=1, fp8=fp8)
    max_ctx = max(ctxs)
    num_blocks = (max_ctx + tokens) // BS + 16
    caches = synthetic.paged_kv_caches(s, num_blocks, BS, dev)
    mk = Monokernel(w, caches, dev, max_model_len=max_ctx + 8 + tokens, fp8_full_slots=fp8_full_slots)
    wbytes = w.weight_bytes_per_token()  # FP8: one byte per projection weight plus its scales
    kv_row = s.kv_bytes_per_position
    rows = []
    bt = synthetic.shuffled_block_table(num_blocks, num_blocks - 1, num_blocks, dev, seed=3)
    synthetic.fill_context(caches, bt, max_ctx, s.head_dim, seed=4)
    ids = torch.tensor([42], device=dev)
    out = torch.empty(1, dtype=torch.int64, device=dev)

    def inputs(ctx):  # the step's position (ctx - 1) and its slot
        pos = ctx - 1
        return torch.tensor([pos], device=dev), torch.tensor([int(bt[pos // BS]) * BS + pos % BS], device=dev)

    def run(ctx, table=None):
        positions, slots = inputs(ctx)
        return lambda: mk.step(ids, positions, bt, slots, tokens_out=out, model_table=table)

    def burst(ctx):  # one launch of `tokens` tokens at positions ctx - 1 ... ctx + tokens - 2 (no stop id)
        positions, slots = inputs(ctx)
        return lambda: mk.generate(ids, positions, bt, slots, tokens)

    def sampled_burst(ctx, mode):  # (launch, tokens it computes): the same seed and inputs every launch
        positions, slots = inputs(ctx)
        f = dict(SAMPLING_MODES[mode])
        seed = torch.tensor([20261206], device=dev)
        defer = torch.zeros(1, dtype=torch.int32, device=dev)
        kw = dict(sample_seed=seed, **f)
        if any(k in f for k in ("top_k", "top_p", "min_p")):
            kw["defer_out"] = defer
        if any(k in f for k in PENALTY_KEYS):  # a request's PenaltiesState rows: a 200-id prompt, no outputs yet
            v = mk.logical_vocab
            mask = torch.zeros((v + 31) // 32, dtype=torch.int32, device=dev)
            mask[torch.randint(0, (v + 31) // 32, (200,), device=dev)] = 1 << 5
            kw.update(prompt_mask=mask, output_counts=torch.zeros(v, dtype=torch.int32, device=dev))
        launch = lambda: mk.generate(ids, positions, bt, slots, tokens, **kw)  # noqa: E731
        _, count = launch()
        return launch, int(count.item()) + int(defer.item())

    def record(variant, ctx, t, byt, weight_bytes):  # one table row; a wait that timed out is reported and reset
        rows.append(dict(shape=name, weights=weights_label(fp8), variant=variant, ctx=ctx, us=t * 1e6, gbs=byt / t / 1e9,
                         share=byt / t / 1e9 / copy_gbs, weight_gb=weight_bytes / 1e9,
                         floor_us=byt / (copy_gbs * 1e9) * 1e6))  # fmt: skip
        print(f"  .. {name} {variant} ctx {ctx}: {t * 1e6:.1f} us", flush=True)
        diag = mk.diagnostics()
        if diag:
            print(f"!! {name} {variant} ctx {ctx}: {diag}", flush=True)
            mk.reset_counters()

    for ctx in ctxs:
        record("full", ctx, time_steps(run(ctx), reps), wbytes + ctx * kv_row, wbytes)
        if tokens > 1:  # per token of a K-token launch, as vLLM's bursts run it (the mean context is ctx + (K - 1) / 2)
            record(f"K={tokens}, per token", ctx, time_steps(burst(ctx), reps) / tokens,
                   wbytes + (ctx + (tokens - 1) / 2) * kv_row, wbytes)
            for mode in sampling:
                launch, done = sampled_burst(ctx, mode)
                record(f"K={tokens} {mode}", ctx, time_steps(launch, reps) / done,
                       wbytes + (ctx + (done - 1) / 2) * kv_row, wbytes)
    if trace:
        table, tl = mk.trace_table()
        torch.cuda.synchronize()
        fn = run(ctxs[0], table)
        t_traced = time_steps(fn, reps)
        print(f"\ntimeline of one step, {name} ctx {ctxs[0]} (%globaltimer; {t_traced * 1e6:.1f} us/step with marks):")
        print(format_timeline(summarize(tl)), flush=True)
        if tokens > 1:  # the boundary between the tokens of a K-token launch
            table, tl = mk.trace_table(num_tokens=tokens)
            positions, slots = inputs(ctxs[0])
            time_steps(lambda: mk.generate(ids, positions, bt, slots, tokens, model_table=table), reps)
            print(f"\ntoken boundaries of a {tokens}-token launch, {name} ctx {ctxs[0]}:")
            print(format_boundaries(token_boundaries(tl)), flush=True)
    cases = {}
    if variants:
        p = mk.plan
        lm_bytes = lm_rows(s) * s.hidden_size * 2
        nu = p.stages[4].nu
        layer_bytes = (wbytes - lm_bytes) / s.num_layers
        cases = {
            "no LM head": (dict(stage_n=[*[q.n for q in p.stages[:4]], nu], stage_chunks=[*[q.chunks for q in p.stages[:4]], 1]), wbytes - lm_bytes),
            "half layers": (dict(num_layers=s.num_layers // 2), wbytes - layer_bytes * (s.num_layers - s.num_layers // 2)),
            "1 layer, no LM head": (dict(num_layers=1, stage_n=[*[q.n for q in p.stages[:4]], nu], stage_chunks=[*[q.chunks for q in p.stages[:4]], 1]), layer_bytes),
            "ring 2 slots": (dict(num_slots=2), wbytes),
            "L2 prefetch 6": (dict(prefetch_chunks=6), wbytes),
            "L2 prefetch 12": (dict(prefetch_chunks=12), wbytes),
        }  # fmt: skip
    for h, a in holds:  # ModelArgs::stage_end_copies / attn_end_copies: the loader's hold (handoff_hold.cuh)
        cases[f"hold {h}:{a}"] = (dict(stage_end_copies=h, attn_end_copies=a), wbytes)
    for n in prefetch:  # ModelArgs::prefetch_chunks: a constant lead of n chunks into L2 beyond the ring
        cases[f"L2 lead {n}"] = (dict(prefetch_chunks=n), wbytes)
    for n in stall_prefetch:  # ModelArgs::stall_prefetch_chunks: up to n chunks into L2 while waiting for a slot
        cases[f"L2 on stall {n}"] = (dict(stall_prefetch_chunks=n), wbytes)
    for n in inflight:  # ModelArgs::max_inflight: at most n bulk copies in flight per SM
        cases[f"{n} in flight"] = (dict(max_inflight=n), wbytes)
    for ov in sets:  # --set: any ModelArgs overrides together
        cases[",".join(f"{k}={v}" for k, v in ov.items())] = (dict(ov), wbytes)
    if single_ctx:  # ModelArgs::attn_single_ctx: one attention split per KV head up to this context
        cases[f"1 split <= ctx {single_ctx}"] = (dict(attn_single_ctx=single_ctx), wbytes)
        for h, a in holds:
            cases[f"1 split, hold {h}:{a}"] = (dict(attn_single_ctx=single_ctx, stage_end_copies=h, attn_end_copies=a), wbytes)  # fmt: skip
    if cases:
        ctx = ctxs[0]
        for vname, (ov, byt) in cases.items():
            table = mk.variant_table(**ov)
            torch.cuda.synchronize()
            mk.reset_counters()  # a variant with fewer layers leaves the other layers' counters behind the epoch
            byt += ctx * kv_row * (ov.get("num_layers", s.num_layers) / s.num_layers)
            record(vname, ctx, time_steps(run(ctx, table), reps), byt, byt)
    del mk, w, caches
    torch.cuda.empty_cache()
    return rows


def parse_holds(text: str) -> tuple[tuple[int, int], ...]:
    """"1:12,2" -> ((1, 12), (2, 2)): stage_end_copies:attn_end_copies pairs (one number sets both)."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        s, _, a = item.partition(":")
        out.append((int(s), int(a or s)))
    return tuple(out)


def parse_ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_sets(text: str) -> tuple[dict[str, int], ...]:
    """"a=1;a=1,b=3" -> ({"a": 1}, {"a": 1, "b": 3}): --set's variants of ModelArgs overrides."""
    return tuple({k: int(v) for k, v in (kv.split("=") for kv in item.split(","))} for item in text.split(";") if item)


def weights_label(fp8: str | None) -> str:
    """The weights column: bf16, or fp8-<layout>."""
    return f"fp8-{fp8}" if fp8 else "bf16"


def format_rows(rows: list[dict], copy_gbs: float) -> list[str]:
    """The table printed last."""
    out = [f"\ncopy bandwidth {copy_gbs:.0f} GB/s",
           f"{'shape':<14}{'weights':<12}{'variant':<24}{'ctx':>6}{'us/step':>10}{'floor us':>10}{'GB/s':>8}{'share':>8}"]
    for r in rows:
        out.append(f"{r['shape']:<14}{r.get('weights', 'bf16'):<12}{r['variant']:<24}{r['ctx']:>6}{r['us']:>10.1f}"
                   f"{r['floor_us']:>10.1f}{r['gbs']:>8.0f}{r['share']:>8.1%}")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1, help="also time K-token launches (Monokernel.generate, no stop "
                    "id) and report their time per token, beside the one-token steps")
    ap.add_argument("--shapes", default="llama-3.2-1b,qwen3-1.7b,llama-3.1-8b")
    ap.add_argument("--ctx", default="32,1024,4096")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--trace", action="store_true", help="print where a typical layer's time goes (first ctx)")
    ap.add_argument("--single-ctx", type=int, default=0, help="also time one attention split per KV head for "
                    "contexts up to this (ModelArgs::attn_single_ctx), alone and with each --hold pair")
    ap.add_argument("--hold", default="", help="comma-separated S:A pairs (stage_end_copies:attn_end_copies; 12 = no "
                    "hold) timed as variants of every shape at the first ctx, e.g. 1:12,12:1,1:1 (default: none)")
    ap.add_argument("--prefetch", default="", help="comma-separated constant L2 leads (chunks beyond the ring, "
                    "ModelArgs::prefetch_chunks) timed as variants of every shape at the first ctx")
    ap.add_argument("--stall-prefetch", default="", help="comma-separated chunk budgets of the L2 prefetch while the "
                    "loader waits for a slot (ModelArgs::stall_prefetch_chunks), timed likewise")
    ap.add_argument("--inflight", default="", help="comma-separated caps on the bulk copies in flight per SM "
                    "(ModelArgs::max_inflight), timed as variants of every shape at the first ctx")
    ap.add_argument("--set", default="", help="semicolon-separated variants, each comma-separated ModelArgs "
                    "overrides (e.g. 'stage_end_copies=3;stage_end_copies=3,max_inflight=3'), timed at the first ctx")
    ap.add_argument("--sampling", default="", help="with --tokens > 1: comma-separated SAMPLING_MODES ("
                    + ", ".join(SAMPLING_MODES) + ") whose sampled launches are timed too")
    ap.add_argument("--fp8", choices=("tensor", "channel", "block"), default=None, metavar="LAYOUT",
                    help="FP8 (e4m3) projections with tensor, channel or 128x128 block scales (fp32), quantised from "
                         "the same bf16 weights; bytes/step count the FP8 bytes read")
    ap.add_argument("--fp8-full-slots", action="store_true",
                    help="with --fp8: plan.make_plan's fp8_full_slots (slots of 32 KiB plus the scale tail, 32 KiB "
                         "FP8 chunks)")
    return ap


def main() -> int:
    ap = build_parser()
    args = ap.parse_args()
    sampling = tuple(m for m in args.sampling.split(",") if m)
    unknown = [m for m in sampling if m not in SAMPLING_MODES]
    if unknown:
        ap.error(f"--sampling: unknown mode(s) {unknown}; known: {list(SAMPLING_MODES)}")
    dev = torch.device("cuda", 0)
    ctxs = [int(x) for x in args.ctx.split(",")]
    copy_gbs = copy_bandwidth(dev)
    print(f"{torch.cuda.get_device_name(dev)}: device-to-device copy {copy_gbs:.0f} GB/s (read + write)", flush=True)
    if args.fp8:
        print(f"weights: FP8 e4m3 projections, {args.fp8} scales fp32 (synthetic.random_decoder fp8={args.fp8!r}); "
              "embedding, LM head, norms and KV bf16", flush=True)
    rows = []
    for name in args.shapes.split(","):
        shape_rows = bench_shape(name, ctxs, args.reps, copy_gbs, dev,
                                 variants=not args.no_variants and name == "llama-3.2-1b", trace=args.trace,
                                 holds=parse_holds(args.hold), single_ctx=args.single_ctx,
                                 prefetch=parse_ints(args.prefetch), stall_prefetch=parse_ints(args.stall_prefetch),
                                 inflight=parse_ints(args.inflight),
                                 sets=parse_sets(args.set), tokens=args.tokens, sampling=sampling, fp8=args.fp8,
                                 fp8_full_slots=args.fp8_full_slots)
        rows += shape_rows
        for r in shape_rows:
            print(f"  {r['shape']} {r['variant']} ctx {r['ctx']}: {r['us']:.1f} us", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_monokernel.json"), "w") as f:
            json.dump(dict(copy_gbs=copy_gbs, fp8=args.fp8, rows=rows), f, indent=1)
    print("\n".join(format_rows(rows, copy_gbs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
