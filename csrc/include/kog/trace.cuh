// Optional timeline of one launch: when each block passed each point of the schedule. Compiled in only with
// -DKOG_TRACE (KOG_TRACE=1 at build time): even untaken, the marks cost registers the kernel does not have to
// spare (at 168 registers per thread, Llama-3.2-1B ctx 32: 1091 us/step without, 1135 with a null pointer). In
// such a build, ModelArgs::trace (null: off) receives %globaltimer nanoseconds, comparable across SMs.
// Layout: trace[((t * (num_layers + 1) + l) * kTraceEvents + event) * grid + block], uint64; row l = num_layers
// holds the token's LM-head events. A block that skips a point (owns no chunk of the stage, runs no attention
// split) leaves its entry as the host wrote it. benchmarks/bench_monokernel.py --trace prints the typical layer.
#pragma once

#include <cstdint>

#include "kog/args.cuh"

namespace kog {

enum TraceEvent : int {
  kEvQkvReady = 0,   // previous layer's down projection complete, input norm done (QKV blocks)
  kEvQkvDone = 1,    // this block's QKV chunks published
  kEvAttnReady = 2,  // QKV complete (attention blocks)
  kEvAttnDone = 3,   // attention split published (and combined, in the last split of a KV head)
  kEvOReady = 4,     // attention output complete, O inputs in shared memory
  kEvODone = 5,
  kEvGuReady = 6,    // O complete, post-attention norm done
  kEvGuDone = 7,
  kEvDownReady = 8,  // gate/up complete, activation in shared memory
  kEvDownDone = 9,
  kEvLoaderLayer = 10,  // the loader issued its first chunk of this layer (of the LM head, in row num_layers)
  // This block's last weight chunk of the stage was in shared memory (its `full` wait returned): close to the
  // stage's Done mark, the stage waited for HBM; far before it, for its consumers.
  kEvQkvLanded = 11,
  kEvOLanded = 12,
  kEvGuLanded = 13,
  kEvDownLanded = 14,
  // Inside the attention split (attention.cuh): q of the first pass rotated in shared memory and this token's K/V
  // appended (the q pass's barrier); the first pass's positions attended and merged per warp; its output or
  // partial written.
  kEvAttnQ = 15,
  kEvAttnKV = 16,
  kEvAttnPart = 17,
  kTraceEvents = 18,
  // Row num_layers (LM head):
  kEvLmReady = kEvQkvReady,     // last layer complete, final norm done
  kEvLmDone = kEvQkvDone,       // this block's argmax published
  kEvTokenSeen = kEvAttnReady,  // the sampled token is visible to this block (tokens after the first)
};

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

#ifdef KOG_TRACE
constexpr bool kTraceBuilt = true;
#else
constexpr bool kTraceBuilt = false;
#endif

struct Tracer {
  uint64_t* p;     // ModelArgs::trace in a KOG_TRACE build, else null (every mark folds away)
  int rows;        // num_layers + 1

  __device__ __forceinline__ Tracer(const ModelArgs& m) : p(kTraceBuilt ? m.trace : nullptr),
                                                          rows(static_cast<int>(m.num_layers) + 1) {}

  // Records event `ev` of token t, layer l (num_layers: the LM head) for this block. Call from one thread.
  __device__ __forceinline__ void mark(int t, int l, int ev) const {
    if (p == nullptr) return;
    p[((static_cast<int64_t>(t) * rows + l) * kTraceEvents + ev) * gridDim.x + blockIdx.x] = global_ns();
  }
};

}  // namespace kog
