// The monokernel's compile-time tunables. kog_backend/monokernel/layout.py mirrors them (checked by
// tests/test_monokernel_cpu.py through the kog::monokernel_config op).
#pragma once

#include <cstdint>

namespace kog {

struct MonoConfig {
  // Block shape: warps 0..kConsumerWarps-1 compute (two warpgroups); a third warpgroup's first warp streams the
  // weights (one elected lane), its other three exit at once. The third warpgroup exists for setmaxnreg, which
  // moves registers per warpgroup (docs/tuning.md).
  static constexpr int kConsumerWarps = 8;
  static constexpr int kConsumerThreads = kConsumerWarps * 32;
  static constexpr int kThreads = kConsumerThreads + 128;
  static constexpr int kLoaderWarp = kConsumerWarps;
  // Registers per thread after the role split (setmaxnreg): the loader's warpgroup gives registers back, the
  // consumers' take them; the two together fit the 64 K register file (docs/tuning.md).
  static constexpr int kLoaderRegs = 56;
  static constexpr int kConsumerRegs = 224;

  // Weight ring in shared memory: up to kMaxSlots slots of kSlotBytes bytes; the launcher uses as many as fit next
  // to the input-vector buffer (6 for the three target shapes: 192 KiB per SM, ~6 us of one SM's share of HBM
  // bandwidth). kMinSlots: the smallest ring it accepts (docs/tuning.md).
  // kSlotBytes is the slot of every shape whose rows fit it; a shape with a longer row (a down row of FFN 17408 and
  // up: Qwen3-14B, Qwen2.5-7B/32B) gets slots of its longest row rounded up to kSlotAlign (ModelArgs::slot_bytes,
  // plan.py), and accordingly fewer of them.
  static constexpr int kSlotBytes = 32 * 1024;
  static constexpr int kSlotAlign = 1024;
  static constexpr int kMaxSlots = 12;
  static constexpr int kMinSlots = 2;
  // Dynamic shared memory a block may use on sm_90 (227 KiB).
  static constexpr int kMaxSmemBytes = 227 * 1024;
  // Fixed shared-memory header (SmemHeader in smem_header.cuh): mbarriers, reduction scratch, broadcast words and
  // the block-table entries of this block's attention split (kBtCacheEntries x block_size positions).
  static constexpr int kHeaderBytes = 5120;  // (<= 7 KiB: Llama-3.1-8B keeps 6 slots)
  static constexpr int kBtCacheEntries = 512;
  // Residual values (rows) a block preloads for its O / down epilogues in one stage (docs/tuning.md).
  static constexpr int kMaxResidRows = 256;
  // Default of ModelArgs::prefetch_chunks: chunks the loader keeps on their way into L2 beyond the ring (0: none;
  // a benchmark variant, docs/tuning.md).
  static constexpr int kPrefetchChunks = 0;
  // Defaults of ModelArgs::stage_end_copies / attn_end_copies, the loader's hold around a block's hand-offs
  // (handoff_hold.cuh), in chunks issued past the block's last chunk of the stage (attention: of QKV) before the
  // hand-off is made; kMaxSlots: no hold. The loader applies the stage-end hold as max(h, num_slots - the block's
  // chunks of the stage), and none at a tagged QKV hand-off (no release there) (docs/tuning.md).
  static constexpr int kStageEndCopies = 2;
  static constexpr int kAttnEndCopies = kMaxSlots;
  // Hand-offs the loader keeps armed: <= kMaxSlots + 1 stage ends (each but the one being signalled has a chunk in
  // the ring) and one attention split.
  static constexpr int kHandoffQueue = 16;
  // Default of ModelArgs::attn_single_ctx, in positions: contexts up to it take one attention split per KV head
  // (no partials, no combine hand-off), longer ones num_splits (docs/tuning.md).
  static constexpr int kAttnSingleCtx = 64;
  // Default of ModelArgs::stall_prefetch_chunks: chunks the loader sends towards L2 while it waits for a free slot
  // (the chunk it waits to copy first); unlike kPrefetchChunks' constant lead it adds no request while the ring
  // streams. 0: none (a benchmark variant, docs/tuning.md).
  static constexpr int kStallPrefetchChunks = 0;
  // Default of ModelArgs::max_inflight: bulk copies the loader keeps in flight per SM (0 or >= num_slots: no cap,
  // every free slot's copy issued at once) (docs/tuning.md).
  static constexpr int kMaxInflight = 2;
  // Default of ModelArgs::tagged_handoffs (tagged.cuh), a bit mask of optional tagged hand-offs: 0, none. The
  // attention chain (QKV -> attention -> O) goes through tagged words in every TP = 1 kernel
  // (tagged_attention_chain); the counter versions of those two hand-offs are compiled only into the TP kernel.
  // Bit kTaggedGateUp (gate/up -> down) exists only in builds with -DKOG_TAGGED_HANDOFFS=1 (KOG_NVCC_FLAGS);
  // without the flag the bit is ignored (docs/tuning.md).
  static constexpr int kTaggedHandoffs = 0;
#ifdef KOG_TAGGED_HANDOFFS
  static constexpr bool kTaggedBuild = KOG_TAGGED_HANDOFFS != 0;
#else
  static constexpr bool kTaggedBuild = false;
#endif
  // 16-byte loads a consumer thread keeps in flight per round while it polls tagged words (4 words each): 4 = 16
  // registers (docs/tuning.md).
  static constexpr int kTaggedBatch = 4;

