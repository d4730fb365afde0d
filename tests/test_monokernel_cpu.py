"""CPU-checkable parts of the monokernel: the argument-table layout and tunables against the C++ headers (and the
built extension's ops, when it loads), the chunk plan, and the torch reference of the kernel's schedule against
torch_step and Hugging Face transformers on tiny random Llama and Qwen3 models.

Tolerances: split-K attention vs torch_step's softmax differs only in the order of fp32 sums (rel 1e-5 in fp32);
whole-model logits vs HF: rel 2e-4 in float32, rel 3e-2 in bf16 (bf16 rounding of every stage's output).
"""

from __future__ import annotations

import math
import os
import re

import pytest
import torch

from kog_backend import ops

from kog_backend.path import model_spec

from kog_backend.reference import sampling, torch_step
from kog_backend.monokernel import layout, plan, reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = os.path.join(ROOT, "csrc", "include", "kog")


# ---- layout and tunables ------------------------------------------------------------------------------------------


def _struct_fields(src: str, name: str) -> list[tuple[str, int]]:
    body = re.search(r"struct\s+" + name + r"\s*\{(.*?)\n\};", src, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    out = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        m = re.search(r"(\w+)\s*(?:\[([^\]]+)\])?$", decl)
        count = 1
        if m.group(2):
            count = {"MonoConfig::kNumStages": layout.NUM_STAGES, "MonoConfig::kMaxTP": layout.CONFIG["kMaxTP"]}.get(
                m.group(2).strip()
            ) or int(m.group(2))
        out.append((m.group(1), count))
    return out


def _config_constants() -> dict[str, int]:
    src = open(os.path.join(HEADERS, "config.cuh")).read()
    body = re.search(r"struct MonoConfig \{(.*?)\n\};", src, re.S).group(1)
    env: dict[str, int] = {}
    for name, expr in re.findall(r"static constexpr int (\w+) = ([^;]+);", body):
        env[name] = int(eval(expr, {"__builtins__": {}}, dict(env)))  # constant arithmetic of earlier names
    return env


def test_arg_structs_match_header():
    src = open(os.path.join(HEADERS, "args.cuh")).read()
    assert _struct_fields(src, "ModelArgs") == [(n, c) for n, _, c in layout.MODEL_FIELDS]
    assert [n for n, _ in _struct_fields(src, "LayerArgs")] == list(layout.LAYER_FIELDS)
    assert all(c == 1 for _, c in _struct_fields(src, "LayerArgs"))


def test_config_matches_header():
    hdr = _config_constants()
    for name, value in layout.CONFIG.items():
        if name in hdr:
            assert hdr[name] == value, name
    sync = open(os.path.join(HEADERS, "sync.cuh")).read()
    assert int(re.search(r"kCtrLayerBase = (\d+)", sync).group(1)) == layout.CONFIG["kCtrLayerBase"]
    assert int(re.search(r"kCtrTpLM = (\d+)", sync).group(1)) == layout.CONFIG["kCtrTpLM"]
    assert int(re.search(r"kCtrSampleArrive = (\d+)", sync).group(1)) == layout.CONFIG["kCtrSampleArrive"]
    burst = open(os.path.join(HEADERS, "burst_sampling.cuh")).read()
    assert int(re.search(r"kMaxGrid = (\d+);", burst).group(1)) == plan.SAMPLE_MAX_GRID
    assert int(re.search(r"kMaxSplit = (\d+);", burst).group(1)) == sampling.MAX_SPLIT
    assert f"kMaxExpArg = {sampling.MAX_EXP_ARG:g}.f" in burst
    assert int(re.search(r"layer_counter_count\(int num_kv_heads\) \{ return (\d+) \+", sync).group(1)) == (
        layout.CONFIG["layer_counter_count_0"]
    )
    assert set(hdr) <= set(layout.CONFIG) | {
        "kConsumerThreads", "kLoaderWarp", "kMaxNormIters", "kEpilogueBatch", "kLoaderRegs", "kConsumerRegs"
    } | {
        f"kStage{n}" for n in ("QKV", "O", "GU", "Down", "LM")
    }
    assert layout.attn_work_floats(64) == layout.CONFIG["attn_work_floats_64"]
    assert layout.attn_work_floats(128) == layout.CONFIG["attn_work_floats_128"]
    trace = open(os.path.join(HEADERS, "trace.cuh")).read()
    assert int(re.search(r"kTraceEvents = (\d+)", trace).group(1)) == layout.CONFIG["kTraceEvents"]
    assert layout.TRACE_EVENTS == tuple(re.findall(r"  (kEv\w+) = \d+,", trace))
    from kog_backend.monokernel import timeline

    assert timeline._LM_ALIASES == dict(re.findall(r"  (kEv\w+) = (kEv\w+),", trace))


def test_abort_sites_match_header_and_are_described():
    from kog_backend.monokernel import host

    sites = dict(re.findall(r"(kSite\w+) = (\d+)", open(os.path.join(HEADERS, "sync.cuh")).read()))
    assert int(sites["kSiteNotResident"]) == host.SITE_NOT_RESIDENT
    assert set(host.ABORT_SITES) == {int(v) for v in sites.values()}
    desc = host.describe_abort(int(sites["kSiteFull"]), 5, 3, 17, 0, num_kv_heads=8)
    assert desc.startswith("weight slot full wait timed out in block 5") and "target=17" in desc
    desc = host.describe_abort(host.SITE_NOT_RESIDENT, 5, 0xFFFFFFFF, 132, 100, num_kv_heads=8)
    assert "100 of 132 blocks started" in desc and "tagged words" in desc
    # a MoE table's counters after the dense ones (ModelArgs::moe_ctr_base): per layer the router's, then the route's
    assert host.describe_counter(200 + 5, 4, moe_ctr_base=200) == "layer 2 route"
    assert host.describe_counter(200 + 4, 4, moe_ctr_base=200) == "layer 2 router"
    assert host.describe_counter(13 + 9 + 1, 4, moe_ctr_base=200) == "layer 1 o"


@pytest.mark.skipif(ops.load_reason() is not None, reason=f"extension not loadable: {ops.load_reason()}")
def test_layout_and_config_match_extension():
    assert list(torch.ops.kog.monokernel_layout()) == layout.expected_layout()
    assert list(torch.ops.kog.monokernel_config()) == list(layout.CONFIG.values())
    assert layout.extension_mismatch(torch.ops.kog) is None


def test_extension_from_other_sources_is_refused():
    """An extension whose table layout or constants differ from the package's (built from other sources) gets a
    reason, so the monokernel never runs with a table it would misread; a benchmark build flag alone does not."""
    from types import SimpleNamespace

    def fake(layout_=None, config=None):
        lay = layout.expected_layout() if layout_ is None else layout_
        cfg = list(layout.CONFIG.values()) if config is None else config
        return SimpleNamespace(monokernel_layout=lambda: lay, monokernel_config=lambda: cfg)

    assert layout.extension_mismatch(fake()) is None
    shifted = layout.expected_layout()
    shifted[0] += 8  # ModelArgs one field longer
    assert "layout differs" in layout.extension_mismatch(fake(layout_=shifted))
    cfg = dict(layout.CONFIG)
    cfg["kHeaderBytes"] += 1024
    assert "kHeaderBytes" in layout.extension_mismatch(fake(config=list(cfg.values())))
    assert "constants" in layout.extension_mismatch(fake(config=list(layout.CONFIG.values())[:-1]))
    flagged = dict(layout.CONFIG, kTaggedBuild=1)
    assert layout.extension_mismatch(fake(config=list(flagged.values()))) is None
    assert "stale build" in layout.extension_mismatch(SimpleNamespace())


def test_pack_roundtrip():
    vals = {}
    for i, (name, kind, count) in enumerate(layout.MODEL_FIELDS):
        v = [0.5 + i + j for j in range(count)] if kind == "d" else [1000 * i + j for j in range(count)]
        vals[name] = v if count > 1 else v[0]
    vals.update(tp_size=4, tp_rank=2)
    vals["tp_delta"][2] = 0
    buf = layout.pack_model(vals)
    assert len(buf) == layout.model_size()
    assert layout.unpack_model(buf) == vals
    layers = [{n: 17 * i + j for j, n in enumerate(layout.LAYER_FIELDS)} for i in range(3)]
    assert len(layout.pack_layers(layers)) == 3 * layout.layer_size()


def test_pack_refuses_broken_tp_fields():
    n = layout.CONFIG["kMaxTP"]
    vals = {name: ([0] * count if count > 1 else 0) for name, _, count in layout.MODEL_FIELDS}
    vals.update(tp_size=1, tp_rank=0, tp_delta=[0] * n)
    assert layout.tp_fields_error(vals) is None
    layout.pack_model(vals)
    # bench_tp_monokernel.py's old no-exchange table on rank 1: world 1, rank 0, rank 1's deltas (rank 0 at -d).
    stale = dict(vals, tp_delta=[-(1 << 30), 0] + [0] * (n - 2))
    with pytest.raises(ValueError, match=r"tp_delta\[0\] = -1073741824"):
        layout.pack_model(stale)
    for bad, what in [(dict(vals, tp_size=0), "tp_size 0"), (dict(vals, tp_size=n + 1), f"tp_size {n + 1}"),
                      (dict(vals, tp_size=2, tp_rank=2), "tp_rank 2 outside 0..1"),
                      (dict(vals, tp_rank=-1), "tp_rank -1")]:  # fmt: skip
        assert what in layout.tp_fields_error(bad)
        with pytest.raises(ValueError):
            layout.pack_model(bad)


# ---- plan ---------------------------------------------------------------------------------------------------------


def _shape(arch="llama", L=2, H=2048, nh=32, nkv=8, D=64, I=8192, V=128256, tied=True):
    return model_spec.DecoderShape(
        arch=arch, num_layers=L, hidden_size=H, num_heads=nh, num_kv_heads=nkv, head_dim=D, intermediate_size=I,
        vocab_size=V, padded_vocab_local=(V + 63) // 64 * 64, vocab_start=0, rms_eps=1e-5, qk_norm=arch == "qwen3",
        tied_embeddings=tied, max_position=4096,
    )  # fmt: skip


REAL_SHAPES = {
    "llama-3.2-1b": _shape(L=16),
    "qwen3-1.7b": _shape("qwen3", L=28, nh=16, nkv=8, D=128, I=6144, V=151936),
    "llama-3.1-8b": _shape(L=32, H=4096, nh=32, nkv=8, D=128, I=14336, tied=False),
}


@pytest.mark.parametrize("name", sorted(REAL_SHAPES))
def test_plan_real_shapes(name):
    s = REAL_SHAPES[name]
    p = plan.make_plan(s, 132)
    assert isinstance(p, plan.Plan), p
    c = layout.CONFIG
    assert p.smem_bytes <= c["kMaxSmemBytes"] and p.num_slots >= 4
    assert p.num_splits * s.num_kv_heads <= 132
    assert p.slot_bytes == c["kSlotBytes"]  # these shapes' rows fit the default slot
    for st in p.stages:
        rows = 2 if st.pair else 1
        assert st.nu * rows * st.k * 2 <= c["kSlotBytes"]
        # the three measured shapes split each row evenly over its warps (gemv.cuh: the former schedule, bit for bit)
        assert (st.k * st.nu) % (c["kConsumerWarps"] * c["kWarpStride"]) == 0
        assert st.chunks * st.nu >= st.n > (st.chunks - 1) * st.nu
    assert p.stages[layout.STAGE_LM].n == s.vocab_size  # padded rows are never streamed
    # Every weight byte is streamed exactly once: the plan's bytes equal the model's per-token weight bytes.
    per_layer = sum(st.bytes for st in p.stages[:4])
    norms = (2 * s.hidden_size + (2 * s.head_dim if s.qk_norm else 0)) * 2
    assert per_layer * s.num_layers + p.stages[layout.STAGE_LM].bytes > 0.99 * (
        (per_layer + norms) * s.num_layers + s.vocab_size * s.hidden_size * 2
    )


@pytest.mark.parametrize("name", sorted(REAL_SHAPES))
def test_plan_fits_filtered_sampling(name):
    """Top-k / top-p / min-p bursts keep a level and a score per LM-head row of the block in the work area: the real
    shapes fit on 132 SMs; a grid of few SMs (ranks sharing a GPU) gets a reason naming the bytes."""
    s = REAL_SHAPES[name]
    p = plan.make_plan(s, 132)
    lm = p.stages[layout.STAGE_LM]
    assert p.sample_rows == math.ceil(lm.chunks / 132) * lm.nu
    assert p.filtered_sampling_reason is None
    assert layout.sample_smem_bytes(p.sample_rows) <= p.work_bytes
    small = plan.make_plan(s, 33)
    assert "work area" in small.filtered_sampling_reason


@pytest.mark.parametrize("nh,nkv,width", [(16, 16, 2), (16, 8, 2), (32, 8, 4), (32, 4, 4), (32, 1, 4)])
def test_plan_heads_per_pass_picks_the_kernel_instantiation(nh, nkv, width):
    """The attention pass width is the kernel instantiation monokernel_step launches (2 or kHeadsPerPass): GQA <= 2
    (Qwen3-1.7B) in 2-wide passes, no empty head computed; GQA 4 in one 4-wide pass; GQA 8 and 32 in several."""
    p = plan.make_plan(_shape(nh=nh, nkv=nkv, D=64), 132)
    assert isinstance(p, plan.Plan), p
    assert p.heads_per_pass == width and width in (2, layout.CONFIG["kHeadsPerPass"])
    assert plan.make_plan(REAL_SHAPES["qwen3-1.7b"], 132).heads_per_pass == 2
    assert plan.make_plan(REAL_SHAPES["llama-3.2-1b"], 132).heads_per_pass == 4


@pytest.mark.parametrize(
    "kwargs,needle",
    [(dict(H=100), "hidden_size 100"), (dict(H=16384), "hidden_size 16384"),
     (dict(I=8196), "intermediate_size 8196: the down input length must be a multiple of 8"),
     (dict(I=60000), "shared memory: intermediate_size 60000"),
     (dict(nh=12, nkv=8), "num_attention_heads 12 is not a multiple of num_key_value_heads 8"),
     (dict(nkv=200, nh=200), "num_key_value_heads 200 exceed")],
)  # fmt: skip
def test_plan_refuses_uncovered_shapes(kwargs, needle):
    """Every refusal names the config field it comes from (the gate's and `kog doctor`'s reason)."""
    r = plan.make_plan(_shape(**kwargs), 132)
    assert isinstance(r, str) and needle in r, r


def test_unsupported_reason_on_cpu():
    from kog_backend.monokernel import unsupported_reason

    w = _tiny_weights("llama", 64, 4, True, torch.bfloat16)[1]
    assert "not a CUDA GPU" in unsupported_reason(w, [], "cpu")


# ---- reference of the schedule vs torch_step and HF ---------------------------------------------------------------


@pytest.mark.parametrize(
    "ctx,splits", [(1, 16), (15, 16), (16, 16), (17, 16), (100, 7), (33, 1), (100, 2), (520, 16), (1000, 16)]
)
@pytest.mark.parametrize("gqa", [1, 4])
def test_split_attention_matches_softmax(ctx, splits, gqa):
    g = torch.Generator().manual_seed(ctx * 31 + splits + gqa)
    nh, d = 8, 64
    q = torch.randn(nh, d, generator=g)
    k = torch.randn(ctx, nh // gqa, d, generator=g)
    v = torch.randn(ctx, nh // gqa, d, generator=g)
    out, m, l, acc = reference.split_attention(q, k, v, splits)
    ref = torch_step.decode_attention(q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    bounds = reference.split_bounds(ctx, splits)
    assert sum(max(0, e - s) for s, e in bounds) == ctx
    for j, (s, e) in enumerate(bounds):
        assert torch.isinf(m[:, j]).all() == (s >= e)
    # Splits the tensor-core pass takes start on whole tiles (one KV block per tile).
    if (ctx + splits - 1) // splits > layout.CONFIG["kAttnShortLen"]:
        assert all(s % layout.CONFIG["kAttnTileLen"] == 0 for s, _ in bounds)


transformers = pytest.importorskip("transformers")

BLOCK_SIZE = 4


def _tiny_weights(arch, head_dim, gqa, tied, dtype):
    from hf_models import tiny_hf_model, weights_from_hf

    hf = tiny_hf_model(arch, head_dim, gqa, tied, vocab_size=503, intermediate_size=256)
    return hf, weights_from_hf(hf, arch, dtype)


def _paged_caches(shape, num_blocks, dtype):
    """vLLM's flash layout: logical [blocks, kv_heads, block, 2D] over NHD memory; NaN-poisoned."""
    return [
        torch.full((num_blocks, BLOCK_SIZE, shape.num_kv_heads, 2 * shape.head_dim), math.nan, dtype=dtype).permute(0, 2, 1, 3)
        for _ in range(shape.num_layers)
    ]


def _check_caches_close(a: torch.Tensor, b: torch.Tensor, layer: int, fp32: bool) -> None:
    """The reference's and torch_step's K/V caches: written at the same slots (NaN poison left in the same places),
    with the same values up to rounding. In bf16 the two compute K/V through different rounding orders, and a
    one-ulp difference in a hidden element moves a few K/V elements of later layers by several ulps (seen: 1 of
    32,768 elements 0.0195 apart at 0.37 in ~2% of random draws); a wrong slot or head would differ in whole rows
    (head_dim >= 64 elements) and in the NaN pattern."""
    written_a, written_b = ~torch.isnan(a), ~torch.isnan(b)
    assert torch.equal(written_a, written_b), f"layer {layer}: K/V written at different places"
    x, y = a[written_a].float(), b[written_b].float()
    if fp32:
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
        return
    rel = ((x - y).norm() / y.norm()).item()
    assert rel < 1e-2, f"layer {layer}: K/V relative error {rel:.2e}"
    far = ((x - y).abs() > 1e-2 + 1e-2 * y.abs()).sum().item()
    assert far <= 8, f"layer {layer}: {far} K/V elements differ by more than 1e-2 + 1e-2 |v| (<= 8 allowed)"


@pytest.mark.parametrize(
    "arch,head_dim,gqa,tied",
    [("llama", 64, 4, True), ("llama", 128, 1, False), ("qwen3", 128, 2, True), ("qwen3", 64, 4, False),
     ("qwen2", 128, 2, True)],
)
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 2e-4), (torch.bfloat16, 3e-2)])
def test_reference_step_matches_hf_and_torch_step(arch, head_dim, gqa, tied, dtype, rtol):
    hf, weights = _tiny_weights(arch, head_dim, gqa, tied, dtype)
    seq_len, num_blocks, splits = 19, 16, 3  # crosses blocks, ends mid-block; some splits empty early on
    tokens = torch.randint(0, hf.config.vocab_size, (seq_len,))
    with torch.no_grad():
        ref = hf(tokens[None]).logits[0].float()
    caches = _paged_caches(weights.shape, num_blocks, dtype)
    caches_ts = [c.clone() for c in caches]
    used = (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE
    block_table = torch.zeros(num_blocks, dtype=torch.int32)
    block_table[:used] = torch.randperm(num_blocks - 1)[:used] + 1
    got, got_ts = [], []
    with torch.no_grad():
        for pos in range(seq_len):
            slot = int(block_table[pos // BLOCK_SIZE]) * BLOCK_SIZE + pos % BLOCK_SIZE
            r = reference.reference_step(weights, caches, int(tokens[pos]), pos, slot, block_table, splits)
            got.append(r["logits"].float())
            assert r["token"] == int(torch.argmax(r["logits"].float()))
            h = torch_step.decode_hidden(weights, caches_ts, torch_step.embed(weights, int(tokens[pos])), pos, slot,
                                         block_table, pos + 1)  # fmt: skip
            got_ts.append(torch_step.logits(weights, h).float())
    got, got_ts = torch.stack(got), torch.stack(got_ts)
    assert torch.isfinite(got).all()
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < rtol, f"reference vs HF: relative error {rel:.2e} >= {rtol:.0e}"
    rel_ts = ((got - got_ts).norm() / got_ts.norm()).item()
    assert rel_ts < (1e-5 if dtype == torch.float32 else 2e-2), f"reference vs torch_step: {rel_ts:.2e}"
    for layer, (a, b) in enumerate(zip(caches, caches_ts)):  # same K/V written at the same slots
        _check_caches_close(a, b, layer, fp32=dtype == torch.float32)
    if dtype == torch.float32:
        assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_expected_from_kernel_is_exact_on_reference_buffers():
    """Teacher forcing fed with the reference's own buffers reproduces them (checks the stage wiring)."""
    _, weights = _tiny_weights("qwen3", 64, 2, False, torch.bfloat16)
    caches = _paged_caches(weights.shape, 8, torch.bfloat16)
    block_table = torch.tensor([3, 5, 1, 7, 0, 0, 0, 0], dtype=torch.int32)
    for pos in range(9):
        slot = int(block_table[pos // BLOCK_SIZE]) * BLOCK_SIZE + pos % BLOCK_SIZE
        tok = (pos * 37) % 503
        r = reference.reference_step(weights, caches, tok, pos, slot, block_table, 4)
    e = reference.expected_from_kernel(weights, caches, r["layers"], r["logits"], tok, pos, block_table, 4)
    for got, exp in zip(r["layers"], e["layers"]):
        for name in ("qkv_out", "q_out", "attn_out", "o_out", "rmid", "act", "down_out", "rin_next"):
            assert torch.equal(got[name], exp[name]), name
        torch.testing.assert_close(exp["attn_out_from_partials"], got["attn_out"], rtol=0, atol=0)
    assert torch.equal(e["logits"], r["logits"]) and e["token"] == r["token"]


def _owned_chunks(b: int, base: int, n: int, grid: int) -> list[int]:
    """Python mirror of first_chunk/chunks_owned in schedule.cuh."""
    c0 = b - base + (grid if b < base else 0)
    return list(range(c0, n, grid))


@pytest.mark.parametrize("name", sorted(REAL_SHAPES))
def test_schedule_covers_every_chunk_once_and_balances(name):
    s, grid = REAL_SHAPES[name], 132
    p = plan.make_plan(s, grid)
    per_block = [0] * grid
    base = 0
    for _ in range(2):  # two tokens of a K=2 launch: base keeps rotating
        for stage_ids in [range(4)] * s.num_layers + [[layout.STAGE_LM]]:
            for st in stage_ids:
                n = p.stages[st].chunks
                seen = []
                for b in range(grid):
                    mine = _owned_chunks(b, base, n, grid)
                    per_block[b] += len(mine)
                    seen += mine
                assert sorted(seen) == list(range(n))
                base = (base + n) % grid
    assert max(per_block) - min(per_block) <= 1


def test_attention_splits_follows_attn_single_ctx():
    """The split count tests and references use for a launch: one split up to attn_single_ctx (the table's
    default, kAttnSingleCtx, or an override), the plan's otherwise."""
    from types import SimpleNamespace

    from kog_backend.monokernel.host import Monokernel

    mk = object.__new__(Monokernel)  # only the two attributes attention_splits reads (no GPU here)
    mk._model_values = {"attn_single_ctx": layout.CONFIG["kAttnSingleCtx"]}
    mk.plan = SimpleNamespace(num_splits=16)
    single = layout.CONFIG["kAttnSingleCtx"]
    assert single > 0
    assert [mk.attention_splits(c) for c in (1, single, single + 1, 4096)] == [1, 1, 16, 16]
    assert mk.attention_splits(1, attn_single_ctx=0) == 16
    assert mk.attention_splits(200, attn_single_ctx=256) == 1
