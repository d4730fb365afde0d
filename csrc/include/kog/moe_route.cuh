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

// Bounds of the route (the gate's tiling.MOE_MAX_EXPERTS / MOE_MAX_TOP_K): E probabilities in the caller's shared
// memory (the monokernel: its residual rows, moe_stages.cuh).
constexpr int kMoeMaxExperts = 256;
constexpr int kMoeMaxTopK = 8;

// probs: shared memory of >= E floats, chosen: of >= k floats (scratch, only this warp's). Lane `lane` takes experts
// lane, lane + 32, ... (i < E). ids [k] (int32) and weights [k] (fp32) are written by lane 0. Called by all 32 lanes
// of one warp. The logits are read through L2 (other blocks of the launch wrote them).
// Softmax as vLLM's topk_softmax computes it: m = max logit, e_i = exp(l_i - m), p_i = e_i * (1 / sum e). The
// per-expert values live in shared memory, not in registers: inlined into the monokernel, register arrays here made
// the kernel's GEMV loops spill.
__device__ __forceinline__ void moe_route_warp(const uint16_t* logits, int E, int k, bool norm_topk_prob,
                                               int32_t* ids, float* weights, float* probs, float* chosen) {
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int i = lane; i < E; i += 32) {
    const float v = bf2f(ld_cg_u16(logits + i));
    probs[i] = v;
    mx = fmaxf(mx, v);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.f;
  for (int i = lane; i < E; i += 32) {
    const float e = expf(probs[i] - mx);
    probs[i] = e;
    sum += e;
  }
  const float inv = 1.f / warp_sum(sum);
  for (int i = lane; i < E; i += 32) probs[i] *= inv;
  // k rounds of the warp's largest key: the probability's bits above (non-negative floats order as their bits),
  // the complement of the expert index below (the lower index wins a tie). A chosen expert's probability drops to -1.
  float chosen_sum = 0.f;
  for (int r = 0; r < k; ++r) {
    uint64_t best = 0;
    for (int i = lane; i < E; i += 32) {
      // A chosen expert (-1) has key 0; a NaN probability (NaN router logits) counts as 0, so that every round
      // still picks a valid expert (E >= k) and no loader reads past w13 / w2.
      const float p = probs[i];
      const uint32_t bits = p >= 0.f ? __float_as_uint(p) : 0u;
      const uint64_t key = p == -1.f ? 0 : (static_cast<uint64_t>(bits) << 32) |
                                               (0xffffffffu - static_cast<uint32_t>(i));
      best = key > best ? key : best;
    }
    best = warp_max_u64(best);
    const int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best));
    const float prob = __uint_as_float(static_cast<uint32_t>(best >> 32));
    if (lane == (id & 31)) probs[id] = -1.f;
    __syncwarp();
    if (lane == 0) {
      ids[r] = id;
      chosen[r] = prob;
    }
    chosen_sum += prob;
  }
  // (chosen_sum adds the k probabilities in slot order; the reference's w / w.sum() may add them in another.)
  if (lane == 0) {
    for (int r = 0; r < k; ++r) weights[r] = norm_topk_prob ? __fdiv_rn(chosen[r], chosen_sum) : chosen[r];
  }
}

}  // namespace kog
