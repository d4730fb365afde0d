"""The sweep's PNG (matplotlib, Agg): tok/s (left) and % of copy bandwidth (right) against prompt length, one line
per (model, engine): stock grey, kog red (chart.COLORS), one marker per model."""

from __future__ import annotations

from kog_backend.tools.bench import greedy_rounds, sampling
from kog_backend.tools.bench.chart import COLORS
from kog_backend.tools.bench.results import IMPLS
from kog_backend.tools.bench.sweep import SweepReport

MARKERS = ("o", "s", "^", "D", "v", "P")
LINESTYLES = {"stock": "--", "kog": "-"}


def sweep_series(report: SweepReport) -> dict[tuple[str, str], list[tuple[int, float | None, float | None]]]:
    """(model, impl) -> [(prompt length, tok/s, share of copy bandwidth)] over the lengths that model ran; None where
    that row failed."""
    out: dict[tuple[str, str], list[tuple[int, float | None, float | None]]] = {}
    for model, results in report.by_model().items():
        for n, m in results:
            for impl in IMPLS:
                r = m.row(impl)
                if r is None:
                    continue
                ok = r.ok and r.tok_s is not None
                out.setdefault((model, impl), []).append((n, r.tok_s if ok else None, r.bw_share if ok else None))
    return out


def write_sweep_chart(report: SweepReport, path: str) -> str:
    """Writes `path` (PNG) and returns it. Raises ImportError when matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    series = sweep_series(report)
    models = list(dict.fromkeys(model for model, _ in series))
    fig, (ax_tok, ax_bw) = plt.subplots(1, 2, figsize=(12, 4.8))
    for (model, impl), pts in series.items():
        marker = MARKERS[models.index(model) % len(MARKERS)]
        xs = [n for n, t, _ in pts if t is not None]
        style = dict(color=COLORS.get(impl, "#1f77b4"), linestyle=LINESTYLES.get(impl, "-"), marker=marker,
                     linewidth=1.8, markersize=6, label=f"{model} {impl}")
        ax_tok.plot(xs, [t for _, t, _ in pts if t is not None], **style)
        bw = [(n, b) for n, _, b in pts if b is not None]
        ax_bw.plot([n for n, _ in bw], [100 * b for _, b in bw], **style)
    for ax, label in ((ax_tok, "tokens/s, one request"), (ax_bw, "% of copy bandwidth (weights + KV bytes)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        if report.prompt_lens:
            ax.set_xticks(report.prompt_lens, [f"{n:,}" for n in report.prompt_lens], rotation=30, fontsize=8)
            ax.minorticks_off()
        ax.set_ylim(bottom=0)
    ax_bw.set_ylim(0, 105)
    if series:
        ax_tok.legend(fontsize=8, loc="best")
    else:
        ax_tok.text(0.5, 0.5, "no results", ha="center", va="center", transform=ax_tok.transAxes)
    first = report.points[0] if report.points else None
    if first is not None:
        s, h = first.settings, first.host
        sampled = sampling.short_text(s, [(m.model, m.sampling) for m in greedy_rounds.sampled_models(first)], http=False)
        title = (f"{h.get('gpu', '?')} x{s.get('tp', 1)}   {first.date[:10]}   commit {first.commit[:10]}\n"
                 f"batch 1, {s.get('new_tokens')} new tokens after each prompt, K={s.get('tokens_per_step') or 'default'}"
                 + (f", {sampled}" if sampled else ""))
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
