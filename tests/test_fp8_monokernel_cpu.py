"""The FP8-weight monokernel's host side without a GPU: the argument table's new fields, the plan with one byte per
layer weight, synthetic FP8 decoders, the references' FP8 projections, what Monokernel packs and launches for FP8
weights, and the gate's FP8 refusals. Fresh random weights each run (the seed is in the failure message).

Tolerances: the FP8 references against an fp32 model on the dequantised weights differ by the bf16 rounding of
every stage's output, as the bf16 references against Hugging Face (tests/test_monokernel_cpu.py: rel 3e-2)."""

from __future__ import annotations

import dataclasses
import math
import random
import struct
import types

import pytest

torch = pytest.importorskip("torch")

from kog_backend.monokernel import host, layout, plan, reference, synthetic  # noqa: E402
from kog_backend.path import quant_format  # noqa: E402
from kog_backend.path.gate import monokernel as mk_gate  # noqa: E402
from kog_backend.reference import fp8_linear, torch_step  # noqa: E402
from kog_backend.tools.fixtures.fp8_checkpoints import E4M3_MAX  # noqa: E402

CPU = torch.device("cpu")
LAYOUTS = quant_format.LAYOUTS
PROJ = (("qkv", "qkv_scale"), ("o_proj", "o_scale"), ("gate_up", "gate_up_scale"), ("down", "down_scale"))
C = layout.CONFIG


def _seed() -> int:
    return random.randrange(2**31)


def _tiny(arch="qwen3", L=2, H=256, nh=4, nkv=2, D=64, I=384, V=512):  # noqa: E741
    return dataclasses.replace(synthetic.make_shape(arch, L, H, nh, nkv, D, I, V, arch != "llama"), max_position=64)


# ---- the argument table ------------------------------------------------------------------------------------------


def test_table_has_the_fp8_fields_in_the_header_order():
    assert layout.LAYER_FIELDS[-1] == "qkv_bias"  # the bf16 kernels' layer table is unchanged
    names = [f[0] for f in layout.MODEL_FIELDS]
    i = names.index("slot_bytes")
    assert layout.MODEL_FIELDS[i : i + 3] == (("slot_bytes", "i", 1), ("fp8_scaling", "i", 1), ("fp8_scales", "p", 1))
    assert layout.FP8_SCALE_FIELDS == ("qkv", "o_proj", "gate_up", "down")
    assert layout.FP8_SCALING == {None: 0, "tensor": 1, "channel": 2, "block": 3}
    assert set(layout.FP8_SCALING) - {None} == set(LAYOUTS)


# ---- the plan ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(synthetic.SHAPES))
@pytest.mark.parametrize("sm_count", [132, 78])
def test_plans_with_fp8_weights(name, sm_count):
    """Every synthetic shape (the GPU tests' and benchmarks') plans with one byte per layer weight: the layer
    stages stream K bytes per row, nu at least bf16's, within the shared-memory budget; the bf16 plan is the
    default's."""
    s = synthetic.make_shape(*synthetic.SHAPES[name])
    bf16 = plan.make_plan(s, sm_count)
    assert plan.make_plan(s, sm_count, weight_bytes=2) == bf16
    p = plan.make_plan(s, sm_count, weight_bytes=1)
    assert isinstance(p, plan.Plan), p
    assert p.smem_bytes == C["kHeaderBytes"] + p.work_bytes + p.num_slots * p.slot_bytes <= C["kMaxSmemBytes"]
    assert C["kMinSlots"] <= p.num_slots and p.slot_bytes <= bf16.slot_bytes
    for i, (st, b) in enumerate(zip(p.stages, bf16.stages)):
        lm = i == layout.STAGE_LM
        assert (st.k, st.n, st.pair) == (b.k, b.n, b.pair) and b.elem_bytes == 2
        assert st.elem_bytes == (2 if lm else 1)
        rows = 2 if st.pair else 1
        tail = 0 if lm else plan.fp8_tail_bytes(st.k, st.pair)  # an FP8 chunk's scale spans
        assert st.chunk_bytes == st.nu * rows * st.k * st.elem_bytes + tail <= p.slot_bytes
        assert st.nu == C["kConsumerWarps"] or 2 * st.nu * rows * st.k * st.elem_bytes + tail > p.slot_bytes
        assert st.chunks == math.ceil(st.n / st.nu)
        if not lm:
            assert st.k % 16 == 0 and st.nu >= b.nu and 2 * st.bytes == b.bytes
    assert p.filtered_sampling_reason is None or bf16.filtered_sampling_reason is not None  # FP8 loses no burst


