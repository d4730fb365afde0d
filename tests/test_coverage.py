"""Every published dense Llama 3.x, Qwen2.5(-Coder), Qwen3 and Mistral-7B config (tools/fixtures/shapes.
MODEL_CONFIGS) through the gate's config checks and the tile plan: each one tiles, within the layout's static
budgets (shared memory, slots, residual rows, norm registers, attention splits); what does not tile or is not
supported is refused with a reason naming the config field; memory fit per card."""

from __future__ import annotations

import copy
import math

import pytest

from kog_backend.monokernel import layout, plan
from kog_backend.path import coverage
from kog_backend.tools.fixtures import shapes

C = layout.CONFIG
NAMES = sorted(shapes.MODEL_CONFIGS)


def test_catalogue_lists_every_size_of_the_families():
    want = {f"Qwen/Qwen3-{s}" for s in ("0.6B", "1.7B", "4B", "8B", "14B", "32B")}
    for s in ("0.5B", "1.5B", "3B", "7B", "14B", "32B"):
        want |= {f"Qwen/Qwen2.5-{s}-Instruct", f"Qwen/Qwen2.5-Coder-{s}-Instruct"}
    want |= {"meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
             "mistralai/Mistral-7B-Instruct-v0.3"}  # fmt: skip
    assert set(NAMES) == want


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sm_count", [132, 78])  # H100 SXM / H200; H100 PCIe-class grids have fewer SMs
def test_every_listed_model_tiles_within_the_static_budgets(name, sm_count):
    cfg = shapes.MODEL_CONFIGS[name]
    v = coverage.verdict(cfg, sm_count)
    assert v.ok, f"{name}: {v.reason}"
    s, p = v.shape, v.plan
    assert s.qkv_bias == (cfg["model_type"] == "qwen2") and s.qk_norm == (cfg["model_type"] == "qwen3")
    # shared memory: header + work area + ring within the 227 KiB a block may use; at least kMinSlots slots
    assert p.smem_bytes == C["kHeaderBytes"] + p.work_bytes + p.num_slots * p.slot_bytes <= C["kMaxSmemBytes"]
    assert C["kMinSlots"] <= p.num_slots <= C["kMaxSlots"]
    assert p.slot_bytes % C["kSlotAlign"] == 0 and p.slot_bytes >= C["kSlotBytes"]
    # the work area holds the longest input vector and the attention scratch
    assert p.work_bytes >= 2 * max(s.hidden_size, s.q_size, s.intermediate_size)
    assert p.work_bytes >= 4 * layout.attn_work_floats(s.head_dim)
    assert s.hidden_size <= C["kMaxHidden"] and s.head_dim in (64, 128)
    expect_k = (s.hidden_size, s.q_size, s.hidden_size, s.intermediate_size, s.hidden_size)
    expect_n = ((s.num_heads + 2 * s.num_kv_heads) * s.head_dim, s.hidden_size, s.intermediate_size, s.hidden_size,
                s.vocab_size)  # fmt: skip
    for st, k, n in zip(p.stages, expect_k, expect_n):
        rows = 2 if st.pair else 1
        assert (st.k, st.n) == (k, n)
        assert st.k % 8 == 0  # whole 16-byte vectors (gemv.cuh)
        assert st.nu & (st.nu - 1) == 0 and 1 <= st.nu <= C["kConsumerWarps"]
        assert st.nu * rows * st.k * 2 <= p.slot_bytes  # a chunk fits its slot
        assert st.nu == C["kConsumerWarps"] or 2 * st.nu * rows * st.k * 2 > p.slot_bytes  # and is the largest that does
        assert st.chunks * st.nu >= st.n > (st.chunks - 1) * st.nu
    for i in (layout.STAGE_O, layout.STAGE_DOWN):  # residual rows a block preloads
        assert math.ceil(p.stages[i].chunks / sm_count) * p.stages[i].nu <= C["kMaxResidRows"]
    assert 1 <= p.num_splits and p.num_splits * s.num_kv_heads <= sm_count
    assert p.heads_per_pass == plan.heads_per_pass(s.gqa_ratio)
    assert p.filtered_sampling_reason is None  # top-k / top-p bursts run on every listed shape
    # the three shapes measured before keep the default slot and the even split (the former schedule)
    if name in ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-1.7B"):
        assert p.slot_bytes == C["kSlotBytes"]
        assert all(st.k * st.nu % (C["kConsumerWarps"] * C["kWarpStride"]) == 0 for st in p.stages)


