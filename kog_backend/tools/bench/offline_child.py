"""One side of the A/B in its own process: `python -m kog_backend.tools.bench.offline_child SPEC RESULT [--progress-fd N]`.

SPEC is a JSON file written by `offline.py` (engine, model, prompt token ids, sampling, reps); RESULT receives
`{"row": RunResult fields (raw timings only), "host": {...}}`, and with spec["also_greedy"] a "greedy_row" of the
same form. The parent derives every figure from the raw timings. Progress goes to the pipe `--progress-fd` as
lines `total N` / `step LABEL`.

Order: copy bandwidth (before vLLM takes the GPU memory), engine start, the kog counters, `warmup` rounds, `reps`
timed rounds, the kog counters again (the row gets the difference: its rounds' steps, not the engine start's); with
spec["also_greedy"] then `warmup` + `reps` greedy rounds and the counters again (bench/greedy_rounds.py: the greedy
row gets the difference too). A round is one 1-token generate call then one
(new_tokens + 1)-token call, each timed with perf_counter around `LLM.generate`, the prompt the same random token
ids for both engines. Sampling: what vLLM gives a request that sets nothing (the model's generation config), with
the bench's explicit fields over it (bench/sampling.py); the greedy rounds set temperature 0 over that.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any

from kog_backend.tools.bench.sampling import FIELDS
from kog_backend.config import CONFIG_KEY, SCHEDULER_CLS, WORKER_CLS, KogConfig


class Progress:
    def __init__(self, fd: int | None):
        self._f = os.fdopen(fd, "w", buffering=1) if fd is not None else None

    def send(self, line: str) -> None:
        if self._f is not None:
            try:
                self._f.write(line + "\n")
            except OSError:  # the parent went away; the measurement goes on
                self._f = None


def engine_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """`vllm.LLM(**kwargs)` for this side: identical for stock and kog except worker_cls and additional_config."""
    kw: dict[str, Any] = {
        "model": spec["model_path"],
        "tensor_parallel_size": spec["tp"],
        "seed": 0,
        "max_model_len": spec["max_model_len"],
        "enable_prefix_caching": False,  # as `vllm bench latency`: every round prefills the prompt
        "gpu_memory_utilization": 0.80,
    }
    kw.update(spec.get("engine_args") or {})
    if spec["impl"] == "kog":
        kog = dict(spec.get("kog_options") or {})
        if spec.get("tokens_per_step"):
            kog["tokens_per_step"] = spec["tokens_per_step"]
        additional = dict(kw.pop("additional_config", None) or {})
        additional[CONFIG_KEY] = {**additional.get(CONFIG_KEY, {}), **kog}
        kw["worker_cls"] = WORKER_CLS
        kw["additional_config"] = additional
        # What `--backend kog` sets (kog_backend/engine/scheduler.py); async scheduling as vLLM's default.
        kw.setdefault("scheduler_cls", SCHEDULER_CLS)
    return kw


def default_sampling(llm: Any) -> dict[str, Any]:
    """The sampling fields of the SamplingParams vLLM gives a request that sets none: the model's generation
    config as vLLM applies it (`LLM.get_default_sampling_params()`, from `ModelConfig.get_diff_sampling_param()`)."""
    sp = llm.get_default_sampling_params()
    return {k: getattr(sp, k) for k in FIELDS}


def sampling_kwargs(spec: dict[str, Any], max_tokens: int, defaults: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams(**kw) of a timed call: vLLM's defaults for the model, the bench's explicit fields over
    them (spec["sampling_overrides"]: flags given, or temperature 0 for --greedy), max_tokens, ignore_eos."""
    kw = {**defaults, **(spec.get("sampling_overrides") or {}), "max_tokens": max_tokens, "ignore_eos": True}
    if spec.get("sampling_seed") is not None:
        kw["seed"] = spec["sampling_seed"]
    return kw


def sampling_record(sp: Any, llm: Any) -> dict[str, Any]:
    """What the JSON records of the sampling in force: the fields of the SamplingParams used (after vLLM's own
    normalisation: greedy resets top-p, top-k and min-p), its seed, and the model's generation config as vLLM
    reads it."""
    return {
        "params": {k: getattr(sp, k) for k in FIELDS},
        "seed": sp.seed,
        "generation_config": dict(llm.model_config.get_diff_sampling_param()),
    }


