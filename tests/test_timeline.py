"""kog_backend.monokernel.timeline on a synthetic trace whose answer is known by construction."""

from __future__ import annotations

import pytest
import torch

from kog_backend.monokernel import timeline
from kog_backend.monokernel.layout import CONFIG, TRACE_EVENTS


def _trace(layers=5, grid=4, period_ns=40_000, skip_block=2):
    """Layer l starts at l * period; event e of block b at start + 1000 * e + 100 * b ns; block `skip_block` never
    runs attention (its attention entries left 0)."""
    tr = torch.zeros(1, layers + 1, CONFIG["kTraceEvents"], grid, dtype=torch.int64)
    t0 = 10**9
    down = TRACE_EVENTS.index("kEvDownDone")
    attn = {TRACE_EVENTS.index("kEvAttnReady"), TRACE_EVENTS.index("kEvAttnDone")}
    for layer in range(layers):
        for e in range(CONFIG["kTraceEvents"]):
            for b in range(grid):
                if e in attn and b == skip_block:
                    continue
                tr[0, layer, e, b] = t0 + layer * period_ns + 1000 * e + 100 * b
    # LM head: ready 500 ns and done 3000 ns after the last layer's down completed.
    last_down = int(tr[0, layers - 1, down].max())
    tr[0, layers, 0, :] = last_down + 500
    tr[0, layers, 1, :] = last_down + 3000
    return tr, t0, period_ns


def test_summary_recovers_constructed_offsets():
    tr, _, period = _trace()
    t = timeline.summarize(tr)
    assert t.layer_us == pytest.approx(period / 1e3)
    by = {e.event: e for e in t.events}
    # Layer l's reference point: the previous layer's last down completion = start(l-1) + dd us + 0.3 us.
    dd = TRACE_EVENTS.index("kEvDownDone")
    base = period / 1e3 - (dd + 0.3)
    qkv = by["QkvReady"]
    assert (qkv.first_us, qkv.last_us, qkv.blocks) == pytest.approx((base, base + 0.3, 4))
    attn = by["AttnReady"]
    ai = TRACE_EVENTS.index("kEvAttnReady")
    assert attn.blocks == 3 and attn.first_us == pytest.approx(base + ai) and attn.last_us == pytest.approx(base + ai + 0.3)
    assert by["DownDone"].last_us == pytest.approx(base + dd + 0.3)
    assert t.lm_us == pytest.approx(3.0)
    assert "typical layer 40.0 us" in timeline.format_timeline(t)


def test_too_few_layers_refused():
    tr, _, _ = _trace(layers=2)
    with pytest.raises(ValueError):
        timeline.summarize(tr)


def test_empty_trace_names_the_build_flag():
    with pytest.raises(ValueError, match="KOG_TRACE=1"):
        timeline.summarize(torch.zeros(1, 5, CONFIG["kTraceEvents"], 4, dtype=torch.int64))