def test_fp8_tail_mirrors_the_kernel():
    """plan's fp8_span_bytes / fp8_tail_bytes against fp8.cuh's values the config op reports (layout.CONFIG, checked
    against the extension by test_monokernel_cpu), and the span for K = 256 .. 27648: max(ceil(K / 128), nu <= 8)
    scales and 3 words either side, in 16-byte units."""
    assert plan.fp8_span_bytes(2048) == layout.CONFIG["fp8_span_bytes_2048"]
    assert plan.fp8_span_bytes(14336) == layout.CONFIG["fp8_span_bytes_14336"]
    assert [plan.fp8_span_bytes(k) for k in (256, 1024, 2048, 8192, 27648)] == [64, 64, 96, 288, 896]
    assert plan.fp8_tail_bytes(2048, True) == 2 * 96 and plan.fp8_tail_bytes(8192, False) == 288
    assert layout.FP8_SCALING == {None: 0, "tensor": layout.CONFIG["kFp8PerTensor"],
                                  "channel": layout.CONFIG["kFp8PerRow"], "block": layout.CONFIG["kFp8Block128"]}


def test_units_per_chunk_counts_bytes():
    # FP8 down rows of FFN 8192: four make 32 KiB, the scale tail does not fit beside them
    assert plan.units_per_chunk(8192, 1) == 2 and plan.units_per_chunk(8192, 1, elem_bytes=1) == 2
    assert plan.units_per_chunk(8192, 1, 33 * 1024, elem_bytes=1) == 4
    assert plan.units_per_chunk(14336, 1) == 1 and plan.units_per_chunk(14336, 1, elem_bytes=1) == 2
    assert plan.units_per_chunk(8, 1) == 8 and plan.units_per_chunk(8, 1, elem_bytes=1) is None
    assert plan.units_per_chunk(24, 1, elem_bytes=1) is None and plan.units_per_chunk(24, 1) == 8
    assert plan.slot_bytes_for(17408) == C["kSlotBytes"]  # an FP8 down row of FFN 17408 fits the default slot


@pytest.mark.parametrize("over,needle", [
    (dict(I=8200), "intermediate_size 8200: the down input length must be a multiple of 16 with FP8 weights"),
    (dict(H=2056, nh=8, nkv=8, D=64), "hidden_size 2056: the qkv input length must be a multiple of 16 with FP8"),
])  # fmt: skip
def test_fp8_needs_inputs_of_whole_16_byte_vectors(over, needle):
    s = _tiny(**over)
    assert isinstance(plan.make_plan(s, 132), plan.Plan)  # bf16: multiples of 8 suffice
    r = plan.make_plan(s, 132, weight_bytes=1)
    assert isinstance(r, str) and r.startswith(needle), r
    with pytest.raises(ValueError, match="weight_bytes 4"):
        plan.make_plan(s, 132, weight_bytes=4)