  // GEMV: a warp's share of one row is a multiple of this many bf16 (32 lanes x 8 elements = one 16 B load each).
  static constexpr int kWarpStride = 32 * 8;
  // Chunks whose epilogues a block runs together (consume_stage): per chunk the consumer warps only compute and
  // leave their partial sums in shared memory; every kEpilogueBatch chunks one barrier, then one thread per output
  // unit sums its parts and runs the epilogue (docs/tuning.md).
  static constexpr int kEpilogueBatch = 8;
  // Hidden sizes the norm keeps in registers: H <= kMaxNormIters * kConsumerThreads * 8.
  static constexpr int kMaxNormIters = 4;
  static constexpr int kMaxHidden = kMaxNormIters * kConsumerThreads * 8;

  // Attention: query heads of one KV head handled per pass at most (GQA 8 = two passes over the KV split; each
  // kernel is built for one pass width HP <= this, chosen by plan.heads_per_pass), and positions each lane group
  // loads ahead (16 B of K and of V each) (docs/tuning.md).
  static constexpr int kHeadsPerPass = 4;
  static constexpr int kAttnUnroll = 4;
  // Splits of at most this many positions take a pass unrolled just enough for one round (attention.cuh): 32 / 16
  // positions per round for head dim 64 / 128, so unroll 1 / 2 instead of kAttnUnroll. The attention code runs once
  // per layer on few SMs and starts cold in the instruction cache; the short body fetches and computes only the
  // positions a round holds (docs/tuning.md).
  static constexpr int kAttnShortLen = 32;
  // Positions of one tensor-core attention tile (the mma's m = 16); longer splits start on its multiples.
  static constexpr int kAttnTileLen = 16;
  // Default of ModelArgs::attn_mode, how splits longer than kAttnShortLen run (the kAttnMode* values below): on the
  // tensor cores (docs/tuning.md).
  static constexpr int kAttnMode = 2;
  // Default of ModelArgs::attn_prefetch: rounds of K / V tiles each warp of a tensor-core attention pass keeps on
  // their way into L2 ahead of its loads (cp.async.bulk.prefetch.L2; attention_mma.cuh); 0: none. A round is
  // kConsumerWarps x 8 KiB per SM, so d rounds hold d x 64 KiB per SM of L2 (d x 8.65 MB over 132 SMs)
  // (docs/tuning.md). A table's value is clamped to [0, kAttnMaxPrefetchRounds].
  static constexpr int kAttnPrefetchRounds = 2;
  static constexpr int kAttnMaxPrefetchRounds = 4;
  // Attention splits whose partials the combining block loads in one round trip (S = 16 for 8 KV heads on 132 SMs)
  // (docs/tuning.md).
  static constexpr int kCombineBatch = 16;

  // Stages a layer runs through, in order; also the index of its counter in the per-layer counter block.
  static constexpr int kStageQKV = 0;
  static constexpr int kStageO = 1;
  static constexpr int kStageGU = 2;
  static constexpr int kStageDown = 3;
  static constexpr int kStageLM = 4;
  static constexpr int kNumStages = 5;

  // Counters are uint32 spaced kCounterStride words apart (32 B: one L2 sector each).
  static constexpr int kCounterStride = 8;

