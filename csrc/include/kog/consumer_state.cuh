// The consumer warps' state, by lifetime: the launch (Consumers: what every step reads, read once at the launch's
// start), the token (TokenStep) and the layer (LayerStep). The step functions of layer_stages.cuh, token_select.cuh
// and token_stages.cuh take them by reference; all of them inline into run_consumers (consumers.cuh), so none of
// these structs exists in memory. The position in the schedule (ring slot, stage base) is run_consumers' own.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kog/args.cuh"
#include "kog/attention.cuh"
#include "kog/config.cuh"
#include "kog/diagnostics.cuh"
#include "kog/fp8.cuh"
#include "kog/handoff_hold.cuh"
#include "kog/penalties.cuh"
#include "kog/smem_header.cuh"
#include "kog/tagged.cuh"
#include "kog/trace.cuh"

namespace kog {

// Tensor parallelism (tp.cuh; a separate instantiation, so the TP=1 kernel carries none of it): W ranks, this one
// `rank`; the o / down counters then count every rank's chunks. A TP kernel reads them at its start; the TP = 1
// kernel has them as constants, not as fields: NVVM's code for the whole kernel (the loader's included) changes
// when a compile-time constant goes through a field of a struct the steps read (measured on the PTX), and the
// kernels' SASS is the one of the single-function run_consumers.
template <bool kTP>
struct TpRanks {
  int W, rank;
  uint32_t nw;  // W as the counters count
  __device__ __forceinline__ explicit TpRanks(const ModelArgs& m)
      : W(static_cast<int>(m.tp_size)), rank(static_cast<int>(m.tp_rank)), nw(static_cast<uint32_t>(W)) {}
};
template <>
struct TpRanks<false> {
  static constexpr int W = 1, rank = 0;
  static constexpr uint32_t nw = 1u;
  __device__ __forceinline__ explicit TpRanks(const ModelArgs&) {}
};

// A flag of the launch (StepArgs / ModelArgs) that only some kernels can have set: read at the start there, the
// constant false elsewhere (no field, as TpRanks).
template <bool kCan>
struct LaunchFlag {
  bool on;
  __device__ __forceinline__ explicit LaunchFlag(bool v) : on(v) {}
};
template <>
struct LaunchFlag<false> {
  static constexpr bool on = false;
  __device__ __forceinline__ explicit LaunchFlag(bool) {}
};

// What every consumer step reads: the launch's arguments, read once at its start, in the order the single-function
// run_consumers read them (the order of these loads is part of the code NVVM emits). Only values known at run time
// are fields (see TpRanks, LaunchFlag).
// The layer projections' FP8 scaling (fp8.cuh) is a base, Consumers::fp8_mode: empty in a bf16 kernel (the constant
// kFp8None), so that its Consumers has the layout (and the code) it has without FP8.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
struct Consumers : Fp8Mode<kFp8> {
  const ModelArgs& m;
  const StepArgs& step;
  SmemHeader& hdr;
  bf16* const x_s;        // a stage's input vector (bf16 [K]; scaled f16 under fp8_gemv kFp8GemvHalf) at the work area's start
  float* const work;      // the work area: attention splits, the filtered draw (burst_sampling.cuh)
  const uint32_t epoch0;  // the counters' epoch at the launch's start: token t's epoch is epoch0 + t
  const int G, b, tid;
  const int L, H;
  const int nh, nkv;
  const int I, S, bs;
  const float eps;
  uint32_t* const ctrs;
  // Fault injection (ModelArgs::inject_fault, tests only): one wait whose target is never reached.
  const uint32_t fault_bias;
  const uint32_t n_qkv, n_o, n_gu, n_down, n_lm;  // chunks of each stage (all blocks)
  // The ring of weight slots (run_consumers' Ring starts at slot 0 from these).
  uint8_t* const ring_base;
  const int num_slots;
  const uint32_t slot_bytes;
  const int64_t pos0;  // position of the launch's first token
  const LaunchFlag<kSampled && !kTP> filtered;   // top-k / top-p / min-p (burst_sampling.cuh)
  const LaunchFlag<kSampled && !kTP> penalized;  // repetition / frequency / presence (penalties.cuh)
  const penalties::Penalty pen;
  const bool has_task;  // this block runs an attention split
  // gate/up -> down through tagged words instead of the gate/up counter (tagged.cuh; TP=1 only).
  const LaunchFlag<MonoConfig::kTaggedBuild && !kTP> tagged_gu;
  const Tracer tr;  // timeline marks (trace.cuh; a KOG_TRACE build only)
  const TpRanks<kTP> tp;
  const int64_t* const delta;  // rank q's copy of the shared buffer at + delta[q] bytes (tp.cuh)