def measure(spec: dict[str, Any], progress: Progress, host: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the row of the request's rounds, the row of the greedy rounds or None without spec["also_greedy"]).
    Fills `host` first, so a failure later still reports the machine."""
    row: dict[str, Any] = {"impl": spec["impl"], "ok": False, "warnings": []}
    rounds = spec["warmup"] + spec["reps"]
    progress.send(f"total {2 + rounds * (2 if spec.get('also_greedy') else 1)}")

    from kog_backend.tools.bench.environment import gpu_host_info

    host.update(gpu_host_info())
    if not host.get("gpu_count"):
        raise RuntimeError("no CUDA GPU visible to torch")
    if spec.get("measure_copy", True):
        from kog_backend.tools.bench.copy_bw import measure_copy_bandwidth

        copy_Bps, copy_times = measure_copy_bandwidth()
        row["copy_gbps"] = copy_Bps / 1e9
        row["copy_times_s"] = copy_times
    progress.send("step copy bandwidth")

    from vllm import LLM
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(spec))
    row["load_s"] = time.perf_counter() - t0
    progress.send("step engine up")

    prompt = TokensPrompt(prompt_token_ids=list(spec["prompt_token_ids"]))
    defaults = default_sampling(llm)
    kog = spec["impl"] == "kog"
    start = kog_counters(llm, row["warnings"]) if kog else None  # the engine start's own steps (profiling runs)
    time_rounds(llm, prompt, spec, defaults, row, progress, label="")
    after = kog_counters(llm, row["warnings"]) if kog else None
    if kog:
        row["counters"] = rounds_counters(start, after, row["warnings"], "the rounds")
    row["ok"] = True
    if not spec.get("also_greedy"):
        return row, None
    return row, measure_greedy(llm, prompt, spec, defaults, row, progress, after)


def time_rounds(llm: Any, prompt: Any, spec: dict[str, Any], defaults: dict[str, Any], row: dict[str, Any],
                progress: Progress, label: str) -> None:
    """`warmup` untimed then `reps` timed rounds with spec's sampling; their times (s), the last (N+1)-token call's
    tokens and the sampling in force go into `row`. label prefixes the progress steps ("greedy ")."""
    from vllm import SamplingParams

    n = spec["new_tokens"]
    sp_one = SamplingParams(**sampling_kwargs(spec, 1, defaults))
    sp_full = SamplingParams(**sampling_kwargs(spec, n + 1, defaults))
    row["sampling"] = sampling_record(sp_full, llm)

    def timed(sp: Any) -> tuple[float, Any]:
        start = time.perf_counter()
        out = llm.generate([prompt], sampling_params=sp, use_tqdm=False)
        return time.perf_counter() - start, out

    times_one, times_full = [], []
    last = None
    for i in range(spec["warmup"] + spec["reps"]):
        t1, _ = timed(sp_one)
        tn, last = timed(sp_full)
        if i >= spec["warmup"]:
            times_one.append(t1)
            times_full.append(tn)
            progress.send(f"step {label}rep {i - spec['warmup'] + 1}")
        else:
            progress.send(f"step {label}warm-up {i + 1}")
    row["times_one_s"] = times_one
    row["times_full_s"] = times_full
    ids = list(last[0].outputs[0].token_ids)
    row["generated_tokens"] = len(ids)
    row["output_token_ids"] = ids
    if len(ids) != n + 1:
        row["warnings"].append(f"the timed call returned {len(ids)} tokens, not {n + 1}")


def kog_counters(llm: Any, warnings: list[str]) -> list[dict[str, Any]] | None:
    """The kog workers' cumulative counters (one dict per TP rank); None, with a warning, when the RPC fails."""
    try:
        return [dict(s) for s in llm.collective_rpc("kog_stats")]
    except Exception as e:  # an older or broken worker: the row still has its timings
        warnings.append(f"kog_stats RPC failed: {type(e).__name__}: {e}")
        return None


def rounds_counters(before: list[dict[str, Any]] | None, after: list[dict[str, Any]] | None, warnings: list[str],
                    what: str) -> list[dict[str, Any]] | None:
    """The kog counters of the calls between two kog_stats snapshots (greedy_rounds.split_counters); the cumulative
    ones, with a warning, when the first snapshot failed."""
    from kog_backend.tools.bench.greedy_rounds import split_counters

    if after is not None and before is not None:
        return split_counters(before, after)
    if after is not None:
        warnings.append(f"no kog counters before {what}: these count since the engine started")
    return after


def measure_greedy(llm: Any, prompt: Any, spec: dict[str, Any], defaults: dict[str, Any], sampled: dict[str, Any],
                   progress: Progress, before: list[dict[str, Any]] | None) -> dict[str, Any]:
    """--also-greedy: the same rounds at temperature 0 in this engine; the copy bandwidth and engine start are the
    sampled row's (same process); kog counters: those of these rounds only (`before`: the cumulative counters after
    the sampled rounds). A failure here fails this row only."""
    from kog_backend.tools.bench.greedy_rounds import greedy_overrides

    row: dict[str, Any] = {"impl": spec["impl"], "ok": False, "warnings": []}
    for k in ("copy_gbps", "copy_times_s", "load_s"):
        if k in sampled:
            row[k] = sampled[k]
    greedy_spec = {**spec, "sampling_overrides": greedy_overrides(spec.get("sampling_overrides"))}
    try:
        time_rounds(llm, prompt, greedy_spec, defaults, row, progress, label="greedy ")
        if spec["impl"] == "kog":
            row["counters"] = rounds_counters(before, kog_counters(llm, row["warnings"]), row["warnings"],
                                              "the greedy rounds")
    except Exception as e:  # noqa: BLE001 - the sampled row stands; this one reports why it has no figures
        traceback.print_exc()
        row["error"] = f"greedy rounds: {type(e).__name__}: {e}".strip()[:2000]
        return row
    row["ok"] = True
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("result")
    ap.add_argument("--progress-fd", type=int, default=None)
    args = ap.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    progress = Progress(args.progress_fd)
    host: dict[str, Any] = {}
    greedy_row = None
    try:
        row, greedy_row = measure(spec, progress, host)
        code = 0
    except BaseException as e:  # noqa: BLE001 - report every failure to the parent, then exit non-zero
        traceback.print_exc()
        row = {"impl": spec["impl"], "ok": False, "error": f"{type(e).__name__}: {e}".strip()[:2000], "warnings": []}
        code = 1
    result: dict[str, Any] = {"row": row, "host": host}
    if greedy_row is not None:
        result["greedy_row"] = greedy_row
    with open(args.result, "w") as f:
        json.dump(result, f)
    progress.send("done")
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's engine processes are shut down by its atexit hooks; exit through them.
    return code


if __name__ == "__main__":
    sys.exit(main())
