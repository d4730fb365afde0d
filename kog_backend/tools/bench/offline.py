"""`kog bench` offline mode: stock vLLM, then kog, each in its own process, same settings, one table.

The parent imports neither torch nor vLLM (it never holds GPU memory); each child
(`offline_child.py`) measures the copy bandwidth, starts one `vllm.LLM`, and times generate calls. The parent
turns the raw timings into figures (`finalize_row`), compares kog's greedy tokens with stock's, and writes
JSON, PNG and the table. Sampling: by default none is set, so each engine runs what vLLM gives a request that
sets none (the model's generation config; bench/sampling.py); the engines report the settings in force.
--also-greedy: each engine then times the same rounds greedy, reported as "<model> greedy" (bench/greedy_rounds.py).
--dummy-weights: config and tokenizer only, both engines with load_format="dummy" (bench/weights.py).
--fp8 LAYOUT: each shape's FP8 checkpoint, rows "<shape> fp8-<layout>"; --also-bf16 then kog on its bf16 checkpoint,
rows "<shape> bf16", and kog FP8 / kog bf16 under the table (bench/fp8.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from typing import Any

import kog_backend
from kog_backend.tools.bench import fp8 as bench_fp8
from kog_backend.tools.bench import greedy_rounds, metrics, model_bytes, sampling, weights
from kog_backend.tools.bench.results import IMPLS, BenchReport, ModelResult, RunResult

PROMPT_ID_LIMIT = 10000  # random prompt ids are drawn below this (as `vllm bench latency`) or the vocabulary
MAX_MODEL_LEN_SLACK = 256  # positions beyond prompt + new tokens (room for K tokens per step)
CHILD_MODULE = "kog_backend.tools.bench.offline_child"
EXIT_GRACE_S = 90.0  # after the child reports its result, time for vLLM's shutdown before the process group is ended


@dataclasses.dataclass
class Settings:
    models: list[str]
    prompt_len: int = 32
    new_tokens: int = 512
    tokens_per_step: int | None = None
    greedy: bool = False  # --greedy: temperature 0 (in sampling_overrides)
    sampling_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # fields over the generation config
    sampling_seed: int | None = None
    tp: int = 1
    reps: int = 3
    warmup: int = 1
    stat: str = "best"
    only: str | None = None  # "stock" | "kog"
    out: str = "kog-bench"
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    kog_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    timeout_s: float = 900.0
    verbose: bool = False
    commit: str | None = None
    seed: int = 0  # prompt token ids
    also_greedy: bool = False  # --also-greedy: each engine also times the same rounds greedy (greedy_rounds.py)
    dummy_weights: bool = False  # --dummy-weights: config + tokenizer only, load_format="dummy" (weights.py)
    fp8: str | None = None  # --fp8: each shape's FP8 checkpoint of this layout (bench/fp8.py)
    also_bf16: bool = False  # --also-bf16: kog on each --fp8 shape's bf16 checkpoint too

    def impls(self) -> list[str]:
        return [self.only] if self.only else list(IMPLS)

    def public(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("models", "out", "verbose", "commit", "timeout_s"):
            d.pop(k)
        for k in ("fp8", "also_bf16"):  # a bf16 run's settings as before these flags
            if not d[k]:
                d.pop(k)
        d["sampling"] = {"greedy": d.pop("greedy"), "overrides": d.pop("sampling_overrides"), "seed": d.pop("sampling_seed")}
        if self.dummy_weights:
            d["engine_args"] = self.engine_args_in_force()
            d["weights"] = weights.DUMMY_TEXT
        return d

    def engine_args_in_force(self) -> dict[str, Any]:
        """--engine-args, with load_format "dummy" for --dummy-weights (ValueError when they set another)."""
        return weights.dummy_engine_args(self.engine_args) if self.dummy_weights else dict(self.engine_args)


@dataclasses.dataclass
class ResolvedModel:
    label: str
    path: str
    shape: str | None


def resolve_model(name: str, create: bool = True, log=print, dummy: bool = False, fp8: str | None = None) -> ResolvedModel:
    """A checkpoint directory (with config.json), or an embedded shape name whose random-weight checkpoint
    is written to its default directory (`checkpoints.default_checkpoint_dir`, $KOG_CHECKPOINT_DIR) when
    missing; with dummy, a shape's config and tokenizer only (weights.write_dummy_dir). fp8: the shape's FP8
    checkpoint of that layout (`kog make-checkpoint --fp8`), or its FP8 config with dummy. ValueError for a shape
    whose checkpoint cannot be written (weights.checkpoint_refusal: too large, or dummy only)."""
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ValueError(f"{name} is a directory without config.json, not a checkpoint")
        return ResolvedModel(os.path.basename(os.path.normpath(name)), os.path.abspath(name), None)
    from kog_backend.tools.fixtures import shapes

    if name not in shapes.SHAPES:
        raise ValueError(f"{name!r} is neither a checkpoint directory nor an embedded shape ({', '.join(shapes.shape_names())})")
    from kog_backend.tools.fixtures import checkpoints

    if dummy:
        return ResolvedModel(name, weights.write_dummy_dir(name, log=log, fp8=fp8), name)
    path = checkpoints.default_checkpoint_dir(name, fp8=fp8)
    what = f"{name} FP8 {fp8}" if fp8 else name
    if not checkpoints.is_current(path, name, seed=0, fp8=fp8):
        if not create:
            raise ValueError(f"no current checkpoint for shape {what} at {path}")
        refusal = weights.checkpoint_refusal(name, path, fp8)
        if refusal:
            raise ValueError(refusal)
        if checkpoints.read_marker(path) is None:  # the marker is written last: no marker, no complete checkpoint
            log(f"writing the random-weight {what} checkpoint to {path} (once) ...")
        else:  # e.g. written before its generation config changed: write_checkpoint keeps the weights if it can
            log(f"bringing the {what} checkpoint at {path} up to date ...")
        # In a child process, so that the GPU memory it draws the weights with is released before the engines.
        code = ("from kog_backend.tools.fixtures.checkpoints import write_checkpoint; "
                f"write_checkpoint({name!r}, {path!r}, seed=0, fp8={fp8!r})")
        done = subprocess.run([sys.executable, "-c", code])
        if done.returncode != 0 or not checkpoints.is_current(path, name, seed=0, fp8=fp8):
            raise RuntimeError(f"writing the {what} checkpoint to {path} failed (status {done.returncode})")
    return ResolvedModel(name, path, name)


def prompt_token_ids(vocab_size: int, prompt_len: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    hi = min(vocab_size, PROMPT_ID_LIMIT)
    return [rng.randrange(hi) for _ in range(prompt_len)]


def max_model_len(cfg: dict[str, Any], s: Settings) -> int:
    """vLLM's max_model_len for both engines (positions): --engine-args' max_model_len when given, else prompt + new
    tokens + 1 + MAX_MODEL_LEN_SLACK rounded up to 16, capped at the model's max_position_embeddings. ValueError
    when the request does not fit."""
    need = s.prompt_len + s.new_tokens + 1
    given = (s.engine_args or {}).get("max_model_len")
    if given is not None:
        if need > int(given):
            raise ValueError(f"prompt {s.prompt_len} + {s.new_tokens} new tokens exceed --engine-args' max_model_len {given}")
        return int(given)
    want = -(-(need + MAX_MODEL_LEN_SLACK) // 16) * 16
    limit = int(cfg.get("max_position_embeddings") or want)
    if need > limit:
        raise ValueError(f"prompt {s.prompt_len} + {s.new_tokens} new tokens exceed the model's {limit} positions")
    return min(want, limit)


def max_model_len_note(cfg: dict[str, Any], s: Settings, n: int) -> str:
    """How max_model_len(cfg, s) == n was chosen, for the log and the header."""
    if (s.engine_args or {}).get("max_model_len") is not None:
        return "from --engine-args"
    limit = cfg.get("max_position_embeddings")
    capped = limit is not None and n == int(limit) and n < s.prompt_len + s.new_tokens + 1 + MAX_MODEL_LEN_SLACK
    how = (f"prompt {s.prompt_len} + {s.new_tokens} new tokens + 1 + {MAX_MODEL_LEN_SLACK} slack, rounded up to 16"
           if not capped else f"capped at the model's max_position_embeddings {limit}")
    return how + ("" if capped or limit is None else f"; the model has {limit} positions")


def finalize_row(row: RunResult, s: Settings, bytes_per_token: float | None) -> RunResult:
    """Figures from the raw timings (pure; see metrics.py for the formulas)."""
    if not row.ok:
        return row
    try:
        t_one = metrics.reduce_times(row.times_one_s, s.stat)
        t_full = metrics.reduce_times(row.times_full_s, s.stat)
        row.ms_per_token = metrics.ms_per_token(t_full, t_one, s.new_tokens)
    except ValueError as e:
        row.ok, row.error = False, f"timings unusable: {e}"
        return row
    row.tok_s = metrics.tok_per_s(row.ms_per_token)
    row.ttft_ms = t_one * 1e3
    if bytes_per_token:
        achieved = metrics.achieved_bytes_per_s(bytes_per_token, row.tok_s)
        row.gbps = achieved / 1e9
        if row.copy_gbps:
            row.bw_share = metrics.share_of_copy(achieved, row.copy_gbps * 1e9, s.tp)
            row.floor_tok_s = metrics.floor_tok_per_s(bytes_per_token, row.copy_gbps * 1e9, s.tp)
    if row.impl == "kog":
        _check_kog_counters(row, s)
    return row


def _check_kog_counters(row: RunResult, s: Settings) -> None:
    if not row.counters:
        row.warnings.append("no kog counters: cannot tell whether the kog path ran")
        return
    c = row.counters[0]  # every TP rank takes the same decisions
    decode_tokens = (s.warmup + s.reps) * s.new_tokens
    row.kog_token_share = int(c.get("kog_tokens", 0)) / decode_tokens if decode_tokens else None
    if int(c.get("kog_steps", 0)) <= 0:
        reasons = ", ".join(f"{k} x{v}" for k, v in (c.get("fallbacks") or {}).items()) or "none recorded"
        why = f"; kog disabled: {c['disabled_reason']}" if c.get("disabled_reason") else ""
        row.warnings.append(f"kog steps = 0: this row measured stock vLLM, not the kog path (fallbacks: {reasons}{why})")
    elif row.kog_token_share is not None and row.kog_token_share < 0.95:
        row.warnings.append(f"only {100 * row.kog_token_share:.0f}% of decoded tokens ran on the kog path")


def model_sampling(result: ModelResult) -> dict[str, Any] | None:
    """The sampling in force for a model, as its engines reported it; a warning on each row whose engine ran
    other settings than the first (stock and kog read the same checkpoint: they should never differ)."""
    reported = [r for r in result.rows if r.sampling]
    if not reported:
        return None
    first = reported[0].sampling
    for r in reported[1:]:
        if r.sampling != first:
            r.warnings.append(f"sampling in force {r.sampling} differs from the {reported[0].impl} engine's {first}")
    return first


def compare_tokens(stock: RunResult | None, kog: RunResult | None) -> tuple[bool | None, int | None]:
    if not (stock and kog and stock.ok and kog.ok and stock.output_token_ids and kog.output_token_ids):
        return None, None
    a, b = stock.output_token_ids, kog.output_token_ids
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return False, i
    if len(a) != len(b):
        return False, min(len(a), len(b))
    return True, None


def _progress_bar(desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=1, desc=desc, unit="step", leave=True, dynamic_ncols=True)


@dataclasses.dataclass
class ChildResult:
    """What one engine process reported."""

    row: RunResult  # the request's rounds
    host: dict[str, Any] = dataclasses.field(default_factory=dict)  # the machine (environment.gpu_host_info)
    greedy_row: RunResult | None = None  # spec["also_greedy"]: the same engine's greedy rounds


def run_child(spec: dict[str, Any], out_dir: str, tag: str, timeout_s: float, verbose: bool) -> ChildResult:
    """Runs one engine in `python -m kog_backend.tools.bench.offline_child`; its spec, result, log and kog counters
    go to out_dir/logs/. With spec["also_greedy"] the result always has a greedy_row (a failed one when the engine
    process reported none)."""
    out_dir = os.path.join(out_dir, "logs")
    os.makedirs(out_dir, exist_ok=True)
    spec_path = os.path.join(out_dir, f"{tag}.spec.json")
    res_path = os.path.join(out_dir, f"{tag}.result.json")
    log_path = os.path.join(out_dir, f"{tag}.log")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    if os.path.exists(res_path):
        os.remove(res_path)
    env = dict(os.environ)
    env["KOG_STATE_DIR"] = os.path.join(os.path.abspath(out_dir), f"state-{tag}")  # this engine's counters on disk
    env["PYTHONUNBUFFERED"] = "1"
    # The child imports kog_backend from where this process did, installed or not.
    root = os.path.dirname(os.path.dirname(os.path.abspath(kog_backend.__file__)))  # above the package
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    rfd, wfd = os.pipe()
    cmd = [sys.executable, "-m", CHILD_MODULE, spec_path, res_path, "--progress-fd", str(wfd)]
    bar = _progress_bar(tag)
    with open(log_path, "w") as log:
        out = None if verbose else log
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None, pass_fds=(wfd,), env=env, start_new_session=True)
        os.close(wfd)
        deadline = time.monotonic() + timeout_s
        buf = b""
        timed_out = False
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    timed_out = True
                    _stop(proc)
                    break
                ready, _, _ = select.select([rfd], [], [], 0.5)
                if ready:
                    chunk = os.read(rfd, 4096)
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        text = line.decode(errors="replace")
                        _on_progress(bar, text)
                        if text == "done":  # result written; an engine that hangs in shutdown gets EXIT_GRACE_S
                            deadline = min(deadline, time.monotonic() + EXIT_GRACE_S)
        except KeyboardInterrupt:
            _stop(proc)
            raise
        finally:
            os.close(rfd)
            if bar is not None:
                bar.close()
    host: dict[str, Any] = {}
    greedy_row = None
    if os.path.exists(res_path):
        with open(res_path) as f:
            data = json.load(f)
        row, host = RunResult.from_dict(data["row"]), data.get("host") or {}
        if data.get("greedy_row") is not None:
            greedy_row = RunResult.from_dict(data["greedy_row"])
        if timed_out:
            row.warnings.append(f"the engine process did not exit within {EXIT_GRACE_S:.0f} s of its result and was ended")
    else:
        why = f"timed out after {timeout_s:.0f} s" if timed_out else f"exited with status {proc.returncode} before writing a result"
        row = RunResult(impl=spec["impl"], ok=False, error=f"{tag} {why}")
    if spec.get("also_greedy") and greedy_row is None:
        greedy_row = RunResult(impl=spec["impl"], ok=False, error=f"{tag}: no greedy rounds ({row.error or 'none reported'})")
    failed = [r for r in (row, greedy_row) if r is not None and not r.ok]
    if failed and not verbose:
        print(f"--- {tag} failed; last lines of {log_path}:", file=sys.stderr)
        print(_tail(log_path, 25), file=sys.stderr)
    return ChildResult(row, host, greedy_row)


def _on_progress(bar: Any, line: str) -> None:
    if bar is None or not line:
        return
    kind, _, rest = line.partition(" ")
    if kind == "total":
        bar.total = int(rest)
        bar.refresh()
    elif kind == "step":
        bar.set_postfix_str(rest)
        bar.update(1)


def _stop(proc: subprocess.Popen) -> None:
    """Ends the child and the engine processes it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: str, n: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:]).rstrip()
    except OSError:
        return "(no log)"


