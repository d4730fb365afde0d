// Warp-level reductions shared by the LM-head argmax and the sampler. No torch headers.
#pragma once

#include <cstdint>

namespace kog {

// Max of a 64-bit key over the 32 lanes of a full warp; every lane gets it.
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const uint64_t o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

}  // namespace kog