def test_enlarged_slots_only_where_a_row_does_not_fit():
    big = {n for n in NAMES if coverage.verdict(shapes.MODEL_CONFIGS[n]).plan.slot_bytes > C["kSlotBytes"]}
    assert big == {"Qwen/Qwen3-14B", "Qwen/Qwen3-32B", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct",
                   "Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-Coder-32B-Instruct"}  # fmt: skip
    for n in big:
        assert shapes.MODEL_CONFIGS[n]["intermediate_size"] * 2 > C["kSlotBytes"]


@pytest.mark.parametrize("name", NAMES)
def test_memory_fit_on_an_h100(name):
    """Every listed model fits an 80 GB H100 at vLLM's default utilisation; the 32B ones with a short context
    only (~29k tokens), which the doctor states."""
    fit = coverage.memory_fit(shapes.MODEL_CONFIGS[name], coverage.GPU_MEMORY["h100"])
    assert fit.fits
    if "32B" in name:
        assert 8192 <= fit.max_context < 40960
        assert fit.weights > 60 * 1024**3


def test_memory_that_does_not_fit_is_stated():
    cfg = dict(shapes.MODEL_CONFIGS["Qwen/Qwen2.5-32B-Instruct"], num_hidden_layers=80)  # a 40B-class model
    fit = coverage.memory_fit(cfg, coverage.GPU_MEMORY["h100"])
    assert not fit.fits and "does not fit" in fit.describe(0.9)
    assert coverage.memory_fit(cfg, coverage.GPU_MEMORY["h200"]).fits


@pytest.mark.parametrize("qcfg", [
    {"quant_method": "fp8", "activation_scheme": "dynamic"},
    {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
])
def test_fp8_weights_count_one_byte_per_projection_weight(qcfg):
    """Llama-3.1-8B: 6.98e9 projection parameters of 8.03e9; FP8 keeps embedding and LM head (2 x 0.525e9) in bf16."""
    cfg = shapes.MODEL_CONFIGS["meta-llama/Llama-3.1-8B-Instruct"]
    bf16 = coverage.weight_bytes(cfg)
    proj = 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336)  # 32 layers' q, o, k, v, gate, up, down
    fp8 = coverage.weight_bytes(dict(cfg, quantization_config=qcfg))
    assert fp8 == bf16 - proj
    assert 0.55 < fp8 / bf16 < 0.57  # (8.03e9 * 2 - 6.98e9) / (8.03e9 * 2)
    assert coverage.memory_fit(dict(cfg, quantization_config=qcfg), coverage.GPU_MEMORY["h100"]).weights == fp8
    assert coverage.weight_bytes(dict(cfg, quantization_config={"quant_method": "awq"})) == bf16  # refused anyway


FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sm_count", [132, 78])
def test_every_listed_model_tiles_with_fp8_weights(name, sm_count):
    """With FP8 projections (one byte per weight) every listed model tiles: each layer stage reads K bytes per row
    (K a multiple of 16: 16 float8 values per 16-byte vector) and the chunk's scales (fp8_tail_bytes), as many units
    per chunk as bf16 or more, in the same
    shared-memory budget; the LM head stays bf16 (in the ring's slot, which FP8 rows may leave at kSlotBytes where
    bf16 rows enlarged it: then its chunks are smaller than the bf16 model's)."""
    bf16 = coverage.verdict(shapes.MODEL_CONFIGS[name], sm_count)
    v = coverage.verdict(dict(shapes.MODEL_CONFIGS[name], quantization_config=FP8_BLOCK), sm_count)
    assert v.ok, f"{name}: {v.reason}"
    p = v.plan
    assert p.smem_bytes == C["kHeaderBytes"] + p.work_bytes + p.num_slots * p.slot_bytes <= C["kMaxSmemBytes"]
    assert C["kMinSlots"] <= p.num_slots and p.num_slots >= bf16.plan.num_slots
    for i, (st, b) in enumerate(zip(p.stages, bf16.plan.stages)):
        rows = 2 if st.pair else 1
        assert (st.k, st.n, st.pair) == (b.k, b.n, b.pair)
        assert st.elem_bytes == (2 if i == layout.STAGE_LM else 1)
        assert st.k * st.elem_bytes % 16 == 0
        assert st.nu >= b.nu or (i == layout.STAGE_LM and p.slot_bytes < bf16.plan.slot_bytes)
        tail = plan.fp8_tail_bytes(st.k, st.pair) if st.elem_bytes == 1 else 0  # an FP8 chunk's scales
        assert st.chunk_bytes == st.nu * rows * st.k * st.elem_bytes + tail <= p.slot_bytes
        assert st.nu == C["kConsumerWarps"] or 2 * st.nu * rows * st.k * st.elem_bytes + tail > p.slot_bytes
        assert st.bytes == st.n * st.k * st.elem_bytes * rows
    assert p.slot_bytes <= bf16.plan.slot_bytes
    if p.slot_bytes == bf16.plan.slot_bytes:
        assert p.stages[layout.STAGE_LM] == bf16.plan.stages[layout.STAGE_LM]


