// The route of a MoE layer for one token (docs/moe.md, the kernel's schedule): from the router's E bf16 logits, the
// fp32 softmax, the k most probable experts (equal probabilities: the lower expert index first, as vLLM's
// topk_softmax kernel) in decreasing order, and their weights, renormalised to sum 1 when norm_topk_prob. One warp
// does it (the router stage's last block, once per layer and token); kog_backend.reference.moe_step.route is the
// reference. No torch headers.
#pragma once

#include <cstdint>

#include "kog/numerics.cuh"
#include "kog/sync.cuh"
#include "kog/warp.cuh"

namespace kog {

// Bounds of the route (the gate's tiling.MOE_MAX_EXPERTS / MOE_MAX_TOP_K): E probabilities held 8 per lane.
constexpr int kMoeMaxExperts = 256;
constexpr int kMoeMaxTopK = 8;
constexpr int kMoeProbsPerLane = kMoeMaxExperts / 32;
static_assert(kMoeProbsPerLane * 32 == kMoeMaxExperts, "the lanes hold the probabilities evenly");

// Lane `lane` holds experts lane, lane + 32, ... (i < E); the other slots hold -inf logits and 0 probabilities.
// The logits are read through L2 (other blocks of the launch wrote them).
// ids [k] (int32) and weights [k] (fp32) are written by lane 0. Called by all 32 lanes of one warp.
// Softmax as vLLM's topk_softmax computes it: m = max logit, e_i = exp(l_i - m), p_i = e_i * (1 / sum e).
__device__ __forceinline__ void moe_route_warp(const uint16_t* logits, int E, int k, bool norm_topk_prob,
                                               int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  float p[kMoeProbsPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kMoeProbsPerLane; ++j) {
    const int i = lane + 32 * j;
    p[j] = i < E ? bf2f(ld_cg_u16(logits + i)) : -INFINITY;
    mx = fmaxf(mx, p[j]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kMoeProbsPerLane; ++j) {
    p[j] = lane + 32 * j < E ? expf(p[j] - mx) : 0.f;
    sum += p[j];
  }
  const float inv = 1.f / warp_sum(sum);
#pragma unroll
  for (int j = 0; j < kMoeProbsPerLane; ++j) p[j] *= inv;
  // k rounds of the warp's largest key: the probability's bits above (non-negative floats order as their bits),
  // the complement of the expert index below (the lower index wins a tie). A chosen expert's slot drops to -1.
  float chosen_sum = 0.f;
  float chosen[kMoeMaxTopK];
  int32_t chosen_id[kMoeMaxTopK];
#pragma unroll
  for (int r = 0; r < kMoeMaxTopK; ++r) {
    if (r >= k) break;
    uint64_t best = 0;
#pragma unroll
    for (int j = 0; j < kMoeProbsPerLane; ++j) {
      const int i = lane + 32 * j;
      const uint64_t bits = static_cast<uint64_t>(__float_as_uint(p[j])) << 32;
      const uint64_t key = i < E && p[j] >= 0.f ? bits | (0xffffffffu - static_cast<uint32_t>(i)) : 0;
      best = key > best ? key : best;
    }
    best = warp_max_u64(best);
    const int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best));
    const float prob = __uint_as_float(static_cast<uint32_t>(best >> 32));
#pragma unroll
    for (int j = 0; j < kMoeProbsPerLane; ++j) {
      if (lane + 32 * j == id) p[j] = -1.f;
    }
    chosen[r] = prob;
    chosen_id[r] = id;
    chosen_sum += prob;
  }
  // (chosen_sum adds the k probabilities in slot order; the reference's w / w.sum() may add them in another.)
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kMoeMaxTopK; ++r) {
      if (r >= k) break;
      ids[r] = chosen_id[r];
      weights[r] = norm_topk_prob ? __fdiv_rn(chosen[r], chosen_sum) : chosen[r];
    }
  }
}

}  // namespace kog