  // Ranks of one tensor-parallel group the kernel exchanges partial sums with (one node).
  static constexpr int kMaxTP = 8;

  static constexpr int kVersion = 2;
};

// A MoE layer's router stage (after O, before the experts' gate/up and down; moe_stages.cuh): a stage id of the
// loader's cursor, outside MonoConfig::kNumStages because the dense tables carry no geometry for it
// (SmemHeader::moe.router holds it).
constexpr int kStageMoeRouter = MonoConfig::kNumStages;

static_assert(MonoConfig::kConsumerWarps == 8, "gemv and attention index math assumes 8 consumer warps");
static_assert(MonoConfig::kThreads % 128 == 0 && MonoConfig::kConsumerThreads % 128 == 0, "whole warpgroups");
static_assert(MonoConfig::kConsumerThreads * MonoConfig::kConsumerRegs +
                      (MonoConfig::kThreads - MonoConfig::kConsumerThreads) * MonoConfig::kLoaderRegs <= 65536 &&
                  MonoConfig::kConsumerRegs % 8 == 0 && MonoConfig::kLoaderRegs % 8 == 0 &&
                  MonoConfig::kLoaderRegs >= 24 && MonoConfig::kConsumerRegs <= 256,
              "setmaxnreg: multiples of 8 in [24, 256] that fit the register file");
static_assert(MonoConfig::kSlotBytes % 16 == 0 && MonoConfig::kSlotAlign % 128 == 0 &&
                  MonoConfig::kSlotBytes % MonoConfig::kSlotAlign == 0,
              "bulk copies move multiples of 16 bytes; slots stay 128-byte aligned");
static_assert(MonoConfig::kMaxSlots * MonoConfig::kSlotBytes + MonoConfig::kHeaderBytes <= 400 * 1024,
              "ring bound");
static_assert(MonoConfig::kMinSlots * MonoConfig::kSlotBytes + MonoConfig::kHeaderBytes < MonoConfig::kMaxSmemBytes,
              "at least two slots must fit");
static_assert(MonoConfig::kMaxHidden == 8192, "norm register budget");
static_assert((MonoConfig::kEpilogueBatch & (MonoConfig::kEpilogueBatch - 1)) == 0 &&
                  MonoConfig::kEpilogueBatch * MonoConfig::kConsumerWarps <= MonoConfig::kConsumerThreads,
              "a batch's units (<= kConsumerWarps per chunk) take one consumer thread each, in one pass");
static_assert(MonoConfig::kHandoffQueue >= MonoConfig::kMaxSlots + 2 &&
                  (MonoConfig::kHandoffQueue & (MonoConfig::kHandoffQueue - 1)) == 0,
              "the loader's hand-off queue holds every armed hand-off and wraps by a mask");
static_assert(MonoConfig::kStallPrefetchChunks == 0 || MonoConfig::kPrefetchChunks == 0,
              "the constant L2 lead and the stall-time one share the loader's prefetch cursor");
// ModelArgs::attn_mode values (attention.cuh). Rounds: a round's K / V loads, then its arithmetic, on the CUDA cores
// (q fp32). Mma: tensor cores (attention_mma.cuh): QK^T and PV as bf16 mma.sync with fp32 accumulators, q and P
// rounded to bf16, kHeadsPerPass query heads per pass over the split. MmaWide: the same with every query head of the
// KV head in one pass, up to the mma's 8 columns (GQA 5-8 read the split's K / V once instead of twice).
constexpr int kAttnModeRounds = 0;
constexpr int kAttnModeMma = 1;
constexpr int kAttnModeMmaWide = 2;
static_assert(MonoConfig::kAttnMode >= kAttnModeRounds && MonoConfig::kAttnMode <= kAttnModeMmaWide,
              "an attn_mode value");

static_assert(MonoConfig::kHeadsPerPass == 4 && MonoConfig::kAttnUnroll >= 1, "attention register budget");
// The prefetched rounds stay a fraction of the L2 (50 MB on an H100, 60 MB on an H200) beside the weight stream.
static_assert(MonoConfig::kAttnPrefetchRounds >= 0 &&
                  MonoConfig::kAttnPrefetchRounds <= MonoConfig::kAttnMaxPrefetchRounds &&
                  MonoConfig::kAttnMaxPrefetchRounds <= 4,
              "attention L2 prefetch: at most 4 rounds (34.6 MB over 132 SMs, of a 50 MB L2)");

}  // namespace kog
