// The block's shared-memory header: the loader warp and the consumer warps meet here (ring mbarriers, the
// loader's go / stop / hold words), and the consumers keep their per-block copies of the launch's hot arguments,
// the layer tables, the GEMV partials and the residual rows. The work area and the ring of weight slots follow it
// in dynamic shared memory (kHeaderBytes, ModelArgs::work_bytes).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/config.cuh"
#include "kog/gemv.cuh"

namespace kog {

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
  int64_t tp_delta[MonoConfig::kMaxTP];     // ModelArgs::tp_delta, copied at kernel start
  HotArgs hot;                              // copied at kernel start (see HotArgs)
  LayerArgs lay[2];                         // layer l's table in lay[l & 1], copied at the layer's start
  float resid[MonoConfig::kMaxResidRows];  // residual values of this block's O / down rows
  int bt[MonoConfig::kBtCacheEntries];
  // FP8 kernels: layer l's scale pointers in fp8_lay[l & 1], copied with its table (last: the fields above keep
  // their offsets in every kernel).
  Fp8LayerScales fp8_lay[2];
};
static_assert(sizeof(SmemHeader) <= MonoConfig::kHeaderBytes, "shared-memory header overflows kHeaderBytes");

}  // namespace kog
