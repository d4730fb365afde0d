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


def test_token_boundaries_recover_constructed_offsets():
    """Two tokens of a 3-layer launch: token 0's last layer completes at T (the latest block); its LM head row and
    token 1's layer 0 carry marks at known offsets from T (block b 100 ns later than block 0). The LM row's aliases
    (kEvLmReady, kEvLmDone, kEvTokenSeen) read the slots trace.cuh gives them."""
    layers, grid = 3, 4
    tr = torch.zeros(2, layers + 1, CONFIG["kTraceEvents"], grid, dtype=torch.int64)
    ev = {name: i for i, name in enumerate(TRACE_EVENTS)}
    T = 10**9
    blocks = torch.arange(grid) * 100
    tr[0, layers - 1, ev["kEvDownDone"]] = T - 300 + blocks  # the latest block at T
    lm = {"kEvLoaderLayer": -3000, "kEvQkvReady": 4000, "kEvQkvDone": 130_000, "kEvAttnReady": 140_000}
    for name, off in lm.items():
        tr[0, layers, ev[name]] = T + off + blocks
    nxt = {"kEvLoaderLayer": 141_000, "kEvQkvReady": 147_000, "kEvQkvDone": 151_000, "kEvDownDone": 180_000}
    for name, off in nxt.items():
        tr[1, 0, ev[name]] = T + off + blocks
    tr[1, 0, ev["kEvQkvLanded"], 1:] = T + 150_000  # block 0 skipped it
    (layer0_us, spans), = timeline.token_boundaries(tr)
    assert layer0_us == pytest.approx(180.3)
    by = {e.event: e for e in spans}
    assert (by["argmax slot published"].first_us, by["argmax slot published"].last_us) == pytest.approx((130.0, 130.3))
    assert by["next token seen"].first_us == pytest.approx(140.0)
    assert by["loader: first LM chunk issued"].first_us == pytest.approx(-3.0)
    assert by["next token: last QKV chunk landed"].blocks == 3
    assert len(spans) == len(timeline.BOUNDARY_POINTS)
    assert "token 0 -> 1: next token's layer 0 complete at 180.3 us" in timeline.format_boundaries([(layer0_us, spans)])
    with pytest.raises(ValueError, match="KOG_TRACE=1"):
        timeline.token_boundaries(torch.zeros_like(tr))
