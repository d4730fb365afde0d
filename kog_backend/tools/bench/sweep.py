"""`kog bench --prompt-lens 2000,8000,...`: the offline A/B (stock, then kog) at each prompt length, one JSON, one
table and one chart (sweep_chart.py) of tok/s and % of copy bandwidth against context length.

Each length is a whole offline run (offline.run_offline) with its own vLLM max_model_len (offline.max_model_len:
prompt + new tokens + slack, capped at the model's max_position_embeddings); its bench.json and engine logs go to
OUT/prompt-N/. A (model, length) pair whose request does not fit the model's positions is skipped and listed. A
length already measured in OUT with the same models and settings is reused (run_sweep), so a long sweep can be
measured a few lengths per invocation and assembled by a last invocation over every length.
Bytes per token: weights + the mean KV bytes of the decode steps (model_bytes.mean_kv_bytes_per_token), so the
share of copy bandwidth counts the KV stream that grows with the context.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from kog_backend.tools.bench.results import BenchReport, ModelResult, _known

SWEEP_SCHEMA = "kog-bench-sweep/1"


def parse_prompt_lens(text: str) -> list[int]:
    """'2000,8000,16k' -> [2000, 8000, 16000] (k = 1000), each positive, duplicates dropped, in the order given.
    ValueError on anything else."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1000 if part.endswith("k") else 1
        digits = part[:-1] if mult > 1 else part
        if not digits.isdigit() or int(digits) <= 0:
            raise ValueError(f"prompt length {part!r} is not a positive integer")
        n = int(digits) * mult
        if n not in out:
            out.append(n)
    if not out:
        raise ValueError("no prompt length given")
    return out


@dataclasses.dataclass
class Skipped:
    model: str
    prompt_len: int
    reason: str


@dataclasses.dataclass
class SweepReport:
    prompt_lens: list[int] = dataclasses.field(default_factory=list)
    points: list[BenchReport] = dataclasses.field(default_factory=list)  # one offline run per length that ran
    skipped: list[Skipped] = dataclasses.field(default_factory=list)
    schema: str = SWEEP_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "prompt_lens": self.prompt_lens, "points": [p.to_dict() for p in self.points],
                "skipped": [dataclasses.asdict(x) for x in self.skipped]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepReport":
        if not isinstance(d, dict) or d.get("schema") != SWEEP_SCHEMA:
            raise ValueError(f"not a {SWEEP_SCHEMA} file")
        return cls(prompt_lens=list(d.get("prompt_lens", [])),
                   points=[BenchReport.from_dict(p) for p in d.get("points", [])],
                   skipped=[Skipped(**_known(Skipped, x)) for x in d.get("skipped", [])])

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> "SweepReport":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def by_model(self) -> dict[str, list[tuple[int, ModelResult]]]:
        """model label -> [(prompt length, its result at that length)], lengths ascending."""
        out: dict[str, list[tuple[int, ModelResult]]] = {}
        for p in self.points:
            for m in p.models:
                out.setdefault(m.model, []).append((int(p.settings.get("prompt_len", 0)), m))
        return {k: sorted(v, key=lambda t: t[0]) for k, v in out.items()}


def _model_config(name: str) -> tuple[str, dict[str, Any]]:
    """(label, config.json) of a checkpoint directory or an embedded shape, without writing any checkpoint (the
    offline run writes a shape's checkpoint when it first needs it)."""
    from kog_backend.tools.bench import model_bytes
    from kog_backend.tools.fixtures import shapes

    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ValueError(f"{name} is a directory without config.json, not a checkpoint")
        return os.path.basename(os.path.normpath(name)), model_bytes.load_config(name)
    if name not in shapes.SHAPES:
        raise ValueError(f"{name!r} is neither a checkpoint directory nor an embedded shape ({', '.join(shapes.shape_names())})")
    return name, shapes.get_shape(name)


def _comparable(settings: dict[str, Any]) -> str:
    """A run's settings without its prompt length, as JSON (what two lengths of one sweep share)."""
    return json.dumps({k: v for k, v in settings.items() if k != "prompt_len"}, sort_keys=True, default=str)


def reusable_point(path: str, settings: dict[str, Any], labels: list[str], commit: str) -> BenchReport | None:
    """The earlier run at `path` (a prompt-N/bench.json) when it measured these models (labels: with --also-greedy
    their "<model> greedy" rows too) at this commit with these settings (the prompt length aside) and every row of it
    succeeded, else None: a point with a failed engine is measured again."""
    try:
        point = BenchReport.load(path)
    except (OSError, ValueError):
        return None
    if point.commit != commit or _comparable(point.settings) != _comparable(settings):
        return None
    if sorted(m.model for m in point.models) != sorted(labels):
        return None
    return point if all(r.ok for m in point.models for r in m.rows) else None


