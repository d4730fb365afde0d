"""`kog bench --also-greedy`: each engine, after its timed rounds with the request's sampling, times the same rounds
greedy (temperature 0, same prompt, same new tokens, same warm-up and reps) in the same process. One run then
reports the model's default sampling, stock and kog, and kog's greedy speed, without a third engine start.

Kog counters: the worker's kog_stats are cumulative over its process. The child takes them after the engine
start, after the sampled rounds and after the greedy rounds; each row gets the difference over its own rounds
(`counters_since`), so each row's counter checks (offline.finalize_row) count its own rounds only.

In the report the greedy rounds are a ModelResult of their own, labelled "<model> greedy" (`greedy_of` names the
sampled model), placed after it; `sampled_kog_of_greedy` on the sampled ModelResult is its kog tok/s over the
greedy kog tok/s. Stock's and kog's greedy tokens are compared as for a --greedy run.

Standard library only: the bench's parent process imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import Any, Mapping

from kog_backend.tools.bench import metrics, sampling
from kog_backend.tools.bench.results import BenchReport, ModelResult

LABEL_SUFFIX = " greedy"  # "<model> greedy" in the table and the JSON

# kog_stats fields that count since the worker started (kog_backend/path/counters.py StepCounters.snapshot)
CUMULATIVE = ("kog_steps", "kog_tokens", "fallback_steps", "run_ahead_used", "run_ahead_abandoned", "launch_aborts")
CUMULATIVE_BY_REASON = ("fallbacks", "single_token_steps")  # {reason: count since the worker started}


def greedy_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The bench's sampling fields for the greedy rounds: the request's, at temperature 0 (vLLM then ignores
    top-p, top-k and min-p; penalties given on the command line still apply)."""
    return {**(overrides or {}), "temperature": 0.0}


def counters_since(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """One worker's kog_stats for the rounds between two snapshots: the cumulative counts as differences; the rest
    as `after` has it (disabled_reason: kog stays off for the rest of the process once disabled, so it holds for
    these rounds too). A timeline equal to `before`'s was recorded by an earlier request and is dropped."""
    out = dict(after)
    for k in CUMULATIVE:
        if k in after:
            out[k] = int(after[k]) - int(before.get(k, 0))
    for k in CUMULATIVE_BY_REASON:
        if k in after:
            prev = before.get(k) or {}
            diff = {r: int(n) - int(prev.get(r, 0)) for r, n in (after[k] or {}).items()}
            out[k] = {r: n for r, n in diff.items() if n}
    if "timeline" in out and out["timeline"] == before.get("timeline"):
        del out["timeline"]
    return out


def split_counters(before: list[Mapping[str, Any]], after: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """counters_since for every worker (TP rank), matched by position as collective_rpc returns them."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} workers reported counters before the greedy rounds, {len(after)} after")
    return [counters_since(b, a) for b, a in zip(before, after)]


def greedy_model(sampled: ModelResult) -> ModelResult:
    """An empty ModelResult for the greedy rounds of `sampled`'s engines: same checkpoint, bytes per token and
    max_model_len."""
    return ModelResult(
        model=sampled.model + LABEL_SUFFIX,
        path=sampled.path,
        weight_bytes_per_token=sampled.weight_bytes_per_token,
        kv_bytes_per_token=sampled.kv_bytes_per_token,
        max_model_len=sampled.max_model_len,
        max_model_len_note=sampled.max_model_len_note,
        greedy_of=sampled.model,
    )


def kog_of_greedy(sampled: ModelResult, greedy: ModelResult) -> float | None:
    """Sampled kog tok/s / greedy kog tok/s (a fraction), None without both kog rows."""
    return metrics.speedup(sampled.tok_s("kog"), greedy.tok_s("kog"))


def sampled_models(report: BenchReport) -> list[ModelResult]:
    """The models of the request's own rounds (not the --also-greedy rounds)."""
    return [m for m in report.models if m.greedy_of is None]


def greedy_of(report: BenchReport, sampled: ModelResult) -> ModelResult | None:
    return next((m for m in report.models if m.greedy_of == sampled.model), None)


def header_line(report: BenchReport) -> str | None:
    """What the greedy rows are, for the header; None when the run has none."""
    greedy = [m for m in report.models if m.greedy_of is not None]
    if not greedy:
        return None
    params = next((m.sampling["params"] for m in greedy if m.sampling and m.sampling.get("params")), None)
    how = sampling.describe(params) if params is not None else "temperature 0"
    return (f"also greedy (--also-greedy): each engine then timed the same rounds again in the same process, "
            f"sampling: {how}; rows \"<model>{LABEL_SUFFIX}\", with the kog counters of those rounds only")


def ratio_lines(report: BenchReport) -> list[str]:
    """Per model: the sampled kog row as a percentage of the same engine's greedy kog row."""
    out = []
    for m in sampled_models(report):
        g = greedy_of(report, m)
        if g is None or (m.row("kog") is None and g.row("kog") is None):  # none, or --only stock
            continue
        value = None if m.sampled_kog_of_greedy is None else f"{100 * m.sampled_kog_of_greedy:.1f}%"
        out.append(metrics.ratio_line(f"sampled kog / greedy kog, {m.model}", value, m.tok_s("kog"), g.tok_s("kog"),
                                      "same engine process"))
    return out