# ---- synthetic FP8 decoders --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", LAYOUTS)
def test_random_fp8_decoder_quantises_the_bf16_one(fp8):
    seed = _seed()
    s = _tiny("qwen2", I=320)  # gate_up rows 640, down 320 columns: partial 128 x 128 blocks
    bf = synthetic.random_decoder(s, CPU, seed=seed)
    w = synthetic.random_decoder(s, CPU, seed=seed, fp8=fp8)
    assert w.fp8 == fp8 and w.projection_bytes == 1 and bf.fp8 is None
    for t in ("embed", "final_norm", "lm_head", "cos_sin"):
        assert torch.equal(getattr(w, t), getattr(bf, t)), (t, seed)
    for lw, lb in zip(w.layers, bf.layers):
        for t in ("input_norm", "post_norm", "q_norm", "k_norm", "qkv_bias"):
            a, b = getattr(lw, t), getattr(lb, t)
            assert (a is None and b is None) or torch.equal(a, b), (t, seed)
        for name, scale in PROJ:
            q, sc, src = getattr(lw, name), getattr(lw, scale), getattr(lb, name)
            n, k = src.shape
            assert q.dtype == torch.float8_e4m3fn and q.shape == src.shape and q.is_contiguous()
            assert sc.dtype == torch.float32 and sc.is_contiguous()
            assert tuple(sc.shape) == mk_gate.fp8_scale_shapes(fp8, n, k)[0]  # [], [N, 1], [ceil(N/128), ...]
            deq = fp8_linear.dequantise(q, sc, fp8)
            full = fp8_linear.dequantise(torch.ones(n, k).to(torch.float8_e4m3fn), sc, fp8)  # scale per element
            err = (deq - src.float()).abs()
            assert (err <= 2**-4 * src.float().abs() + 2**-10 * full).all(), (name, seed)
            assert (q.float().abs() <= E4M3_MAX).all()
    assert mk_gate.weights_reason(w, CPU) is None
    with pytest.raises(ValueError, match="fp8 'int8'"):
        synthetic.random_decoder(s, CPU, fp8="int8")


# ---- references --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", LAYOUTS)
def test_project_is_fp8_linear_and_bf16_linear(fp8):
    seed = _seed()
    s = _tiny("qwen2")
    bf = synthetic.random_decoder(s, CPU, seed=seed)
    w = synthetic.random_decoder(s, CPU, seed=seed, fp8=fp8)
    x = torch.randn(s.hidden_size, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    lw, lb = w.layers[0], bf.layers[0]
    assert torch.equal(torch_step.project(x, lb, "qkv", None, lb.qkv_bias), torch_step.linear(x, lb.qkv, lb.qkv_bias))
    got = torch_step.project(x, lw, "qkv", fp8, lw.qkv_bias)
    want = (fp8_linear.linear_fp32(x, lw.qkv, lw.qkv_scale, fp8) + lw.qkv_bias.float()).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want), seed
    assert torch.equal(torch_step.project(x, lw, "gate_up", fp8),
                       fp8_linear.linear(x, lw.gate_up, lw.gate_up_scale, fp8))  # fmt: skip


def _dequantised_fp32(w):
    """The fp32 model an FP8 decoder stands for: every tensor in float32, the projections dequantised."""
    def f32(t):
        return t.float() if t is not None else None

    layers = []
    for lw in w.layers:
        deq = {name: fp8_linear.dequantise(getattr(lw, name), getattr(lw, scale), w.fp8) for name, scale in PROJ}
        layers.append(dataclasses.replace(
            lw, input_norm=f32(lw.input_norm), post_norm=f32(lw.post_norm), q_norm=f32(lw.q_norm),
            k_norm=f32(lw.k_norm), qkv_bias=f32(lw.qkv_bias), qkv_scale=None, o_scale=None, gate_up_scale=None,
            down_scale=None, **deq))  # fmt: skip
    return dataclasses.replace(w, layers=layers, embed=w.embed.float(), final_norm=w.final_norm.float(),
                               lm_head=w.lm_head.float(), cos_sin=w.cos_sin.float(), fp8=None)  # fmt: skip


def _caches(shape, blocks, bs, dtype):
    return [torch.full((blocks, bs, shape.num_kv_heads, 2 * shape.head_dim), math.nan, dtype=dtype).permute(0, 2, 1, 3)
            for _ in range(shape.num_layers)]  # fmt: skip