def _with(name, **fields):
    cfg = copy.deepcopy(shapes.MODEL_CONFIGS[name])
    cfg.update(fields)
    return cfg


@pytest.mark.parametrize(
    "cfg,needle",
    [
        (_with("Qwen/Qwen3-4B", architectures=["Qwen3MoeForCausalLM"]), "architectures"),
        (_with("Qwen/Qwen2.5-7B-Instruct", use_sliding_window=True), "sliding_window 32768"),
        (_with("mistralai/Mistral-7B-Instruct-v0.3", sliding_window=4096), "sliding_window 4096"),
        (_with("Qwen/Qwen2.5-Coder-32B-Instruct", rope_scaling={"type": "yarn", "factor": 4.0,
                                                              "original_max_position_embeddings": 32768}),
         "rope_scaling 'yarn'"),
        (_with("Qwen/Qwen3-8B", head_dim=256), "head_dim 256"),
        (_with("Qwen/Qwen3-8B", hidden_size=4100), "hidden_size 4100"),
        (_with("Qwen/Qwen3-8B", intermediate_size=12290), "intermediate_size 12290"),
        (_with("Qwen/Qwen3-8B", intermediate_size=120000), "shared memory: intermediate_size 120000"),
        (_with("Qwen/Qwen3-8B", num_attention_heads=30), "num_attention_heads 30"),
        (_with("meta-llama/Llama-3.1-8B-Instruct", attention_bias=True), "attention_bias"),
        (_with("meta-llama/Llama-3.1-8B-Instruct", mlp_bias=True), "mlp_bias"),
        (_with("Qwen/Qwen3-8B", quantization_config={"quant_method": "fp8", "activation_scheme": "static"}),
         "quantization_config fp8 with static activation scales"),
        (_with("Qwen/Qwen3-8B", quantization_config={"quant_method": "gptq", "bits": 4}), "quantization_config gptq"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(cfg, needle):
    v = coverage.verdict(cfg)
    assert not v.ok and needle in v.reason, v.reason


def test_checkpoint_shapes_are_the_published_configs():
    """make-checkpoint's representatives carry the catalogue's config (Mistral: its token ids are ours)."""
    pairs = {"qwen3-4b": "Qwen/Qwen3-4B", "qwen3-14b": "Qwen/Qwen3-14B", "qwen3-32b": "Qwen/Qwen3-32B",
             "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
             "qwen2.5-coder-7b": "Qwen/Qwen2.5-Coder-7B-Instruct",
             "qwen2.5-coder-32b": "Qwen/Qwen2.5-Coder-32B-Instruct", "llama-3.2-3b": "meta-llama/Llama-3.2-3B-Instruct",
             "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct", "qwen3-1.7b": "Qwen/Qwen3-1.7B",
             "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3"}  # fmt: skip
    for shape, model in pairs.items():
        a, b = shapes.get_shape(shape), copy.deepcopy(shapes.MODEL_CONFIGS[model])
        if shape == "mistral-7b":
            for k in ("bos_token_id", "eos_token_id"):
                a.pop(k), b.pop(k)
        assert a == b, shape
