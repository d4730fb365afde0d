// The monokernel's compile-time tunables. kog_backend/monokernel/layout.py mirrors them (checked by
// tests/test_monokernel_cpu.py through the kog::monokernel_config op).
#pragma once

#include <cstdint>

namespace kog {

struct MonoConfig {
  // Block shape: warp 0..kConsumerWarps-1 compute (two warpgroups); a third warpgroup, whose first warp streams
  // weights (one elected lane) and whose other three exit at once, exists so that registers can move between
  // warpgroups (setmaxnreg works per warpgroup). With 9 warps ptxas capped every thread at 168 registers (a
  // sub-partition's 16 K registers over its 3 warps) and the consumers spilled.
  static constexpr int kConsumerWarps = 8;
  static constexpr int kConsumerThreads = kConsumerWarps * 32;
  static constexpr int kThreads = kConsumerThreads + 128;
  static constexpr int kLoaderWarp = kConsumerWarps;
  // Registers per thread after the role split (setmaxnreg): the loader's warpgroup gives registers back, the
  // consumers' take them; the two together fit the 64 K register file. Measured 2026-12-03 on the H200 (NOTES.md,
  // seventh session; one call, each build twice): 9 warps at 168 registers (80 / 264 B spilled) against this split
  // (no spill): Llama-3.2-1B 773 -> 757 us per step at ctx 32, 929 -> 899 at 4k; Qwen3-1.7B 1174 -> 1147;
  // Llama-3.1-8B 3801 -> 3748, 4383 -> 4271. Also holding each lane's slice of x in 32 of the new registers (no
  // re-read from shared memory per chunk) was slower than the split alone (770 us), so x stays in shared memory.
  static constexpr int kLoaderRegs = 56;
  static constexpr int kConsumerRegs = 224;

