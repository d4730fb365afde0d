// The monokernel's argument table. The host (kog_backend/monokernel/layout.py) packs these structs once, from
// vLLM's own tensors; every field is 8 bytes so that the Python packer is a flat list of int64/double. Field
// order is checked against the kog::monokernel_layout op by tests/test_monokernel_cpu.py.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kog/config.cuh"

namespace kog {

using bf16 = __nv_bfloat16;

// One decoder layer: views of vLLM's TP-local weights ([out, in] row-major, contiguous), this layer's KV cache, and
// this layer's scratch (written every step; kept per layer so each stage can be checked on its own). The four
// projections (qkv, o_proj, gate_up, down) are bf16, or in an FP8 kernel (ModelArgs::fp8_scaling > 0) float8 e4m3
// bytes ([out, in] row-major, `in` bytes per row, typed bf16* here only as an address) with their fp32 scales in
// ModelArgs::fp8_scales.
struct LayerArgs {
  const bf16* input_norm;  // [H]
  const bf16* qkv;         // [(nh + 2 nkv) D, H], rows Q | K | V
  const bf16* q_norm;      // [D] or null (Qwen3 qk-norm)
  const bf16* k_norm;      // [D] or null
  const bf16* o_proj;      // [H, nh D]
  const bf16* post_norm;   // [H]
  const bf16* gate_up;     // [2 I, H], rows gate | up
  const bf16* down;        // [H, I]
  bf16* k_cache;           // element (block, pos, head, d) at block*s_blk + pos*s_pos + head*s_head + d
  bf16* v_cache;           // same strides as k_cache (vLLM: k_cache + D)
  bf16* qkv_out;           // [(nh + 2 nkv) D]  GEMV output, before qk-norm and RoPE
  bf16* q_out;             // [nh D]            q after qk-norm and RoPE (written by split 0 of each KV head)
  float* attn_ml;          // [nh, S, 2]        per split: running max (log2 domain), sum of exp2
  float* attn_acc;         // [nh, S, D]        per split: unnormalised sum of exp2(s - m) * v
  bf16* attn_out;          // [nh D]
  bf16* o_out;             // [H]  o_proj output
  bf16* rmid;              // [H]  residual after attention: bf16(o + rin)
  bf16* act;               // [I]  silu(gate) * up
  bf16* down_out;          // [H]
  bf16* rin_next;          // [H]  residual entering the next layer: bf16(down + rmid)
  const bf16* qkv_bias;    // [(nh + 2 nkv) D] or null (Qwen2's QKV bias, added in the QKV epilogue)
};

// One decoder layer's FP8 weight scales (fp32, vLLM's loaded weight_scale / weight_scale_inv), laid out by
// ModelArgs::fp8_scaling for a projection of N rows and K columns: [1]; [N]; [ceil(N / 128), ceil(K / 128)] (fp8.cuh).
// A table of their own, so that the bf16 kernels' layer tables (and their code) do not carry them.
struct Fp8LayerScales {
  const float* qkv;
  const float* o_proj;
  const float* gate_up;  // rows gate | up, as the weight's
  const float* down;
};

struct ModelArgs {
  int64_t num_layers;
  int64_t hidden;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t inter;
  int64_t block_size;   // KV-cache block size (positions)
  int64_t num_splits;   // S: context splits per KV head
  int64_t grid;         // blocks launched (= SM count)
  int64_t num_slots;    // ring slots in use
  int64_t qk_norm;      // 1 for Qwen3
  int64_t max_position; // rows of cos_sin
  int64_t work_bytes;   // shared-memory work region (input vector / attention scratch) before the ring
  int64_t prefetch_chunks;  // chunks the loader keeps in flight into L2 beyond the ring (0: none)
  int64_t stage_end_copies; // chunks the loader may issue past this block's last chunk of a stage before the block
                            // has signalled that stage (>= num_slots: no hold; handoff_hold.cuh)
  int64_t attn_end_copies;  // the same past its last QKV chunk until its attention split has published
  int64_t attn_single_ctx;  // contexts up to this length take one attention split per KV head (0: never;
                            // MonoConfig::kAttnSingleCtx)
  int64_t stall_prefetch_chunks;  // chunks the loader moves into L2 beyond the ring while it waits for a slot
                                  // (0: none; MonoConfig::kStallPrefetchChunks; used only with prefetch_chunks 0)
  int64_t max_inflight;     // bulk copies the loader keeps in flight at most (0 or >= num_slots: no cap;
                            // MonoConfig::kMaxInflight)
  int64_t tagged_handoffs;  // bits of tagged.cuh (kTaggedGateUp): optional hand-offs made through tagged words
                            // instead of counters (0: none; MonoConfig::kTaggedHandoffs; read only by TP = 1
                            // kernels of a -DKOG_TAGGED_HANDOFFS=1 build)
  // Per stage (MonoConfig::kStage*): input length K, output units N (rows; gate/up pairs for GU), units per
  // chunk (power of two <= kConsumerWarps), number of chunks.
  int64_t stage_k[MonoConfig::kNumStages];
  int64_t stage_n[MonoConfig::kNumStages];
  int64_t stage_nu[MonoConfig::kNumStages];
  int64_t stage_chunks[MonoConfig::kNumStages];
  int64_t kv_stride_block;  // elements
  int64_t kv_stride_pos;
  int64_t kv_stride_head;
  double rms_eps;
  double attn_scale_log2;  // D^-0.5 * log2(e)
  const bf16* embed;       // [V_pad, H]
  const bf16* final_norm;  // [H]
  const bf16* lm_head;     // [V_pad, H]; rows >= stage_n[kStageLM] are padding and never read
  const bf16* cos_sin;     // [max_position, D]: cos | sin
  const LayerArgs* layers;
  uint32_t* counters;       // see counter_index() in sync.cuh
  uint64_t* argmax_slots;   // [grid]
  bf16* logits_scratch;     // [stage_n[kStageLM]] when the caller passes no logits buffer
  uint32_t* act_tagged;     // [num_layers][tagged_layer_words] tagged words of act | qkv_out | attn_out (tagged.cuh),
                            // zeroed with the counters
  uint64_t* trace;          // null, or [num_tokens][num_layers + 1][kTraceEvents][grid] (trace.cuh)
  // Tensor parallelism (docs/monokernel.md, "Tensor parallelism"). A launch that is not TP ignores the fields
  // below. With tp_size W > 1 counters, tp_parts and tp_keys lie in one buffer shared with the other ranks through
  // CUDA IPC; rank q's copy of any address p in it is p + tp_delta[q]. A TP launch uses tp_delta[tp_rank] for its
  // own copy even with tp_size 1, so it must be 0 (the host refuses other tables: layout.tp_fields_error).
  int64_t tp_size;
  int64_t tp_rank;
  int64_t vocab_start;      // global vocabulary id of this rank's LM-head row 0 (the argmax key's row)
  bf16* tp_parts;           // [num_layers][2 (O, down)][W][hidden]: each rank's bf16 partial sums, pushed by it
  uint64_t* tp_keys;        // [2 (token parity)][W]: each rank's best LM-head key of a token
  int64_t tp_delta[MonoConfig::kMaxTP];
  // Top-k / top-p / min-p bursts (burst_sampling.cuh; TP = 1): the grid's level histogram, bins and cut,
  // BurstSamplingConfig::kGridBytes, all zero between tokens (zeroed with the counters after an abort).
  uint8_t* sample_work;
  // Launch outcome (fault handling, docs/monokernel.md "Faults"): the launch's last block writes the abort word
  // (0: every wait completed; else the kSite* of the first wait that gave up, sync.cuh) here. Pinned host memory
  // mapped into the device (UVA), or null.
  uint32_t* status_out;
  // Fault injection (tests only; 0 in production): 1 makes the LM head's wait for the last layer's down
  // projection never complete (its target moves 2^30 away), so the launch aborts (sync.cuh).
  int64_t inject_fault;
  // Bytes of one weight-ring slot (plan.py): MonoConfig::kSlotBytes, or more where one unit's row (a down row of
  // I = 17408 .. 27648, 34-54 KiB) does not fit it; a multiple of 1 KiB.
  int64_t slot_bytes;
  // The decoder layers' projection weights (fp8.cuh): kFp8None (0) bf16; else float8 e4m3 with one fp32 scale per
  // matrix (kFp8PerTensor), per output row (kFp8PerRow) or per 128 x 128 block (kFp8Block128). An FP8 table needs
  // the FP8 kernel instantiation (MonokernelLaunch::fp8_weights) and the reverse. Embedding, LM head and norms are
  // bf16 in every kernel.
  int64_t fp8_scaling;
  const Fp8LayerScales* fp8_scales;  // [num_layers], or null for bf16 weights
  // How attention splits longer than kAttnShortLen run: kAttnModeRounds, kAttnModeMma or kAttnModeMmaWide
  // (config.cuh; MonoConfig::kAttnMode).
  int64_t attn_mode;
  // Rounds of K / V tiles a warp of a tensor-core attention pass sends towards L2 ahead of its loads (0: none;
  // MonoConfig::kAttnPrefetchRounds, attention_mma.cuh).
  int64_t attn_prefetch;
  // Mixture of experts (the MoE kernel instantiation, moe_stages.cuh; docs/moe.md). moe_top_k 0: a dense model.
  // In a MoE table inter is moe_top_k x moe_inter (the layer's act holds every slot's silu(gate) * up, slot-major),
  // LayerArgs::gate_up / down point at vLLM's fused w13 [E, 2 I, H] / w2 [E, H, I], and stage kStageGU / kStageDown
  // carry the expert stages' geometry: gate/up units slot * I + row (nu of one expert's rows per chunk), down units
  // row * k + slot (every slot of nu / k output rows per chunk).
  int64_t moe_top_k;        // k: experts per token, a power of two <= kMoeMaxTopK
  int64_t moe_experts;      // E
  int64_t moe_norm_topk;    // 1: the k routing weights renormalised to sum 1 (norm_topk_prob)
  int64_t moe_inter;        // I: moe_intermediate_size
  int64_t moe_router_nu;    // router rows per chunk
  int64_t moe_router_chunks;
  int64_t moe_ctr_base;     // counter index of layer 0's router counter (after num_counters()): layer l's router
                            // chunks count at moe_ctr_base + 2 l, its published route at moe_ctr_base + 2 l + 1
  const bf16* const* moe_routers;  // [num_layers] the layers' router weights [E, H]
  bf16* moe_logits;         // [num_layers][E] the router's bf16 logits
  int32_t* moe_route;       // [num_layers][2 kMoeMaxTopK]: expert ids, then the fp32 routing weights' bits
};

// ModelArgs fields the consumers read right after a hand-off's wait (and the loader at each stage change), copied
// into shared memory at kernel start: an acquire of a counter invalidates the SM's L1 (CCTL.IVALL), so each read
// of the global table there would be an L2 round trip (~0.7-1 us under the weight stream) in front of the loads
// of the hand-off's data.
struct HotArgs {
  const bf16* cos_sin;
  const bf16* final_norm;
  const bf16* lm_head;
  const LayerArgs* layers;
  uint64_t* argmax_slots;
  int64_t kv_stride_block, kv_stride_pos, kv_stride_head;
  float rms_eps, attn_scale_log2;
  int num_layers, num_heads, num_kv_heads, num_splits, block_size, qk_norm;
};

// LayerArgs as 8-byte words, for the copy of a layer's table into shared memory (layer_stages.cuh).
constexpr int kLayerArgsWords = static_cast<int>(sizeof(LayerArgs) / 8);
static_assert(sizeof(LayerArgs) % 8 == 0 && kLayerArgsWords <= 32, "one warp copies a layer's table");

// Per launch: small device pointers from the runner.
struct StepArgs {
  const ModelArgs* model;
  const void* input_ids;       // [1] int32 or int64
  const int64_t* positions;    // [1]
  const int32_t* block_table;  // [block_table_len]
  const int64_t* slot_mapping; // [1]
  int64_t* tokens_out;         // [num_tokens]
  bf16* logits_out;            // [num_tokens, logits_stride] or null
  int32_t* num_out;            // [1] tokens produced, or null
  const int64_t* stop_ids;     // [num_stop] or null
  const int64_t* sample_seed;  // [1] the request's vLLM sampling seed, or null: greedy
  float temperature;           // with sample_seed: > 0 Gumbel-max sampling as vLLM's sampler, 0 its argmax (penalized)
  // Run-ahead launches (kog_backend/path/run_ahead.py; TP = 1 only), both optional:
  const int32_t* launch_gate;  // [1] device, or null: the launch produces nothing (no token, no cache or counter
                               // write; num_out untouched) unless launch_gate[0] >= gate_min. Read once at entry:
                               // written by an earlier kernel of the stream, so visible (stream order).
  const int64_t* cancel;       // [1] pinned host memory (mapped, UVA), or null: once cancel[0] >= cancel_id the launch
                               // ends after the token in hand, written to tokens_out as -1 - id
  int64_t cancel_id;
  int32_t gate_min;
  int64_t logits_stride;
  int32_t ids_int64;
  int32_t block_table_len;
  int32_t num_stop;
  int32_t num_tokens;
  // vLLM's filters of a sampled launch (SamplingStates' values): top_k 0 = off (vLLM: k = V), top_p 1 = off,
  // min_p 0 = off. `filtered` (any of them on; TP = 1 only) draws through burst_sampling.cuh, which may end the
  // launch before a token whose draw it leaves to vLLM's sampler: defer_out[0] = 1 then, and num_out excludes it.
  float top_p;
  float min_p;
  int32_t top_k;
  int32_t filtered;
  int32_t* defer_out;          // [1] device, or null (a filtered launch needs it)
  // vLLM's penalties of a sampled launch (penalties.cuh; TP = 1): `penalized` applies them to every token's logits.
  // prompt_mask / output_counts are vLLM's PenaltiesState rows of the request; burst_counts [V] counts this
  // launch's tokens (all zero outside a launch: the last block to finish zeroes the entries it set).
  const uint32_t* prompt_mask;
  const int32_t* output_counts;
  int32_t* burst_counts;
  float repetition_penalty;
  float frequency_penalty;
  float presence_penalty;
  int32_t penalized;
};

}  // namespace kog
