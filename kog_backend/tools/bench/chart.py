"""The PNG: per model, stock and kog tokens/s as bars against the bandwidth floor (matplotlib, Agg); an
--also-greedy run's "<model> greedy" rounds are a panel of their own."""

from __future__ import annotations

import json
import statistics

from kog_backend.tools.bench import greedy_rounds, sampling
from kog_backend.tools.bench.results import BenchReport

COLORS = {"stock": "#7f7f7f", "kog": "#d62728"}
OTHER_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]


def write_chart(report: BenchReport, path: str) -> str:
    """Writes `path` (PNG) and returns it. Raises ImportError when matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    models = report.models or []
    n = max(1, len(models))
    fig, axes = plt.subplots(1, n, figsize=(3.2 + 3.0 * n, 4.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        labels, values, colors = [], [], []
        for i, r in enumerate(m.rows):
            labels.append(r.impl)
            values.append(r.tok_s if (r.ok and r.tok_s) else 0.0)
            colors.append(COLORS.get(r.impl, OTHER_COLORS[i % len(OTHER_COLORS)]))
        xs = list(range(len(values)))
        bars = ax.bar(xs, values, color=colors, width=0.6)
        floors = [r.floor_tok_s for r in m.rows if r.ok and r.floor_tok_s]
        floor = statistics.median(floors) if floors else None
        top = max(values + [floor or 0.0, 1.0])
        if floor:
            ax.axhline(floor, color="black", linestyle="--", linewidth=1.2)
            ax.text(0.98, floor, f"bandwidth floor {floor:,.0f} tok/s", ha="right", va="bottom", fontsize=8,
                    transform=ax.get_yaxis_transform())  # x in axes fraction, y in data
        for b, v, r in zip(bars, values, m.rows):
            if not r.ok:
                text = "failed"
            else:
                text = f"{v:,.0f}"
                if r.bw_share is not None:
                    text += f"\n{100 * r.bw_share:.0f}% of copy BW"
            ax.text(b.get_x() + b.get_width() / 2, v + 0.01 * top, text, ha="center", va="bottom", fontsize=8)
        ax.set_xticks(xs, labels)
        ax.set_ylim(0, top * 1.22)
        sp = f"  ({m.speedup:.2f}x)" if m.speedup else ""
        ax.set_title(f"{m.model}{sp}", fontsize=10)
        ax.set_ylabel("tokens/s, one request")
    if not models:
        axes[0][0].text(0.5, 0.5, "no results", ha="center", va="center")
    h = report.host
    s = report.settings
    if report.kind == "http":
        first = f"live servers, streaming, as the client sees it   {report.date[:10]}   commit {report.commit[:10]}"
    else:
        first = f"{h.get('gpu', '?')} x{s.get('tp', 1)}   {report.date[:10]}   commit {report.commit[:10]}"
    k = f", K={s.get('tokens_per_step') or 'default'}" if report.kind == "offline" else ""
    if report.kind == "offline" and s.get("engine_args"):
        k += f", engine args {json.dumps(s['engine_args'], sort_keys=True)}"
    sampled = sampling.short_text(s, [(m.model, m.sampling) for m in greedy_rounds.sampled_models(report)],
                                  http=report.kind == "http")
    if sampled:
        k += f", {sampled}"
    fig.suptitle(f"{first}\nbatch 1, prompt {s.get('prompt_len')}, {s.get('new_tokens')} new tokens{k}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
