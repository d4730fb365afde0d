// The block's shared-memory header: the loader warp and the consumer warps meet here (ring mbarriers, the
// loader's go / stop / hold words), and the consumers keep their per-block copies of the launch's hot arguments,
// the layer tables, the GEMV partials and the residual rows. The work area and the ring of weight slots follow it
// in dynamic shared memory (kHeaderBytes, ModelArgs::work_bytes).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/config.cuh"
#include "kog/gemv.cuh"
#include "kog/moe_route.cuh"

namespace kog {

// A MoE kernel's launch constants (ModelArgs::moe_*), copied at kernel start, and the route of the layer being run:
// `ids` is the loader's copy (it addresses the expert chunks), `weights` the consumers' (the down epilogue).
struct MoeHot {
  StageGeom router;  // K = hidden, N = E rows
  int top_k, log2_top_k, inter, experts, norm_topk, ctr_base;
  bf16* logits;      // ModelArgs::moe_logits
  int32_t* route;    // ModelArgs::moe_route
  int ids[kMoeMaxTopK];
  float weights[kMoeMaxTopK];
};

struct SmemHeader {
  StageGeom geo[MonoConfig::kNumStages];  // ModelArgs::stage_*, copied at kernel start (see StageGeom)
  uint64_t full[MonoConfig::kMaxSlots];   // slot filled (one arrival with tx bytes, by the loader)
  uint64_t empty[MonoConfig::kMaxSlots];  // slot consumed (one arrival per consumer warp)
  uint64_t keys[MonoConfig::kConsumerWarps];
  float red_norm[MonoConfig::kConsumerWarps];
  EpiBatch epi[2];  // GEMV partials of a batch of chunks; batches alternate (Ring::parity)
  int bcast[4];
  volatile int tok_go;    // consumers -> loader: token index whose weights may stream
  volatile int tok_stop;  // consumers -> loader: stop after the token before tok_go
  volatile int released;  // consumers -> loader: hand_off_seq of the last hand-off this block made (-1: none)
  // consumers -> loader: 1 once a consumer's full-slot wait gave up after an abort (its copy may still be in flight):
  // the loader issues no further copy and drains the ones it issued before the block exits (loader.cuh).
  volatile int abandoned;
  int64_t tp_delta[MonoConfig::kMaxTP];     // ModelArgs::tp_delta, copied at kernel start
  HotArgs hot;                              // copied at kernel start (see HotArgs)
  LayerArgs lay[2];                         // layer l's table in lay[l & 1], copied at the layer's start
  float resid[MonoConfig::kMaxResidRows];  // residual values of this block's O / down rows
  int bt[MonoConfig::kBtCacheEntries];
  // Last, so that the fields above keep their offsets in every kernel; an FP8 kernel is never a MoE kernel, so they
  // share their bytes:
  union {
    // FP8 kernels: layer l's scale pointers in fp8_lay[l & 1], copied with its table.
    Fp8LayerScales fp8_lay[2];
    // MoE kernels (moe_stages.cuh).
    MoeHot moe;
  };
};
static_assert(sizeof(SmemHeader) <= MonoConfig::kHeaderBytes, "shared-memory header overflows kHeaderBytes");

}  // namespace kog
