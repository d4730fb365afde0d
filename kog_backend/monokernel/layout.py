"""Python mirror of the monokernel's argument table (csrc/include/kog/args.cuh) and tunables (config.cuh).

Every struct field is 8 bytes (int64, double or a device pointer), so a struct packs as a flat little-endian list.
tests/test_monokernel_cpu.py checks these lists against the headers and, when the extension is built, against
the kog::monokernel_layout / kog::monokernel_config ops.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

NUM_STAGES = 5
# Query heads one tensor-core attention pass can take (kog::kMmaColumns, attention_mma.cuh).
MMA_COLUMNS = 8
STAGE_QKV, STAGE_O, STAGE_GU, STAGE_DOWN, STAGE_LM = range(NUM_STAGES)
STAGE_NAMES = ("qkv", "o", "gate_up", "down", "lm_head")

# (name, kind, count): kind 'i' int64, 'd' double, 'p' device pointer.
MODEL_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("num_layers", "i", 1),
    ("hidden", "i", 1),
    ("num_heads", "i", 1),
    ("num_kv_heads", "i", 1),
    ("head_dim", "i", 1),
    ("inter", "i", 1),
    ("block_size", "i", 1),
    ("num_splits", "i", 1),
    ("grid", "i", 1),
    ("num_slots", "i", 1),
    ("qk_norm", "i", 1),
    ("max_position", "i", 1),
    ("work_bytes", "i", 1),
    ("prefetch_chunks", "i", 1),
    ("stage_end_copies", "i", 1),
    ("attn_end_copies", "i", 1),
    ("attn_single_ctx", "i", 1),
    ("stall_prefetch_chunks", "i", 1),
    ("max_inflight", "i", 1),
    ("tagged_handoffs", "i", 1),
    ("stage_k", "i", NUM_STAGES),
    ("stage_n", "i", NUM_STAGES),
    ("stage_nu", "i", NUM_STAGES),
    ("stage_chunks", "i", NUM_STAGES),
    ("kv_stride_block", "i", 1),
    ("kv_stride_pos", "i", 1),
    ("kv_stride_head", "i", 1),
    ("rms_eps", "d", 1),
    ("attn_scale_log2", "d", 1),
    ("embed", "p", 1),
    ("final_norm", "p", 1),
    ("lm_head", "p", 1),
    ("cos_sin", "p", 1),
    ("layers", "p", 1),
    ("counters", "p", 1),
    ("argmax_slots", "p", 1),
    ("logits_scratch", "p", 1),
    ("act_tagged", "p", 1),
    ("trace", "p", 1),
    ("tp_size", "i", 1),
    ("tp_rank", "i", 1),
    ("vocab_start", "i", 1),
    ("tp_parts", "p", 1),
    ("tp_keys", "p", 1),
    ("tp_delta", "i", 8),
    ("sample_work", "p", 1),
    ("status_out", "p", 1),
    ("inject_fault", "i", 1),
    ("slot_bytes", "i", 1),
    ("fp8_scaling", "i", 1),
    ("fp8_scales", "p", 1),
    ("attn_mode", "i", 1),
    ("attn_prefetch", "i", 1),
    # mixture of experts (args.cuh; moe_top_k 0: a dense model)
    ("moe_top_k", "i", 1),
    ("moe_experts", "i", 1),
    ("moe_norm_topk", "i", 1),
    ("moe_inter", "i", 1),
    ("moe_router_nu", "i", 1),
    ("moe_router_chunks", "i", 1),
    ("moe_ctr_base", "i", 1),
    ("moe_routers", "p", 1),
    ("moe_logits", "p", 1),
    ("moe_route", "p", 1),
)

LAYER_FIELDS: tuple[str, ...] = (
    "input_norm", "qkv", "q_norm", "k_norm", "o_proj", "post_norm", "gate_up", "down",
    "k_cache", "v_cache",
    "qkv_out", "q_out", "attn_ml", "attn_acc", "attn_out", "o_out", "rmid", "act", "down_out", "rin_next",
    "qkv_bias",
)  # fmt: skip

# kog::Fp8LayerScales (args.cuh): one row per layer of ModelArgs::fp8_scales, the four projections' scale pointers.
FP8_SCALE_FIELDS: tuple[str, ...] = ("qkv", "o_proj", "gate_up", "down")

# ModelArgs::fp8_scaling by DecoderWeights.fp8 (fp8.cuh Fp8Scaling: kFp8None, kFp8PerTensor, kFp8PerRow,
# kFp8Block128): how the four projections' fp32 scales multiply their float8 e4m3 weights, for a projection of N rows
# and K columns: none (bf16 weights); one scale s[0]; one per output row s[n] (vLLM's [N, 1]); one per 128 x 128
# block s[n // 128, k // 128] ([ceil(N / 128), ceil(K / 128)] row-major).
FP8_SCALING: dict[str | None, int] = {None: 0, "tensor": 1, "channel": 2, "block": 3}


def tagged_layer_words(inter: int, num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """int32 words of one layer's tagged act | qkv_out | attn_out (kog::tagged_layer_words, tagged.cuh); CONFIG's
    tagged_layer_words_* entries check the formula against the extension at two shapes."""
    return inter + (num_heads + 2 * num_kv_heads) * head_dim + num_heads * head_dim


# kog::MonoConfig and derived constants, in the order kog::monokernel_config() returns them.
CONFIG: dict[str, int] = {
    "kConsumerWarps": 8,
    "kThreads": 384,
    "kSlotBytes": 32 * 1024,
    "kMaxSlots": 12,
    "kMinSlots": 2,
    "kMaxSmemBytes": 227 * 1024,
    "kHeaderBytes": 5120,
    "kBtCacheEntries": 512,
    "kMaxResidRows": 256,
    "kPrefetchChunks": 0,
    "kWarpStride": 256,
    "kMaxHidden": 8192,
    "kHeadsPerPass": 4,
    "kAttnUnroll": 4,
    "kCombineBatch": 16,
    "kNumStages": NUM_STAGES,
    "kCounterStride": 8,
    "kVersion": 2,
    "attn_work_floats_64": 40 * 64 + 64,
    "attn_work_floats_128": 40 * 128 + 64,
    "kCtrLayerBase": 13,
    "layer_counter_count_0": 5,
    "kTraceEvents": 18,
    "kMaxTP": 8,
    "kCtrTpLM": 9,
    "kStageEndCopies": 2,
    "kAttnEndCopies": 12,
    "kHandoffQueue": 16,
    "kAttnSingleCtx": 64,
    "kStallPrefetchChunks": 0,
    "kTaggedHandoffs": 0,
    "kTaggedBatch": 4,
    "kTaggedBuild": 0,  # 1 in a -DKOG_TAGGED_HANDOFFS=1 benchmark build (whose tests/test_monokernel_cpu.py then fails)
    "kMaxInflight": 2,
    "kAttnShortLen": 32,
    "tagged_layer_words_8192_32_8_64": tagged_layer_words(8192, 32, 8, 64),
    "tagged_layer_words_6144_16_8_128": tagged_layer_words(6144, 16, 8, 128),
    # burst_sampling.cuh: the grid's level histogram, bins, cut and split-level rows (bytes); a block's shared
    # memory past its rows.
    "sample_grid_bytes": 65536 * 4 + 256 * 4 + 256 * 8 + 32 + 256 * 4 * 8 + 256 * 4,
    "sample_smem_fixed": 256 * 12 * 2 + 3 * 256 * 4 + 64 * 8,
    "kCtrSampleArrive": 10,
    "kSlotAlign": 1024,
    # fp8.cuh: bytes of one half's scale span in an FP8 chunk's slot (plan.fp8_span_bytes) at two row lengths, and
    # the FP8 scaling modes (FP8_SCALING).
    "fp8_span_bytes_2048": 96,
    "fp8_span_bytes_14336": 480,
    "kFp8PerTensor": 1,
    "kFp8PerRow": 2,
    "kFp8Block128": 3,
    "kAttnMode": 2,
    "kAttnModeRounds": 0,
    "kAttnModeMma": 1,
    "kAttnModeMmaWide": 2,
    "kAttnTileLen": 16,
    "kAttnPrefetchRounds": 2,
    "kAttnMaxPrefetchRounds": 4,
}
CONFIG_NAMES = tuple(CONFIG)

# kog::TraceEvent (trace.cuh), in value order; row num_layers of a token reuses the first three for the LM head.
TRACE_EVENTS: tuple[str, ...] = (
    "kEvQkvReady", "kEvQkvDone", "kEvAttnReady", "kEvAttnDone", "kEvOReady", "kEvODone", "kEvGuReady",
    "kEvGuDone", "kEvDownReady", "kEvDownDone", "kEvLoaderLayer", "kEvQkvLanded", "kEvOLanded", "kEvGuLanded",
    "kEvDownLanded", "kEvAttnQ", "kEvAttnKV", "kEvAttnPart",
)  # fmt: skip


def attn_work_floats(head_dim: int) -> int:
    """Shared-memory floats the attention task uses (kog::attn_work_floats): kAttnQRows (8: a tensor-core pass's
    columns) rows of q, then the warps' m, l and acc of kHeadsPerPass heads."""
    c = CONFIG
    return max(c["kHeadsPerPass"], MMA_COLUMNS) * head_dim + 2 * c["kConsumerWarps"] * c["kHeadsPerPass"] + (
        c["kConsumerWarps"] * c["kHeadsPerPass"] * head_dim
    )


