// Per-head qk-norm (Qwen3) and neox-style RoPE, one warp per head, in torch_step's order and rounding:
//   x = bf16 GEMV output; if norm: x = bf16(bf16(x * rsqrt(mean(x^2) + eps)) * w)
//   (x1, x2) = halves of x; y = (x1 c - x2 s, x2 c + x1 s) in fp32 (no fused multiply-add, as torch's separate
//   elementwise ops), rounded to bf16 once. c, s = bf16 cos/sin at the position.
// Lane l holds elements d = l + 32 e (e < D / 32), so both members of a rotation pair sit in one lane.
#pragma once

#include "kog/numerics.cuh"
#include "kog/sync.cuh"
#include "kog/tagged.cuh"

namespace kog {

// src: the head's GEMV output, bf16 (kTagged false) or the tagged words of it (tagged.cuh; kTagged true: polled
// until each carries `tag`).
template <int D, bool kTagged = false>
__device__ __forceinline__ void qk_norm_rope_warp(const void* src, const bf16* norm_w, float eps,
                                                  const bf16* cos_sin_row, float (&y)[D / 32], uint32_t tag = 0,
                                                  uint32_t* ctrs = nullptr) {
  constexpr int E = D / 32;
  static_assert(E == 2 || E == 4, "head dim 64 or 128");
  const int lane = threadIdx.x & 31;
  // Every load first (the head's GEMV output, the norm weights, cos / sin at the position): one round trip.
  float x[E], w[E], c[E / 2], s[E / 2];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    if constexpr (!kTagged) x[e] = bf2f(ld_cg_u16(static_cast<const bf16*>(src) + lane + 32 * e));
    w[e] = norm_w != nullptr ? __bfloat162float(norm_w[lane + 32 * e]) : 0.f;
  }
#pragma unroll
  for (int e = 0; e < E / 2; ++e) {
    c[e] = __bfloat162float(cos_sin_row[lane + 32 * e]);
    s[e] = __bfloat162float(cos_sin_row[D / 2 + lane + 32 * e]);
  }
  if constexpr (kTagged) {
    uint16_t b[E];
    tagged_lane_words<E>(static_cast<const uint32_t*>(src), lane, tag, ctrs, b);
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = bf2f(b[e]);
  }
  if (norm_w != nullptr) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) ss = fmaf(x[e], x[e], ss);
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / static_cast<float>(D) + eps);
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = round_bf16(__fmul_rn(round_bf16(__fmul_rn(x[e], r)), w[e]));
  }
#pragma unroll
  for (int e = 0; e < E / 2; ++e) {
    const float x1 = x[e], x2 = x[e + E / 2];
    y[e] = round_bf16(__fsub_rn(__fmul_rn(x1, c[e]), __fmul_rn(x2, s[e])));
    y[e + E / 2] = round_bf16(__fadd_rn(__fmul_rn(x2, c[e]), __fmul_rn(x1, s[e])));
  }
}

}  // namespace kog