  __device__ __forceinline__ Consumers(const ModelArgs& m_, const StepArgs& step_, SmemHeader& hdr_, bf16* x_s_,
                                       float* work_, uint8_t* ring_base_, uint32_t epoch0_)
      : Fp8Mode<kFp8>(kFp8 ? m_.fp8_scaling : int64_t{0}, kFp8 ? m_.fp8_gemv : int64_t{0}),
        m(m_),
        step(step_),
        hdr(hdr_),
        x_s(x_s_),
        work(work_),
        epoch0(epoch0_),
        G(gridDim.x),
        b(blockIdx.x),
        tid(threadIdx.x),
        L(static_cast<int>(m.num_layers)),
        H(static_cast<int>(m.hidden)),
        nh(static_cast<int>(m.num_heads)),
        nkv(static_cast<int>(m.num_kv_heads)),
        I(static_cast<int>(m.inter)),
        S(static_cast<int>(m.num_splits)),
        bs(static_cast<int>(m.block_size)),
        eps(static_cast<float>(m.rms_eps)),
        ctrs(m.counters),
        fault_bias(m.inject_fault == 1 ? (1u << 30) : 0u),
        n_qkv(static_cast<uint32_t>(hdr.geo[MonoConfig::kStageQKV].chunks)),
        n_o(static_cast<uint32_t>(hdr.geo[MonoConfig::kStageO].chunks)),
        n_gu(static_cast<uint32_t>(hdr.geo[MonoConfig::kStageGU].chunks)),
        n_down(static_cast<uint32_t>(hdr.geo[MonoConfig::kStageDown].chunks)),
        n_lm(static_cast<uint32_t>(hdr.geo[MonoConfig::kStageLM].chunks)),
        ring_base(ring_base_),
        num_slots(static_cast<int>(m.num_slots)),
        slot_bytes(static_cast<uint32_t>(m.slot_bytes)),
        pos0(step.positions[0]),
        filtered(kSampled && !kTP && step.filtered != 0),
        penalized(kSampled && !kTP && step.penalized != 0),
        pen{step.prompt_mask, step.output_counts, step.burst_counts, step.repetition_penalty,
            step.frequency_penalty, step.presence_penalty},
        has_task(has_attn_task(nkv, S)),
        tagged_gu(MonoConfig::kTaggedBuild && !kTP && (m.tagged_handoffs & kTaggedGateUp) != 0),
        tr(m),
        tp(m),
        delta(hdr.tp_delta) {}

  // Fills x_s with a stage's input: fill(std::bool_constant<kF16>) runs one of rmsnorm_to_smem / copy_to_smem /
  // tagged_to_smem with that kF16 and returns its result. An FP8 kernel whose projections run in f16 (fp8_gemv
  // kFp8GemvHalf) takes the input as scaled f16; where a value is beyond kFp8HalfMaxInput the launch aborts (site
  // kSiteFp8Range; what: the stage, target: the layer) instead of risking an f16 overflow: the host redoes the step
  // on the stock path and moves the kernel to the CUDA-core form.
  template <class Fill>
  __device__ __forceinline__ void fill_x(int st, int l, Fill&& fill) const {
    if constexpr (kFp8) {
      if (this->fp8_gemv == kFp8GemvHalf) {
        if (fill(std::true_type{}) && tid == 0) {
          record_abort(ctrs, kSiteFp8Range, static_cast<uint32_t>(st), static_cast<uint32_t>(l), 0u);
        }
        return;
      }
    }
    fill(std::false_type{});
  }

  // After a hand-off's release: its schedule position for the loader's hold (handoff_hold.cuh), its timeline mark.
  __device__ __forceinline__ void handed_off(int t, int l, int st, int ev) const {
    if (tid == 0) {
      hdr.released = hand_off_seq(t, l, st, L);
      tr.mark(t, l, ev);
    }
  }
};

// Whether the attention output goes through tagged words: the whole attention chain does (tagged.cuh:
// QKV -> attention and attention -> O in every TP = 1 kernel, no release, no counter wait), but a diagnostics build
// without attention work writes no attention output: its O stage waits on counters.
template <bool kTP>
constexpr bool tagged_attn_output() {
  return tagged_attention_chain<kTP>() && !diag::kNoAttn;
}

// One token of the launch.
struct TokenStep {
  int t;          // the token's index in the launch
  uint32_t e;     // its epoch: a counter's target for this token is (e + 1) x the counter's count per token
  uint32_t next;  // e + 1
  int pos;        // its position in the sequence
  int64_t slot;   // the KV-cache slot its K and V go to
  const bf16* emb;  // its input embedding row (bf16 [H])
};

// One layer of a token.
struct LayerStep {
  int l;
  const LayerArgs& La;    // this layer's table (shared-memory copy, SmemHeader::lay)
  const LayerArgs* prev;  // the previous layer's (its other slot), null at l == 0
  const bf16* rin;        // the layer's input residual (bf16 [H]): the embedding row at l == 0
  uint32_t* tagged_l;     // this layer's tagged words (tagged.cuh): act at +0, qkv_out at +I, attn_out at
                          // +I + (nh + 2 nkv) D
};

}  // namespace kog