def run_offline(s: Settings, log=print) -> BenchReport:
    from kog_backend import __version__
    from kog_backend.tools.bench import environment

    engine_args = s.engine_args_in_force()  # ValueError: --dummy-weights with another load_format
    os.makedirs(s.out, exist_ok=True)
    report = BenchReport(kind="offline", date=environment.utc_now(), commit=environment.commit(s.commit), kog_version=__version__)
    report.settings = s.public()
    report.host = {"vllm": environment.package_version("vllm"), "torch": environment.package_version("torch")}
    log(f"sampling: {sampling.request_text(report.settings['sampling'])}")
    if s.also_greedy:
        log("also greedy: each engine then times the same rounds at temperature 0 (rows \"<model> greedy\")")
    # Every model and its spec first, so that a bad name or length fails before any engine runs, and a checkpoint
    # that cannot be written before any is.
    runs = [(name, v) for name in s.models for v in bench_fp8.variants(s.fp8, s.also_bf16)]
    if not s.dummy_weights:
        _refuse_unwritable_checkpoints(runs)
    plans = []
    fp8_label = {}  # shape -> its FP8 model's label (--also-bf16's pairs)
    for name, v in runs:
        m = resolve_model(name, log=log, dummy=s.dummy_weights, fp8=v.fp8)
        cfg = model_bytes.load_config(m.path)
        result = ModelResult(model=m.label + v.label_suffix, path=m.path)
        if v.fp8 is not None:
            fp8_label[name] = result.model
        else:
            result.bf16_of = fp8_label.get(name)
        result.weight_format = bench_fp8.weight_format_text(cfg)
        result.weight_bytes_per_token = model_bytes.weight_bytes_per_token(cfg)
        result.kv_bytes_per_token = model_bytes.mean_kv_bytes_per_token(cfg, s.prompt_len, s.new_tokens)
        result.max_model_len = max_model_len(cfg, s)
        result.max_model_len_note = max_model_len_note(cfg, s, result.max_model_len)
        log(f"{result.model}: vLLM max_model_len {result.max_model_len} ({result.max_model_len_note})")
        spec_common = {
            "model_path": m.path,
            "prompt_token_ids": prompt_token_ids(int(cfg["vocab_size"]), s.prompt_len, s.seed),
            "max_model_len": result.max_model_len,
            "new_tokens": s.new_tokens,
            "sampling_overrides": s.sampling_overrides,
            "sampling_seed": s.sampling_seed,
            "tp": s.tp,
            "reps": s.reps,
            "warmup": s.warmup,
            "tokens_per_step": s.tokens_per_step,
            "kog_options": s.kog_options,
            "engine_args": engine_args,
            "also_greedy": s.also_greedy,
        }
        plans.append((v, result, spec_common))
    for v, result, spec_common in plans:
        greedy = greedy_rounds.greedy_model(result) if s.also_greedy else None
        if greedy is not None:
            greedy.weight_format = result.weight_format
            greedy.bf16_of = result.bf16_of and result.bf16_of + greedy_rounds.LABEL_SUFFIX
        for impl in (v.impls or s.impls()):
            tag = f"{_safe(result.model)}-{impl}"
            got = run_child({**spec_common, "impl": impl}, s.out, tag, s.timeout_s, s.verbose)
            if got.host:
                report.host.update(got.host)
            result.rows.append(finalize_row(got.row, s, result.bytes_per_token))
            if greedy is not None:
                g = got.greedy_row or RunResult(impl=impl, ok=False, error=f"{tag}: no greedy rounds reported")
                greedy.rows.append(finalize_row(g, s, result.bytes_per_token))
        conclude_model(result, s)
        report.models.append(result)
        if greedy is not None:
            conclude_model(greedy, s)
            result.sampled_kog_of_greedy = greedy_rounds.kog_of_greedy(result, greedy)
            report.models.append(greedy)
    bench_fp8.conclude_pairs(report)
    return report


