"""Summary of a monokernel timeline (Monokernel.trace_table): where a typical layer spends its time, and, for a
launch of several tokens, where the boundary between two tokens does.

Times are relative to the layer's start, taken as the moment the previous layer's down projection completed
(the latest kEvDownDone over blocks): for each event, the earliest, median and latest block, median over the
layers 1 .. L-1 (layer 0 starts from the launch). Blocks that skipped an event (entry 0) are left out. A token
boundary is timed from token t's last layer completing to token t + 1's layer 0 completing.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from kog_backend.monokernel.layout import TRACE_EVENTS

_EV = {name: i for i, name in enumerate(TRACE_EVENTS)}
# trace.cuh's aliases of the LM head's row (the row num_layers reuses the layer events' slots).
_LM_ALIASES = {"kEvLmReady": "kEvQkvReady", "kEvLmDone": "kEvQkvDone", "kEvTokenSeen": "kEvAttnReady"}


@dataclasses.dataclass(frozen=True)
class EventSpan:
    event: str
    first_us: float
    median_us: float
    last_us: float
    blocks: int


def _span(label: str, marks: torch.Tensor, t0: float) -> EventSpan | None:
    """marks (ns per block, 0 where a block skipped the event) in us after t0; None when every block skipped it."""
    v = marks[marks > 0]
    if v.numel() == 0:
        return None
    rel = (v - t0) / 1e3
    return EventSpan(label, float(rel.min()), float(rel.median()), float(rel.max()), v.numel())


@dataclasses.dataclass(frozen=True)
class Timeline:
    layer_us: float  # median time between consecutive layers' completions
    events: tuple[EventSpan, ...]
    lm_us: float  # last layer complete -> every block's argmax published (token 0)
    total_us: float  # first block's first event -> last event of token 0


def summarize(trace: torch.Tensor) -> Timeline:
    """trace: int64 [tokens, layers + 1, events, grid] (token 0 is summarised)."""
    tr = trace[0].to(torch.float64).cpu()
    if not bool((tr > 0).any()):
        raise ValueError("the timeline is empty: build the extension with KOG_TRACE=1 (setup.py) to compile the marks in")
    num_layers = tr.shape[0] - 1
    if num_layers < 3:
        raise ValueError("a timeline summary needs at least 3 layers")
    down = _EV["kEvDownDone"]

    def done(layer: int) -> float:
        v = tr[layer, down]
        return float(v[v > 0].max())

    starts = [done(layer - 1) for layer in range(1, num_layers)]
    ends = [done(layer) for layer in range(1, num_layers)]
    spans = []
    for name, ev in _EV.items():
        firsts, meds, lasts, counts = [], [], [], []
        for layer, t0 in zip(range(1, num_layers), starts):
            span = _span(name, tr[layer, ev], t0)
            if span is None:
                continue
            firsts.append(span.first_us)
            meds.append(span.median_us)
            lasts.append(span.last_us)
            counts.append(span.blocks)
        if counts:
            spans.append(EventSpan(name[3:], statistics.median(firsts), statistics.median(meds),
                                   statistics.median(lasts), int(statistics.median(counts))))  # fmt: skip
    lm = tr[num_layers, _EV[_LM_ALIASES["kEvLmDone"]]]
    lm_end = float(lm[lm > 0].max()) if (lm > 0).any() else float("nan")
    nz = tr[tr > 0]
    return Timeline(
        layer_us=statistics.median(e - s for s, e in zip(starts, ends)) / 1e3,
        events=tuple(spans),
        lm_us=(lm_end - done(num_layers - 1)) / 1e3,
        total_us=(float(nz.max()) - float(nz.min())) / 1e3,
    )


def format_timeline(t: Timeline) -> str:
    lines = [
        f"typical layer {t.layer_us:.1f} us; LM head {t.lm_us:.1f} us; token 0 total {t.total_us:.1f} us",
        "us after the previous layer's down projection completed (median over layers 1..L-1):",
        f"  {'event':<14}{'first':>8}{'median':>8}{'last':>8}{'blocks':>8}",
    ]
    lines += [f"  {e.event:<14}{e.first_us:>8.1f}{e.median_us:>8.1f}{e.last_us:>8.1f}{e.blocks:>8}" for e in t.events]
    return "\n".join(lines)


# The points of a token boundary: (row: "lm" token t's LM head row, "next" token t + 1's layer 0; event; label).
BOUNDARY_POINTS = (
    ("lm", "kEvLoaderLayer", "loader: first LM chunk issued"),
    ("lm", "kEvLmReady", "LM norm done"),
    ("lm", "kEvLmDone", "argmax slot published"),
    ("lm", "kEvTokenSeen", "next token seen"),
    ("next", "kEvLoaderLayer", "next token: loader's first layer-0 chunk"),
    ("next", "kEvQkvReady", "next token: layer-0 QKV norm done"),
    ("next", "kEvQkvLanded", "next token: last QKV chunk landed"),
    ("next", "kEvQkvDone", "next token: QKV published"),
    ("next", "kEvDownDone", "next token: layer 0 complete"),
)


def token_boundaries(trace: torch.Tensor) -> list[tuple[float, tuple[EventSpan, ...]]]:
    """For each token t but the last of a K-token launch's timeline (trace: int64 [tokens, layers + 1, events,
    grid]): (us until token t + 1's layer 0 completed, the BOUNDARY_POINTS as spans over blocks), in us after token
    t's last layer completed (the latest kEvDownDone)."""
    tr = trace.to(torch.float64).cpu()
    num_layers = tr.shape[1] - 1
    down = _EV["kEvDownDone"]
    out = []
    for t in range(tr.shape[0] - 1):
        last = tr[t, num_layers - 1, down]
        nxt = tr[t + 1, 0, down]
        if not bool((last > 0).any()) or not bool((nxt > 0).any()):
            raise ValueError(f"token {t} or {t + 1} left no marks: build with KOG_TRACE=1 and launch that many tokens")
        t0 = float(last.max())
        spans = []
        for row, ev, label in BOUNDARY_POINTS:
            marks = tr[t, num_layers, _EV[_LM_ALIASES.get(ev, ev)]] if row == "lm" else tr[t + 1, 0, _EV[ev]]
            span = _span(label, marks, t0)
            if span is not None:
                spans.append(span)
        out.append(((float(nxt.max()) - t0) / 1e3, tuple(spans)))
    return out


def format_boundaries(boundaries: list[tuple[float, tuple[EventSpan, ...]]]) -> str:
    lines = ["us after token t's last layer completed (first / median / last block):"]
    for t, (layer0_us, spans) in enumerate(boundaries):
        lines.append(f"-- token {t} -> {t + 1}: next token's layer 0 complete at {layer0_us:.1f} us")
        lines += [f"  {e.event:<42}{e.first_us:>8.1f}{e.median_us:>8.1f}{e.last_us:>8.1f}{e.blocks:>6}" for e in spans]
    return "\n".join(lines)
