// Tensor parallelism inside the monokernel: W ranks (one process and GPU each, or processes sharing a GPU under
// MPS) each hold vLLM's TP shards and run the same schedule on them. After the O and down projections every rank's
// blocks push their bf16 partial rows into all ranks' ModelArgs::tp_parts (CUDA IPC mappings) and add to all
// ranks' o / down counters (system scope); readers sum the W partials in rank order in fp32 and round to bf16,
// as vLLM's custom all-reduce does. docs/monokernel.md ("Tensor parallelism") gives the ordering argument.
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/config.cuh"
#include "kog/gemv.cuh"
#include "kog/numerics.cuh"
#include "kog/sync.cuh"

namespace kog {

constexpr int kPartO = 0, kPartDown = 1;

// Rank q's copy of an address inside the shared buffer (delta in bytes, sync.cuh consumer_signal_ranks).
template <class T>
__device__ __forceinline__ T* on_rank(T* p, int64_t delta) {
  return reinterpret_cast<T*>(reinterpret_cast<uint8_t*>(p) + delta);
}

// The W partials of stage `which` (kPartO / kPartDown) of layer l: [W][H], rank q's at + q * H.
__device__ __forceinline__ bf16* layer_parts(const ModelArgs& m, int l, int which, int W, int H) {
  return m.tp_parts + (static_cast<size_t>(l) * 2 + which) * W * H;
}

// bf16(sum over q of parts[q * H + i], fp32 in rank order): the all-reduced value of element i.
__device__ __forceinline__ float sum_parts(const bf16* parts, int W, int H, int i) {
  float v = bf2f(ld_cg_u16(parts + i));
  for (int q = 1; q < W; ++q) v += bf2f(ld_cg_u16(parts + static_cast<size_t>(q) * H + i));
  return round_bf16(v);
}

// For the rows of a stage's chunks this block owns (c0, c0 + G, ...; nu rows each, rows < N): the residual
// bf16(allreduce(parts) + add) of each row, written to out (read by other blocks of this rank after the stage's
// counter). Replaces gather_rows under tensor parallelism, where no block holds a reduced row until it sums one.
__device__ __forceinline__ void sum_rows_to(bf16* out, const bf16* parts, int W, const bf16* add, int c0, int mine,
                                            int nu, int N) {
  for (int k = threadIdx.x; k < mine * nu; k += MonoConfig::kConsumerThreads) {
    const int row = owned_row(c0, k, nu);
    if (row < N) {
      const float v = round_bf16(sum_parts(parts, W, N, row) + bf2f(ld_cg_u16(add + row)));
      reinterpret_cast<uint16_t*>(out)[row] = f2bf_bits(v);
    }
  }
}

// Element r of this rank's partial (already bf16-rounded v) into every rank's copy of `mine` ([H], this rank's
// slot of a layer_parts block).
__device__ __forceinline__ void push_partial(bf16* mine, int r, float v, int W, const int64_t* delta) {
  const uint16_t bits = f2bf_bits(v);
  for (int q = 0; q < W; ++q) reinterpret_cast<uint16_t*>(on_rank(mine, delta[q]))[r] = bits;
}

// Run by one thread of the block that finished this rank's LM head for token epoch e: publishes this rank's best
// key to every rank, waits for all W, returns the best of them (the vocabulary is sharded: keys carry global rows).
__device__ __forceinline__ uint64_t tp_best_key(const ModelArgs& m, uint64_t key, uint32_t e, int W, int rank,
                                                const int64_t* delta) {
  uint64_t* slots = m.tp_keys + static_cast<size_t>(e & 1u) * W;
  uint8_t* ctr = reinterpret_cast<uint8_t*>(counter(m.counters, kCtrTpLM));
  for (int q = 0; q < W; ++q) {
    *on_rank(slots + rank, delta[q]) = key;
    red_release_add_sys(reinterpret_cast<uint32_t*>(ctr + delta[q]), 1u);
  }
  spin_until(m.counters, kCtrTpLM, (e + 1u) * static_cast<uint32_t>(W), true);
  uint64_t best = 0;
  for (int q = 0; q < W; ++q) {
    const uint64_t k = ld_cg_u64(slots + q);
    best = k > best ? k : best;
  }
  return best;
}

}  // namespace kog