def _refuse_unwritable_checkpoints(runs: list[tuple[str, bench_fp8.Variant]]) -> None:
    """ValueError naming --dummy-weights for the first (shape, checkpoint) whose checkpoint is missing and cannot be
    written."""
    from kog_backend.tools.fixtures import checkpoints, shapes

    for name, v in runs:
        if os.path.isdir(name) or name not in shapes.SHAPES:
            continue  # a directory is used as it is; resolve_model refuses a name that is neither
        path = checkpoints.default_checkpoint_dir(name, fp8=v.fp8)
        if not checkpoints.is_current(path, name, seed=0, fp8=v.fp8):
            refusal = weights.checkpoint_refusal(name, path, v.fp8)
            if refusal:
                raise ValueError(refusal)


def conclude_model(result: ModelResult, s: Settings) -> None:
    """Speedup, the sampling in force, and for greedy rows stock's tokens against kog's (not with dummy weights:
    their tokens mean nothing)."""
    stock, kog = result.row("stock"), result.row("kog")
    result.speedup = metrics.speedup(result.tok_s("kog"), result.tok_s("stock"))
    result.sampling = model_sampling(result)
    if result.sampling and sampling.is_greedy(result.sampling["params"]) and not s.dummy_weights:
        result.tokens_match, result.first_mismatch = compare_tokens(stock, kog)


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in label)
