"""Stock vLLM's GPU time per decode step at batch 1: the counterpart of bench_monokernel.py's us/step.

Random-weight checkpoints with the real shapes (written as `kog bench` writes them), vLLM's default engine
(torch.compile, CUDA graphs), no kog. The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that
torch.profiler's CUPTI trace sees its kernels, those replayed from CUDA graphs included. For each context c: a
prompt of c - 1 random token ids, then `generate` of 1 token (prefill only) and of 1 + N tokens (the same prefill
and N decode steps at contexts c .. c + N - 1), both under the profiler:

  GPU us/step  = (sum of kernel durations with N decode steps - sum with none) / N
                 (model, sampler and vLLM's small per-step kernels; idle time between kernels not counted)
  wall us/step = the same difference of the two calls' wall times (the engine's whole step, host included)
  GB/s         = bytes one step reads (weights + K/V of the context, kog_backend.tools.bench.model_bytes) / GPU time;
                 share = GB/s over the device-to-device copy bandwidth measured in this process before the engine
                 starts (kog_backend.tools.bench.copy_bw, bytes read + written, as in bench_monokernel.py)

    for s in llama-3.2-1b qwen3-1.7b llama-3.1-8b; do python3 benchmarks/bench_stock_step.py --shape $s; done

One shape per process, one process at a time: vLLM sizes its KV cache from the memory in use when the engine
starts, and engines started side by side on one GPU count each other's memory (on an H200, three at 0.2 / 0.2 /
0.3 of the memory: the third found none left for its cache). Prints a table last; writes JSON to
$OUT/bench_stock_step-<shape>.json when $OUT is set (schema "kog-stock-step/1": date, commit, GPU, versions, rows).
Figures on an H200: docs/monokernel.md (JSON in benchmarks/results/2026-12-04-stock-step-copy-bw-vllm-0.26.0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kog_backend.tools.bench import environment, metrics, model_bytes  # noqa: E402
from kog_backend.tools.bench.copy_bw import measure_copy_bandwidth  # noqa: E402
from kog_backend.tools.bench.offline import prompt_token_ids, resolve_model  # noqa: E402

SCHEMA = "kog-stock-step/1"


def kernel_us(prof) -> float:
    """Sum of the GPU durations (us) of every device event the profiler recorded (kernels, memcpy, memset)."""
    from torch.autograd import DeviceType

    return float(sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA))


def profiled(llm, prompt, sp) -> tuple[float, float, int]:
    """(kernel us, wall us, tokens generated) of one `generate` call under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        out = llm.generate([prompt], sampling_params=sp, use_tqdm=False)
        wall = (time.perf_counter() - t0) * 1e6
    return kernel_us(prof), wall, len(out[0].outputs[0].token_ids)


def measure_shape(name: str, ctxs: list[int], steps: int, reps: int, mem: float) -> list[dict]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: profiled
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # In a child process when missing: the GPU memory the weights are drawn with is not this engine's to count.
    model = resolve_model(name, log=lambda msg: print(msg, flush=True))
    path, name = model.path, model.label
    cfg = model_bytes.load_config(path)
    vocab = cfg["vocab_size"]
    weight_bytes, kv_row = model_bytes.weight_bytes_per_token(cfg), model_bytes.kv_bytes_per_position(cfg)
    copy_Bps = measure_copy_bandwidth()[0]  # before the engine: its buffers are freed when vLLM sizes memory
    print(f"  copy bandwidth {copy_Bps / 1e9:.0f} GB/s", flush=True)
    llm = LLM(model=path, seed=0, max_model_len=max(ctxs) + steps + 16, enable_prefix_caching=False,
              gpu_memory_utilization=mem, skip_tokenizer_init=True)  # fmt: skip
    rows = []
    for c in ctxs:
        prompt = TokensPrompt(prompt_token_ids=prompt_token_ids(vocab, c - 1))
        sp_one = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
        sp_full = SamplingParams(max_tokens=1 + steps, ignore_eos=True, temperature=0.0)
        llm.generate([prompt], sampling_params=sp_full, use_tqdm=False)  # warm-up (graphs, allocator)
        gpu, wall = [], []
        for _ in range(reps):
            k1, w1, _ = profiled(llm, prompt, sp_one)
            kn, wn, n = profiled(llm, prompt, sp_full)
            if n != 1 + steps:
                raise RuntimeError(f"{name} ctx {c}: generated {n} tokens, not {1 + steps}")
            gpu.append((kn - k1) / steps)
            wall.append((wn - w1) / steps)
        gpu_us = statistics.median(gpu)
        byt = weight_bytes + c * kv_row
        achieved = metrics.achieved_bytes_per_s(byt, 1e6 / gpu_us)  # one step per gpu_us
        row = dict(shape=name, ctx=c, steps=steps, reps=reps, gpu_us=gpu_us, wall_us=statistics.median(wall),
                   bytes=byt, gbs=achieved / 1e9, copy_gbs=copy_Bps / 1e9,
                   share=metrics.share_of_copy(achieved, copy_Bps), gpu_us_all=gpu, wall_us_all=wall)  # fmt: skip
        print(f"  {name} ctx {c}: GPU {row['gpu_us']:.1f} us/step, wall {row['wall_us']:.1f} us/step", flush=True)
        rows.append(row)
    return rows


def report(rows: list[dict]) -> dict:
    """The JSON written to $OUT: rows plus what the figures depend on (a dict with its own schema, so that
    render_performance.py, which reads every JSON under benchmarks/results/, skips it)."""
    return dict(schema=SCHEMA, date=environment.utc_now(), commit=environment.commit(),
                **environment.gpu_host_info(),  # gpu, torch, vllm, cuda, driver, ...: torch is already loaded here
                engine="vLLM defaults (torch.compile, CUDA graphs), in-process engine core", rows=rows)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-3.2-1b",
                    help="an embedded shape (kog_backend.tools.fixtures.shapes) or a checkpoint directory; one engine per process")
    ap.add_argument("--ctx", default="32,1024,4096")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per profiled call (N)")
    ap.add_argument("--reps", type=int, default=3, help="profiled pairs per context; the median is reported")
    ap.add_argument("--mem", type=float, default=0.8, help="gpu_memory_utilization of the engine")
    args = ap.parse_args()
    rows = measure_shape(args.shape, [int(x) for x in args.ctx.split(",")], args.steps, args.reps, args.mem)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"bench_stock_step-{rows[0]['shape']}.json"), "w") as f:
            json.dump(report(rows), f, indent=1)
    print(f"\n{'shape':<14}{'ctx':>6}{'GPU us/step':>13}{'GB/s':>7}{'% of copy':>11}{'wall us/step':>14}")
    for r in rows:
        print(f"{r['shape']:<14}{r['ctx']:>6}{r['gpu_us']:>13.1f}{r['gbs']:>7.0f}{100 * r['share']:>10.1f}%"
              f"{r['wall_us']:>14.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
