// Greedy sampling over the LM head's bf16 logits, across blocks without a barrier.
// A logit and its row pack into one 64-bit key whose unsigned order is (value, then lower row first): the
// maximum key is torch.argmax over the bf16 logits of the logical vocabulary (first index of the maximum).
// Each block reduces its rows to one key in argmax_slots[block]; the last block to arrive on the LM counter
// reduces the grid's slots and publishes the token.
#pragma once

#include <cstdint>

#include "kog/config.cuh"
#include "kog/sync.cuh"
#include "kog/warp.cuh"

namespace kog {

__device__ __forceinline__ uint64_t argmax_key(float v, uint32_t row) {
  if (v == 0.f) v = 0.f;  // -0 == +0 for argmax
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint64_t>(0xffffffffu - row);
}
__device__ __forceinline__ uint32_t argmax_row(uint64_t key) {
  return 0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu);
}

// Block-wide max of per-thread keys; result valid in consumer thread 0. keys_s: kConsumerWarps entries.
__device__ __forceinline__ uint64_t consumer_max_key(uint64_t key, uint64_t* keys_s) {
  key = warp_max_u64(key);
  if ((threadIdx.x & 31) == 0) keys_s[threadIdx.x >> 5] = key;
  consumer_sync();
  uint64_t best = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < MonoConfig::kConsumerWarps; ++w) best = keys_s[w] > best ? keys_s[w] : best;
  }
  return best;
}

// Run by warp 0 of the last block: the grid's best key.
__device__ __forceinline__ uint64_t grid_max_key(const uint64_t* slots, int grid) {
  uint64_t best = 0;
  for (int i = threadIdx.x & 31; i < grid; i += 32) {
    const uint64_t k = ld_cg_u64(slots + i);
    best = k > best ? k : best;
  }
  return warp_max_u64(best);
}

}  // namespace kog
