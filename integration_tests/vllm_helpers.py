"""Small helpers shared by the vLLM integration tests."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random

KOG_WORKER = "kog_backend.engine.worker.KogWorker"


def engine_kwargs(**over):
    kw = dict(
        enforce_eager=True,  # start-up in seconds; the kog path never uses vLLM's graphs anyway
        gpu_memory_utilization=0.30,
        max_model_len=4096,
        max_num_seqs=8,
        seed=0,
    )
    kw.update(over)
    return kw


def env_kog_options() -> dict:
    """KOG_TEST_KOG_OPTIONS, a JSON object: kog options every test engine gets unless its test sets them itself
    (e.g. '{"run_ahead": true}' runs a whole test file with run-ahead bursts)."""
    raw = os.environ.get("KOG_TEST_KOG_OPTIONS") or "{}"
    opts = json.loads(raw)
    if not isinstance(opts, dict):
        raise ValueError(f"KOG_TEST_KOG_OPTIONS must be a JSON object, got {raw!r}")
    return opts


def kog_option_args() -> list[str]:
    """KOG_TEST_KOG_OPTIONS as `vllm serve --kog-options` arguments (none when unset)."""
    opts = env_kog_options()
    return ["--kog-options", json.dumps(opts)] if opts else []


def kog_kwargs(kog_options=None, **over):
    kog = {**env_kog_options(), **(kog_options or {})}
    return engine_kwargs(worker_cls=KOG_WORKER, additional_config={"kog": kog}, **over)


def random_prompts(n: int, lengths, vocab: int, seed: int = 1234):
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(1000, vocab - 1000) for _ in range(lengths[i % len(lengths)])]} for i in range(n)]


def token_ids(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def first_mismatch(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def kog_stats(llm) -> dict:
    """Counters of the kog workers, summed over ranks."""
    per_rank = llm.collective_rpc("kog_stats")
    counts = ("kog_steps", "kog_tokens", "fallback_steps", "run_ahead_used", "run_ahead_abandoned")
    total = {**dict.fromkeys(counts, 0), "fallbacks": {}, "single_token_steps": {}, "disabled_reason": None}
    for s in per_rank:
        for k in counts:
            total[k] += s.get(k, 0)  # (a worker without kog's runner reports no run-ahead counts)
        for key in ("fallbacks", "single_token_steps"):
            for reason, n in s.get(key, {}).items():
                total[key][reason] = total[key].get(reason, 0) + n
        total["disabled_reason"] = total["disabled_reason"] or s["disabled_reason"]
    return total


def run_in_spawned_child(target, *args, timeout: float = 300.0):
    """target(queue, *args) in a spawned process; returns what it put on the queue. The child's GPU memory is
    returned when it exits (engines in one pytest process otherwise keep theirs)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(queue, *args))
    proc.start()
    return child_result(proc, queue, timeout)


def child_result(proc, queue, timeout: float):
    """What the child process `proc` put on `queue`, polled every 5 s so that a child that died without answering
    (an engine that failed to start) fails the test at once rather than after `timeout`; the child is then joined,
    and killed when still alive 60 s after."""
    import queue as queue_errors
    import time

    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return queue.get(timeout=5)
            except queue_errors.Empty:
                if proc.exitcode is not None:
                    try:  # (an answer put just before the child exited)
                        return queue.get(timeout=1)
                    except queue_errors.Empty:
                        raise RuntimeError(f"child process exited with code {proc.exitcode} without a result") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no result from the child process in {timeout:.0f} s") from None
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