def sample_smem_bytes(rows: int) -> int:
    """Work-area bytes a block needs to draw a filtered token over `rows` LM-head rows (kog::burst::smem_bytes)."""
    return -(-rows * 2 // 16) * 16 + -(-rows * 4 // 16) * 16 + CONFIG["sample_smem_fixed"]


def num_counters(num_layers: int, num_kv_heads: int) -> int:
    """uint32 words of the counter buffer (kog::num_counters x kCounterStride)."""
    per_layer = CONFIG["layer_counter_count_0"] + num_kv_heads
    return (CONFIG["kCtrLayerBase"] + num_layers * per_layer) * CONFIG["kCounterStride"]


def model_offsets() -> list[int]:
    """Byte offset of each MODEL_FIELDS entry (one per field, arrays at their first element)."""
    out, off = [], 0
    for _, _, count in MODEL_FIELDS:
        out.append(off)
        off += 8 * count
    return out


def model_size() -> int:
    return 8 * sum(count for _, _, count in MODEL_FIELDS)


def layer_size() -> int:
    return 8 * len(LAYER_FIELDS)


def expected_layout() -> list[int]:
    """What kog::monokernel_layout() returns for these structs: sizes of ModelArgs and LayerArgs, then every
    field's byte offset."""
    return [model_size(), layer_size()] + model_offsets() + [8 * i for i in range(len(LAYER_FIELDS))]


# MonoConfig constants a benchmark build may change (KOG_NVCC_FLAGS) without changing what the host packs.
BUILD_FLAG_CONSTANTS = ("kTaggedBuild",)


def extension_mismatch(kog_ops) -> str | None:
    """Why the loaded extension (kog_ops: torch.ops.kog) cannot take this module's tables, or None (the gate's
    reason, kog_backend.path.gate.extension). An extension built from other sources reads the argument table at other offsets, or plans shared memory with other
    constants: its kernel would produce garbage, so the monokernel must not run (the stock path serves)."""
    from kog_backend.path.gate import extension

    if not hasattr(kog_ops, "monokernel_layout") or not hasattr(kog_ops, "monokernel_config"):
        return extension.mismatch_reason(False, False, [], 0, len(CONFIG))
    if list(kog_ops.monokernel_layout()) != expected_layout():
        return extension.mismatch_reason(True, False, [], 0, len(CONFIG))
    got = list(kog_ops.monokernel_config())
    differ = [name for name, g in zip(CONFIG_NAMES, got) if g != CONFIG[name] and name not in BUILD_FLAG_CONSTANTS]
    return extension.mismatch_reason(True, True, differ, len(got), len(CONFIG))


def tp_fields_error(values: Mapping[str, object]) -> str | None:
    """Why a ModelArgs table's tensor-parallel fields break args.cuh's invariants, or None. A TP launch adds
    tp_delta[q] to its own shared-buffer addresses to reach rank q's copy, the rank's own included, so
    tp_delta[tp_rank] must be 0 even with tp_size 1 (bench_tp_monokernel.py's no-exchange table once kept rank 1's
    deltas: its signals went into rank 0's counters and its own waits timed out)."""
    w, r = int(values["tp_size"]), int(values["tp_rank"])  # type: ignore[call-overload]
    delta = [int(d) for d in values["tp_delta"]]  # type: ignore[attr-defined]
    if not 1 <= w <= CONFIG["kMaxTP"]:
        return f"tp_size {w} outside 1..{CONFIG['kMaxTP']}"
    if not 0 <= r < w:
        return f"tp_rank {r} outside 0..{w - 1}"
    if delta[r] != 0:
        return f"tp_delta[{r}] = {delta[r]}, not 0: rank {r}'s own buffer would be another rank's"
    return None


def pack_model(values: Mapping[str, object]) -> bytes:
    """ModelArgs as the kernel reads it; ValueError for a wrong count of values or broken TP fields."""
    err = tp_fields_error(values)
    if err is not None:
        raise ValueError(f"ModelArgs: {err}")
    fmt, flat = "<", []
    for name, kind, count in MODEL_FIELDS:
        v = values[name]
        items = list(v) if count > 1 else [v]  # type: ignore[arg-type]
        if len(items) != count:
            raise ValueError(f"{name}: {count} values expected, got {len(items)}")
        fmt += ("d" if kind == "d" else "q") * count
        flat += [float(x) if kind == "d" else int(x) for x in items]  # type: ignore[arg-type]
    return struct.pack(fmt, *flat)


def pack_layers(layers: Sequence[Mapping[str, int]]) -> bytes:
    return b"".join(struct.pack("<" + "q" * len(LAYER_FIELDS), *(int(lw[n]) for n in LAYER_FIELDS)) for lw in layers)


def unpack_model(buf: bytes) -> dict[str, object]:
    out: dict[str, object] = {}
    off = 0
    for name, kind, count in MODEL_FIELDS:
        vals = struct.unpack_from("<" + ("d" if kind == "d" else "q") * count, buf, off)
        out[name] = list(vals) if count > 1 else vals[0]
        off += 8 * count
    return out