  // Weight ring in shared memory: kMaxSlots slots of kSlotBytes; the launcher uses as many as fit next to the
  // input-vector buffer (6 for Llama-3.2-1B and Llama-3.1-8B: 192 KiB in flight per SM, ~6 us of one SM's share
  // of HBM bandwidth, which covers a dependency wait of ~1-2 us between stages).
  static constexpr int kSlotBytes = 32 * 1024;
  static constexpr int kMaxSlots = 12;
  static constexpr int kMinSlots = 2;
  // Dynamic shared memory a block may use on sm_90 (227 KiB).
  static constexpr int kMaxSmemBytes = 227 * 1024;
  // Fixed shared-memory header (SmemHeader in monokernel.cuh): mbarriers, reduction scratch, broadcast words and
  // the block-table entries of this block's attention split (kBtCacheEntries x block_size positions).
  static constexpr int kHeaderBytes = 5120;  // (<= 7 KiB: Llama-3.1-8B keeps 6 slots)
  static constexpr int kBtCacheEntries = 512;
  // Residual values a block preloads for its O / down epilogues (rows it owns in one stage).
  static constexpr int kMaxResidRows = 256;
  // Default number of chunks the loader keeps in flight into L2 beyond the ring (ModelArgs::prefetch_chunks).
  // 0: measured 2026-12-02 on the H200 (benchmarks/NOTES.md), Llama-3.2-1B ctx 32 in one run: 0 chunks 1071 us,
  // 6 chunks 1100 us, 12: 1289 us, 24: 1444 us -- with every SM's ring in flight HBM is already saturated, and the
  // extra L2 traffic only competes with it. Kept as a benchmark variant.
  static constexpr int kPrefetchChunks = 0;
  // Defaults of ModelArgs::stage_end_copies / attn_end_copies, the loader's hold around a block's hand-offs
  // (handoff_hold.cuh): a release waits for the bulk copies its SM has in flight (~1 us with none while the others
  // stream, 5-7 us with six; NOTES.md 2026-12-02). kMaxSlots: no hold. Stage ends: 2, measured 2026-12-03 on the
  // H200 (NOTES.md, ninth session) with kMaxInflight = 2, us per step at ctx 32 for S:A = 12:12 / 1:12 / 2:12 /
  // 3:12 / 4:12: Llama-3.2-1B 751.8 / 729.1 / 715.9 / 723.6 / 724.0, Qwen3-1.7B 1143.4 / 1109.5 / 1100.3 / 1093.6
  // / 1100.7, Llama-3.1-8B 3703.1 / 3663.1 / 3655.6 / 3666.9 / 3679.9; holding the attention split (12:1, 12:2)
  // gained < 1%. With six copies in flight (the fifth session) every hold was slower.
  // The loader applies it as max(h, num_slots - the block's chunks of the stage), and not at a tagged QKV hand-off
  // (no release there): measured 2026-12-04 on the H200 (NOTES.md, fifteenth session), main / this / this / main,
  // us per step at ctx 32 / 512: Qwen3-1.7B 1001.8 / 993.5 / 995.2 / 999.4, 1128.8 / 1109.9 / 1110.1 / 1125.3;
  // Llama-3.2-1B 694.2 / 682.3 / 684.0 / 692.0, 743.0 / 733.8 / 732.9 / 739.1; Llama-3.1-8B 3640.3 / 3638.9 /
  // 3642.7 / 3637.9, 3856.4 / 3862.7 / 3866.5 / 3856.1.
  static constexpr int kStageEndCopies = 2;
  static constexpr int kAttnEndCopies = kMaxSlots;
  // Hand-offs the loader keeps armed: <= kMaxSlots + 1 stage ends (each but the one being signalled has a chunk in
  // the ring) and one attention split.
  static constexpr int kHandoffQueue = 16;
  // Default of ModelArgs::attn_single_ctx: contexts up to 64 take one attention split per KV head (no partials,
  // no combine hand-off), longer ones num_splits. Measured 2026-12-03 on the H200 (NOTES.md), single split against
  // 16 splits: ctx 32 Llama-3.2-1B -26 us / Llama-3.1-8B -125 us per step, ctx 64 -25 / -101, ctx 128 -15 / +57,
  // ctx 256 +42 / +310 (one SM then reads the head's whole context).
  static constexpr int kAttnSingleCtx = 64;
  // Default of ModelArgs::stall_prefetch_chunks: 0, none. A benchmark variant: while the loader waits for a slot
  // (its ring full behind a dependency wait: the QKV -> attention -> O chain leaves an SM's HBM share idle for
  // ~3-6 us per 1B layer, NOTES.md 2026-12-03), it sends up to this many of its next chunks towards L2 (the chunk
  // it waits to copy first), so the copies after the wait hit L2. Unlike kPrefetchChunks' constant lead it adds
  // no request while the ring streams. Re-measured 2026-12-04 with the stage-end hold (NOTES.md, seventeenth
  // session), 4 chunks, us per step: Qwen3-1.7B ctx 32 1003.6 -> 1091.7, ctx 512 1111.3 -> 1144.4; Llama-3.2-1B
  // 683.4 -> 741.5, 730.2 -> 774.1. Prefetching while the loader is held at a hand-off (a local branch) was slower
  // still (+8-15%).
  static constexpr int kStallPrefetchChunks = 0;
  // Default of ModelArgs::max_inflight: bulk copies the loader keeps in flight per SM (0 or >= num_slots: no cap,
  // every free slot's copy issued at once). The latency probe (NOTES.md 2026-12-02) found 2 copies of 32 KiB in
  // flight per SM enough for the whole read stream (4.57 TB/s), while an L2 load or a release on a streaming SM
  // costs ~0.3-0.5 / ~2 us with 2 in flight and ~0.7-1 / ~7-9 us with 6. Measured 2026-12-03 on the H200 at ctx 32
  // (NOTES.md, sixth session), us per step for caps none / 1 / 2 / 3 / 4: Llama-3.2-1B 787 / 785 / 769 / 786 / 786,
  // Qwen3-1.7B 1205 / 1164 / 1176 / 1209 / 1209, Llama-3.1-8B 3825 / 4111 / 3764 / 3830 / 3830.
  static constexpr int kMaxInflight = 2;
  // Default of ModelArgs::tagged_handoffs (tagged.cuh): 0, no optional tagged hand-off. The attention chain (QKV ->
  // attention -> O) goes through tagged words in every TP = 1 kernel (tagged_attention_chain): measured 2026-12-04
  // on the H200 (benchmarks/NOTES.md, fourteenth session), us per step, counters / QKV only / attention only / both
  // on one build, ctx 32: Llama-3.2-1B 707.3 / 694.7 / 699.1 / 687.6, Qwen3-1.7B 1063.3 / 1025.5 / 1044.1 / 997.7,
  // Llama-3.1-8B 3635.8 / 3645.2 / 3605.7 / 3597.7; ctx 512: 765.9 / 748.4 / 759.6 / 740.9, 1165.2 / 1148.6 /
  // 1151.9 / 1120.6, 3833.5 / 3853.9 / 3799.5 / 3816.3. Since then the counter versions of those two hand-offs are
  // compiled only into the TP kernel: kernels carrying code they never run have run slower (NOTES.md, sessions 17
  // and 18). The residual stream through tagged words as well (o_out, rmid, down_out, rin_next) was slower (Qwen3
  // ctx 32 +27 us): the norms then poll twice the bytes.
  // Bit kTaggedGateUp exists only in builds with -DKOG_TAGGED_HANDOFFS=1 (KOG_NVCC_FLAGS): inlined into the down
  // stage, its polling loop raised the default kernel's spills from 100 / 344 B to 272 / 840 B (stores / loads);
  // without the flag the bit is ignored. (Those spills were at 168 registers; since the warpgroup split a
  // -DKOG_TAGGED_HANDOFFS=1 build has none.)
  static constexpr int kTaggedHandoffs = 0;
#ifdef KOG_TAGGED_HANDOFFS
  static constexpr bool kTaggedBuild = KOG_TAGGED_HANDOFFS != 0;
#else
  static constexpr bool kTaggedBuild = false;
#endif
  // 16-byte loads a consumer thread keeps in flight per round while it polls tagged words (4 words each): 4 = 16
  // registers; the gate/up -> down hand-off of Llama-3.2-1B (I = 8192) then takes two rounds.
  static constexpr int kTaggedBatch = 4;