@pytest.mark.parametrize("fp8", LAYOUTS)
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2"])
def test_fp8_reference_step_is_the_dequantised_model(fp8, arch):
    """reference_step and torch_step on FP8 weights against an fp32 model on the dequantised weights. Each
    projection's scales are first multiplied by a different factor (x 0.25 .. x 4, the dequantised model likewise),
    so that a scale read for the wrong projection shows."""
    seed = _seed()
    w = synthetic.random_decoder(_tiny(arch, L=3), CPU, seed=seed, fp8=fp8)
    for lw in w.layers:
        for f, (_, scale) in zip((0.25, 4.0, 0.5, 2.0), PROJ):
            getattr(lw, scale).mul_(f)
    ref_w = _dequantised_fp32(w)
    s, bs, seq_len, splits = w.shape, 4, 11, 3
    caches, caches_ts, caches_ref = _caches(s, 8, bs, torch.bfloat16), _caches(s, 8, bs, torch.bfloat16), \
        _caches(s, 8, bs, torch.float32)  # fmt: skip
    block_table = torch.zeros(8, dtype=torch.int32)
    block_table[:3] = torch.randperm(7, generator=torch.Generator().manual_seed(seed))[:3] + 1
    tokens = torch.randint(0, s.vocab_size, (seq_len,), generator=torch.Generator().manual_seed(seed))
    got, got_ts, want = [], [], []
    for pos in range(seq_len):
        slot = int(block_table[pos // bs]) * bs + pos % bs
        tok = int(tokens[pos])
        r = reference.reference_step(w, caches, tok, pos, slot, block_table, splits)
        got.append(r["logits"].float())
        h = torch_step.decode_hidden(w, caches_ts, torch_step.embed(w, tok), pos, slot, block_table, pos + 1)
        got_ts.append(torch_step.logits(w, h).float())
        h = torch_step.decode_hidden(ref_w, caches_ref, torch_step.embed(ref_w, tok), pos, slot, block_table, pos + 1)
        want.append(torch_step.logits(ref_w, h))
    got, got_ts, want = torch.stack(got), torch.stack(got_ts), torch.stack(want)
    assert torch.isfinite(got).all()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 3e-2, f"FP8 reference vs the dequantised fp32 model: {rel:.2e} (seed {seed})"
    rel_ts = ((got - got_ts).norm() / got_ts.norm()).item()
    assert rel_ts < 2e-2, f"reference vs torch_step: {rel_ts:.2e} (seed {seed})"
    # teacher forcing fed with the reference's own buffers reproduces them (the FP8 stages' wiring)
    e = reference.expected_from_kernel(w, caches, r["layers"], r["logits"], tok, pos, block_table, splits)
    for g, x in zip(r["layers"], e["layers"]):
        for name in ("qkv_out", "q_out", "attn_out", "o_out", "rmid", "act", "down_out", "rin_next"):
            assert torch.equal(g[name], x[name]), name
    assert torch.equal(e["logits"], r["logits"])


def test_fp8_weights_are_not_sharded():
    from kog_backend.monokernel import tp

    w = synthetic.random_decoder(_tiny(), CPU, seed=_seed(), fp8="channel")
    with pytest.raises(ValueError, match="TP = 1 only"):
        tp.shard_decoder(w, 0, 2)


# ---- what Monokernel packs and launches (stand-ins for the extension and the GPU) --------------------------------


def _monokernel(monkeypatch, weights, kv_caches):
    """Monokernel built on CPU tensors: the gate, the SM count, the extension's op and class are stand-ins (the
    gate's own checks are run separately); pinned memory is plain."""
    calls = {"max_grid": [], "launch": []}
    fake_ops = types.SimpleNamespace(monokernel_max_grid=lambda *a: calls["max_grid"].append(a) or 10_000)
    fake_classes = types.SimpleNamespace(MonokernelLaunch=lambda *a: calls["launch"].append(a) or a)
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, pin_memory=False, **k: zeros(*a, **k))
    monkeypatch.setattr(host, "unsupported_reason", lambda *a, **k: None)
    monkeypatch.setattr(host, "_sm_count", lambda device: 132)
    monkeypatch.setattr(host.kog_ops, "ops", lambda: fake_ops)
    monkeypatch.setattr(host.kog_ops, "classes", lambda: fake_classes)
    monkeypatch.setattr(host.kog_ops, "has_op", lambda name: True)
    mk = host.Monokernel(weights, kv_caches, torch.device("cpu", 0), max_model_len=64)
    return mk, calls


def _layer_table(mk) -> list[dict[str, int]]:
    buf = bytes(mk.layer_table.numpy())
    n = len(layout.LAYER_FIELDS)
    rows = struct.unpack("<" + "q" * n * mk.shape.num_layers, buf)
    return [dict(zip(layout.LAYER_FIELDS, rows[i * n : (i + 1) * n])) for i in range(mk.shape.num_layers)]


@pytest.mark.parametrize("fp8", [None, *LAYOUTS])
def test_monokernel_packs_scales_and_launches_the_fp8_kernel(monkeypatch, fp8):
    w = synthetic.random_decoder(_tiny("qwen2"), CPU, seed=_seed(), fp8=fp8)
    mk, calls = _monokernel(monkeypatch, w, synthetic.paged_kv_caches(w.shape, 8, 16, CPU))
    values = layout.unpack_model(bytes(mk.model_table.numpy()))
    assert values["fp8_scaling"] == layout.FP8_SCALING[fp8] and mk.fp8_weights == (fp8 is not None)
    assert mk.plan == plan.make_plan(w.shape, 132, w.projection_bytes)
    assert values["stage_nu"] == [st.nu for st in mk.plan.stages] and values["slot_bytes"] == mk.plan.slot_bytes
    for row, lw in zip(_layer_table(mk), w.layers):
        for name, _ in PROJ:
            assert row[name] == getattr(lw, name).data_ptr()
        assert row["qkv_bias"] == lw.qkv_bias.data_ptr()
    if fp8 is None:
        assert values["fp8_scales"] == 0 and mk.fp8_scale_table is None
    else:  # one Fp8LayerScales row per layer, in FP8_SCALE_FIELDS order
        assert values["fp8_scales"] == mk.fp8_scale_table.data_ptr()
        assert mk.fp8_scale_table.tolist() == [[getattr(lw, scale).data_ptr() for _, scale in PROJ] for lw in w.layers]
    (launch,) = calls["launch"]  # MonokernelLaunch(model_args, scratch, head_dim, heads_per_pass, grid, smem_bytes,
    assert launch[6:] == (1, fp8 is not None, mk.burst_counts, False)  # tp_size, fp8_weights, burst_counts, moe)
    assert [c[-2:] for c in calls["max_grid"]] == [(fp8 is not None, False)] * 2  # greedy and sampled instantiations


def test_the_gate_refuses_fp8_under_tensor_parallelism(monkeypatch):
    monkeypatch.setattr(mk_gate, "device_reason", lambda device, sm_count: None)
    w = synthetic.random_decoder(_tiny(), CPU, seed=_seed(), fp8="block")
    caches = synthetic.paged_kv_caches(w.shape, 8, 16, CPU)
    assert mk_gate.unsupported_reason(w, caches, CPU, sm_count=132) is None
    tp2 = dataclasses.replace(w, shape=dataclasses.replace(w.shape, tp_size=2))
    assert mk_gate.unsupported_reason(tp2, caches, CPU, sm_count=132, tp_world=2) == (
        "fp8 (block 128x128) weights at tensor parallelism 2: not on the kog path yet (the FP8 kernel is TP = 1 only)")
    odd = synthetic.random_decoder(_tiny(I=8 * 41), CPU, seed=_seed(), fp8="tensor")  # 328: not a multiple of 16
    assert mk_gate.unsupported_reason(odd, synthetic.paged_kv_caches(odd.shape, 8, 16, CPU), CPU, sm_count=132) == (
        "intermediate_size 328: the down input length must be a multiple of 16 with FP8 weights (16-byte GEMV vectors "
        "of 16 float8 values)")


def test_fp8_models_need_the_fp8_weights_option(monkeypatch):
    """Until the FP8 kernel has passed its GPU tests, an FP8 model is served stock unless the kog option fp8_weights
    asks for the kernel: select_step refuses before building anything, with the reason the runner records."""
    from kog_backend import ops
    from kog_backend.config import KogConfig
    from kog_backend.engine import step_select

    assert KogConfig().fp8_weights is False and KogConfig.from_dict({"fp8_weights": True}).fp8_weights is True
    assert mk_gate.fp8_option_reason(None, False) is None and mk_gate.fp8_option_reason("channel", True) is None
    off = mk_gate.fp8_option_reason("block", False)
    assert off == "fp8 (block 128x128) weights: the FP8 kernel is off (kog option fp8_weights; not yet verified on a GPU)"
    monkeypatch.setattr(ops, "load_reason", lambda: None)
    w = synthetic.random_decoder(_tiny(), CPU, seed=_seed(), fp8="block")
    caches = synthetic.paged_kv_caches(w.shape, 8, 16, CPU)
    got = step_select.select_step(None, KogConfig(), w, caches, CPU, 64, w.shape.vocab_size, 1, None, None)
    assert got == mk_gate.refused(off)
    # With the option the gate goes on to the device checks (a CPU device: refused there, for another reason).
    got = step_select.select_step(None, KogConfig(fp8_weights=True), w, caches, CPU, 64, w.shape.vocab_size, 1, None,
                                  None)  # fmt: skip
    assert isinstance(got, str) and "fp8_weights" not in got


@pytest.mark.parametrize("name,slots,nu_base,nu_full", [
    ("llama-3.2-1b", 6, [8, 8, 4, 2], [8, 8, 8, 4]),
    ("llama-3.1-8b", 5, [4, 4, 2, 2], [8, 8, 4, 2]),
    ("qwen3-4b", 6, [8, 4, 4, 2], [8, 8, 4, 2]),
])  # fmt: skip
def test_fp8_full_slots_double_the_short_chunks(name, slots, nu_base, nu_full):
    """With kSlotBytes slots an FP8 chunk's scale tail keeps nu at half what the rows alone would allow wherever
    those rows fill exactly one slot (K = 4,096: 4 QKV / O rows of Llama-3.1-8B; K = 2,048: 4 gate/up pairs of the
    1B); fp8_full_slots adds the largest tail to the slot, the stages' nu double there (up to kConsumerWarps), and
    the shared memory holds `slots` of them. bf16 plans ignore the option."""
    s = synthetic.make_shape(*synthetic.SHAPES[name], max_position=4096)
    base = plan.make_plan(s, 132, weight_bytes=1)
    full = plan.make_plan(s, 132, weight_bytes=1, fp8_full_slots=True)
    assert isinstance(base, plan.Plan) and isinstance(full, plan.Plan)
    assert [st.nu for st in base.stages[:4]] == nu_base and [st.nu for st in full.stages[:4]] == nu_full
    assert full.slot_bytes % 128 == 0 and C["kSlotBytes"] < full.slot_bytes < C["kSlotBytes"] + 1024
    assert full.num_slots == slots and full.smem_bytes <= C["kMaxSmemBytes"]
    for st in full.stages[:4]:
        assert plan.chunk_bytes(st.k, st.nu, st.pair, st.elem_bytes) <= full.slot_bytes
    assert plan.make_plan(s, 132, fp8_full_slots=True) == plan.make_plan(s, 132)
