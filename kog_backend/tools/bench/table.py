"""The text table `kog bench` prints (gpt-fast style: tok/s next to the bandwidth it implies).

--also-greedy runs add a "<model> greedy" block per model and, under the table, the sampled kog row as a
percentage of the greedy kog row (bench/greedy_rounds.py); --dummy-weights runs say so in the header. A run with
FP8 weights names every model's weight format in the header; --also-bf16 adds kog FP8 / kog bf16 under the table
(bench/fp8.py).
"""

from __future__ import annotations

import json

from kog_backend.tools.bench import fp8 as bench_fp8
from kog_backend.tools.bench import greedy_rounds, sampling
from kog_backend.tools.bench.results import BenchReport, ModelResult, RunResult


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _kog_steps(r: RunResult) -> str:
    if r.counters is None:
        return "-"
    return str(max((int(c.get("kog_steps", 0)) for c in r.counters), default=0))  # ranks count the same steps


def _timelines(r: RunResult) -> list[str]:
    """The last request's step timeline of each rank (kog option step_timeline; kog_backend/path/step_timeline.py)."""
    out = []
    for c in r.counters or ():
        t = c.get("timeline")
        if t:
            parts = ", ".join(f"{k} {t[k]:.3f}" for k in ("period", "in_runner", "kernel", "gpu_gap") if k in t)
            out.append(f"step timeline, medians over {int(t.get('launches', 0))} launches, ms: {parts}")
    return out


def header_lines(report: BenchReport) -> list[str]:
    h, s = report.host, report.settings
    lines = [
        f"kog bench ({report.kind})  {report.date}  commit {report.commit}  kog {report.kog_version}",
    ]
    if h:
        gpu = f"{h['gpu']} x{h.get('gpu_count', '?')}  driver {h.get('driver') or '?'}" if h.get("gpu") else "none seen"
        lines.append(f"GPU: {gpu}  torch {h.get('torch', '?')}  vLLM {h.get('vllm', '?')}")
    if report.kind == "offline":
        k = s.get("tokens_per_step")
        lines.append(
            f"batch 1, prompt {s.get('prompt_len')} random token ids, {s.get('new_tokens')} new tokens (ignore_eos), "
            f"TP {s.get('tp')}, K={k if k else 'default'}, {s.get('stat')} of {s.get('reps')} reps "
            f"after {s.get('warmup')} warm-up"
        )
        lines += sampling.header_lines(s, [(m.model, m.sampling) for m in greedy_rounds.sampled_models(report)], http=False)
        also = greedy_rounds.header_line(report)
        if also:
            lines.append(also)
        if s.get("weights"):
            lines.append(f"weights: {s['weights']}")
        lines += bench_fp8.header_lines(report)
        for m in greedy_rounds.sampled_models(report):
            if m.max_model_len is not None:
                lines.append(f"{m.model}: vLLM max_model_len {m.max_model_len} ({m.max_model_len_note or '?'})")
        if s.get("engine_args"):
            lines.append(f"engine arguments on both sides: {json.dumps(s['engine_args'], sort_keys=True)}")
        if s.get("kog_options"):
            lines.append(f"kog options: {json.dumps(s['kog_options'], sort_keys=True)}")
    else:
        lines.append(
            f"streaming /v1/completions, one request at a time, prompt {s.get('prompt_len')} token ids, "
            f"{s.get('new_tokens')} new tokens, {s.get('requests')} requests per server"
        )
        lines += sampling.header_lines(s, [], http=True)
    return lines