  // GEMV: a warp's share of one row is a multiple of this many bf16 (32 lanes x 8 elements = one 16 B load each).
  static constexpr int kWarpStride = 32 * 8;
  // Chunks whose epilogues a block runs together (consume_stage): per chunk the consumer warps only compute and
  // leave their partial sums in shared memory; every kEpilogueBatch chunks one barrier, then one thread per output
  // unit sums its parts and runs the epilogue. With the epilogue and the cross-warp sum on the per-chunk path
  // (barrier, then one lane per unit), the 2026-12-03 skeleton spent ~0.3 us per chunk on them; the full step
  // gained 0-1% (its consumers mostly wait). 8: measured against 4 and 2, within 0.5% of each other (NOTES.md).
  static constexpr int kEpilogueBatch = 8;
  // Hidden sizes the norm keeps in registers: H <= kMaxNormIters * kConsumerThreads * 8.
  static constexpr int kMaxNormIters = 4;
  static constexpr int kMaxHidden = kMaxNormIters * kConsumerThreads * 8;

  // Attention: query heads of one KV head handled per pass at most (GQA 8 = two passes over the KV split; each
  // kernel is built for one pass width HP <= this, chosen by plan.heads_per_pass), positions each lane group loads
  // ahead (16 B of K and of V each).
  static constexpr int kHeadsPerPass = 4;
  static constexpr int kAttnUnroll = 4;
  // Splits of at most this many positions take a pass unrolled just enough for one round (attention.cuh): 32 / 16
  // positions per round for head dim 64 / 128, so unroll 1 / 2 instead of kAttnUnroll. The attention code runs once
  // per layer on few SMs and starts cold in the instruction cache (Nsight Compute, 2026-12-04: 27% of its warp
  // samples stalled on instruction fetch); the short body fetches and computes only the positions a round holds.
  // Measured 2026-12-04 on the H200 (benchmarks/NOTES.md, tenth session), us per step without / with, means of
  // two runs: Llama-3.2-1B ctx 32 715.8 / 693.7, ctx 512 770.1 / 745.8; Qwen3-1.7B 1090.5 / 1059.7, 1183.4 /
  // 1170.4; Llama-3.1-8B 3652.1 / 3627.0, 3836.5 / 3814.2.
  static constexpr int kAttnShortLen = 32;
  // Attention splits whose partials the combining block loads in one round trip (S = 16 for 8 KV heads on 132 SMs).
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

static_assert(MonoConfig::kConsumerWarps == 8, "gemv and attention index math assumes 8 consumer warps");
static_assert(MonoConfig::kThreads % 128 == 0 && MonoConfig::kConsumerThreads % 128 == 0, "whole warpgroups");
static_assert(MonoConfig::kConsumerThreads * MonoConfig::kConsumerRegs +
                      (MonoConfig::kThreads - MonoConfig::kConsumerThreads) * MonoConfig::kLoaderRegs <= 65536 &&
                  MonoConfig::kConsumerRegs % 8 == 0 && MonoConfig::kLoaderRegs % 8 == 0 &&
                  MonoConfig::kLoaderRegs >= 24 && MonoConfig::kConsumerRegs <= 256,
              "setmaxnreg: multiples of 8 in [24, 256] that fit the register file");
static_assert(MonoConfig::kSlotBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
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
static_assert(MonoConfig::kHeadsPerPass == 4 && MonoConfig::kAttnUnroll >= 1, "attention register budget");

}  // namespace kog