def run_sweep(s: Any, prompt_lens: list[int], log=print) -> SweepReport:
    """s: offline.Settings (its prompt_len is ignored). Every (model, length) is checked before any engine runs.
    A length whose OUT/prompt-N/bench.json holds an earlier run of the same models with the same settings is
    reused, not measured again: a sweep too long for one sitting runs as several invocations over subsets of the
    lengths, and a last one over all of them assembles the table and chart."""
    from kog_backend.tools.bench import environment, fp8, greedy_rounds, offline

    commit = environment.commit(s.commit)
    models = [(name, *_model_config(name)) for name in s.models]
    plan: list[tuple[int, list[str], list[str]]] = []
    report = SweepReport(prompt_lens=list(prompt_lens))
    for n in prompt_lens:
        names, labels = [], []
        for name, label, cfg in models:
            try:
                offline.max_model_len(cfg, dataclasses.replace(s, prompt_len=n))
                names.append(name)
                measured = [label + v.label_suffix for v in fp8.variants(s.fp8, s.also_bf16)]  # --fp8, --also-bf16
                labels += measured
                if s.also_greedy:  # each model's greedy rounds are a ModelResult of their own (greedy_rounds.py)
                    labels += [m + greedy_rounds.LABEL_SUFFIX for m in measured]
            except ValueError as e:
                report.skipped.append(Skipped(label, n, str(e)))
                log(f"skipping {label} at prompt {n}: {e}")
        if names:
            plan.append((n, names, labels))
    if not plan:
        raise ValueError("no prompt length fits any model: " + "; ".join(x.reason for x in report.skipped))
    for n, names, labels in plan:
        at = dataclasses.replace(s, prompt_len=n, models=names, out=os.path.join(s.out, f"prompt-{n}"))
        path = os.path.join(at.out, "bench.json")
        point = reusable_point(path, at.public(), labels, commit)
        if point is not None:
            log(f"--- prompt {n} tokens: reusing {path} ({point.date}) ---")
        else:
            log(f"--- prompt {n} tokens ---")
            point = offline.run_offline(at, log=log)
            point.save(path)
        report.points.append(point)
    return report


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_sweep_table(report: SweepReport) -> str:
    """One row per (model, prompt length): stock and kog side by side; --also-greedy's "<model> greedy" rows as a
    model of their own, and the sampled kog row as a percentage of the greedy one under the table."""
    from kog_backend.tools.bench.table import _grid, _kog_steps, header_lines

    cols = ["model", "prompt", "max_model_len", "MB/token", "stock tok/s", "kog tok/s", "kog/stock", "stock ms/tok",
            "kog ms/tok", "stock % copy BW", "kog % copy BW", "kog steps"]
    rows, notes, ratios = [], [], []
    for model, results in report.by_model().items():
        for n, m in results:
            st, kg = m.row("stock"), m.row("kog")
            ok = lambda r: r is not None and r.ok  # noqa: E731
            rows.append([
                model, str(n), _f(m.max_model_len, "d"), _f(m.bytes_per_token and m.bytes_per_token / 1e6, ".1f"),
                _f(st.tok_s, ".1f") if ok(st) else ("FAILED" if st else "-"),
                _f(kg.tok_s, ".1f") if ok(kg) else ("FAILED" if kg else "-"),
                "-" if m.speedup is None else f"{m.speedup:.2f}x",
                _f(st.ms_per_token, ".3f") if ok(st) else "-", _f(kg.ms_per_token, ".3f") if ok(kg) else "-",
                _pct(st.bw_share) if ok(st) else "-", _pct(kg.bw_share) if ok(kg) else "-",
                _kog_steps(kg) if kg is not None else "-",
            ])  # fmt: skip
            for r in m.rows:
                if not r.ok:
                    notes.append(f"{model} prompt {n} {r.impl}: {r.error}")
                notes.extend(f"{model} prompt {n} {r.impl}: {w}" for w in r.warnings)
            if m.speedup is not None and m.speedup < 1.0:
                notes.append(f"{model} prompt {n}: kog is slower than stock ({m.speedup:.2f}x)")
            if m.sampled_kog_of_greedy is not None:  # --also-greedy (bench/greedy_rounds.py)
                ratios.append(f"sampled kog / greedy kog, {model} prompt {n}: {100 * m.sampled_kog_of_greedy:.1f}%")
            if m.kog_fp8_over_bf16 is not None:  # --also-bf16 (bench/fp8.py)
                ratios.append(f"kog FP8 / kog bf16, {model} prompt {n}: {m.kog_fp8_over_bf16:.2f}x")
    notes.extend(f"{x.model} prompt {x.prompt_len}: skipped, {x.reason}" for x in report.skipped)
    head = header_lines(report.points[0]) if report.points else ["kog bench sweep: nothing ran"]
    head = [h for h in head if "max_model_len" not in h and not h.startswith("batch 1, prompt")]
    s = report.points[0].settings if report.points else {}
    head.append(f"sweep over prompt lengths {', '.join(map(str, report.prompt_lens))}: batch 1, random token ids, "
                f"{s.get('new_tokens')} new tokens (ignore_eos), K={s.get('tokens_per_step') or 'default'}, "
                f"{s.get('stat')} of {s.get('reps')} reps; vLLM max_model_len per length = prompt + new tokens + "
                "slack, capped at the model's max_position_embeddings")
    head.append("MB/token: weights + mean KV bytes one decode step reads; % copy BW: that x tok/s over the "
                "device-to-device copy bandwidth measured in each engine's process")
    return "\n".join(head + [""] + _grid(cols, rows) + ([""] + ratios if ratios else []) + [f"! {n}" for n in notes])