def format_table(report: BenchReport) -> str:
    if report.kind == "http":
        return _format_http(report)
    cols = ["model", "path", "tok/s", "ms/token", "TTFT ms", "GB/s", "copy GB/s", "% of copy BW", "floor tok/s", "kog steps", "speedup"]
    rows: list[list[str]] = []
    notes: list[str] = []
    for m in report.models:
        for r in m.rows:
            speed = f"{m.speedup:.2f}x" if (r.impl == "kog" and m.speedup is not None) else ""
            if not r.ok:
                rows.append([m.model, r.impl, "FAILED", "", "", "", "", "", "", "", ""])
                notes.append(f"{m.model} {r.impl}: {r.error}")
                continue
            rows.append(
                [
                    m.model,
                    r.impl,
                    _f(r.tok_s, ".1f"),
                    _f(r.ms_per_token, ".3f"),
                    _f(r.ttft_ms, ".1f"),
                    _f(r.gbps, ".0f"),
                    _f(r.copy_gbps, ".0f"),
                    "-" if r.bw_share is None else f"{100 * r.bw_share:.1f}%",
                    _f(r.floor_tok_s, ".0f"),
                    _kog_steps(r),
                    speed,
                ]
            )
            notes.extend(f"{m.model} {r.impl}: {w}" for w in r.warnings)
            notes.extend(f"{m.model} {r.impl}: {t}" for t in _timelines(r))
        if m.tokens_match is None and report.settings.get("dummy_weights") and m.sampling \
                and sampling.is_greedy(m.sampling.get("params") or {}):
            notes.append(f"{m.model}: greedy tokens not compared: vLLM dummy weights make them meaningless")
        if m.tokens_match is False and bench_fp8.is_fp8(m):
            notes.append(
                f"{m.model}: kog's greedy tokens differ from stock's from position {m.first_mismatch} (stock "
                "quantises the activations to FP8 as well, kog keeps them bf16: the first near-tie flips; "
                "integration_tests/test_teacher_forcing.py with KOG_TF_FP8 checks the logits)"
            )
        elif m.tokens_match is False:
            notes.append(
                f"{m.model}: kog's greedy tokens differ from stock's from position {m.first_mismatch} (kog rounds "
                "to bf16 in its own order; a near-tie between the top two logits then flips, and random weights "
                "have many: integration_tests/test_teacher_forcing.py checks the logits themselves)"
            )
    ratios = greedy_rounds.ratio_lines(report) + bench_fp8.ratio_lines(report)
    return "\n".join(header_lines(report) + [""] + _grid(cols, rows) + ([""] + ratios if ratios else [])
                     + [f"! {n}" for n in notes])


def _format_http(report: BenchReport) -> str:
    cols = ["server", "model", "requests", "tok/s (decode)", "tok/s (end to end)", "ms/token", "TTFT ms", "max gap ms", "speedup"]
    rows = []
    notes = []
    base: RunResult | None = None
    for m in report.models:
        for r in m.rows:
            if not r.ok:
                rows.append([r.impl, m.model, "FAILED", "", "", "", "", "", ""])
                notes.append(f"{r.impl} ({m.path}): {r.error}")
                continue
            e2e = sorted(q["e2e_tok_s"] for q in r.requests if q.get("e2e_tok_s"))
            gaps = [q["max_gap_ms"] for q in r.requests if q.get("max_gap_ms") is not None]
            if base is None:
                base, sp = r, ""
            else:
                sp = "-" if not (r.tok_s and base.tok_s) else f"{r.tok_s / base.tok_s:.2f}x vs {base.impl}"
            rows.append(
                [
                    r.impl,
                    m.model,
                    str(len(r.requests)),
                    _f(r.tok_s, ".1f"),
                    _f(e2e[len(e2e) // 2] if e2e else None, ".1f"),
                    _f(r.ms_per_token, ".3f"),
                    _f(r.ttft_ms, ".1f"),
                    _f(max(gaps) if gaps else None, ".1f"),
                    sp,
                ]
            )
            notes.extend(f"{r.impl}: {w}" for w in r.warnings)
    return "\n".join(header_lines(report) + [""] + _grid(cols, rows) + [f"! {n}" for n in notes])


def _grid(cols: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(cols), line(["-" * w for w in widths])] + [line(r) for r in rows]


def markdown_table(m: ModelResult) -> str:
    """One model's rows as a markdown table (docs/performance.md)."""
    out = ["| path | tok/s | ms/token | TTFT ms | GB/s | % of copy BW | kog steps | speedup |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in m.rows:
        if not r.ok:
            out.append(f"| {r.impl} | failed: {r.error} | | | | | | |")
            continue
        share = "-" if r.bw_share is None else f"{100 * r.bw_share:.1f}%"
        sp = f"{m.speedup:.2f}x" if r.impl == "kog" and m.speedup is not None else ""
        out.append(
            f"| {r.impl} | {_f(r.tok_s, '.1f')} | {_f(r.ms_per_token, '.3f')} | {_f(r.ttft_ms, '.1f')} | "
            f"{_f(r.gbps, '.0f')} | {share} | {_kog_steps(r)} | {sp} |"
        )
    return "\n".join(out)
