// RMSNorm of the residual stream into shared memory, computed redundantly by every block that needs it (the
// vector is H <= 8192 bf16, <= 16 KiB from L2; cheaper than another dependency hop).
//   s = float(a) + float(b)            (a may be null: s = float(b))
//   y = bf16(bf16(s * rsqrt(mean(s^2) + eps)) * w)     -- torch_step.add_rms_norm / rms_norm
#pragma once

#include "kog/config.cuh"
#include "kog/numerics.cuh"
#include "kog/sync.cuh"

namespace kog {

// Sum over the consumer threads; `red` holds kConsumerWarps floats and must not be reused before a later
// consumer barrier.
__device__ __forceinline__ float consumer_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  consumer_sync();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < MonoConfig::kConsumerWarps; ++w) t += red[w];
  return t;
}

// x_s[0:H] = rmsnorm(a + b) * w as bf16 (w: read-only for the launch). a, b: bf16 [H] in global memory (possibly
// written by other blocks in this launch: read through L2). With na > 1, a is na partial sums a_stride elements
// apart (tensor-parallel ranks) and stands for bf16(a_0 + a_1 + ... in fp32, rank order): the all-reduce's result.
// Ends with a consumer barrier. kF16: x_s holds the same values as scaled f16 (the FP8 kernel's f16 GEMV, fp8.cuh)
// and the result says, on every consumer thread, whether one of them was beyond kFp8HalfMaxInput (numerics.cuh
// pack2_f16); false otherwise.
template <bool kF16 = false>
__device__ __forceinline__ bool rmsnorm_to_smem(bf16* x_s, const bf16* a, const bf16* b, const bf16* w, int H,
                                                float eps, float* red, int na = 1, int a_stride = 0) {
  constexpr int kIt = MonoConfig::kMaxNormIters;
  const int tid = threadIdx.x;
  float s[kIt][8];
  float ss = 0.f;
  // The norm weights travel with the inputs, in the same round trip, into this thread's own elements of x_s (free:
  // the stage that read it has ended at a barrier): issued after the barrier of consumer_sum, the loads would be
  // one more L2 round trip (the wait before this call has invalidated L1), and in registers they cost spills.
#pragma unroll
  for (int it = 0; it < kIt; ++it) {
    const int i = (it * MonoConfig::kConsumerThreads + tid) * 8;
    if (i < H) cp_async_16(x_s + i, w + i);
  }
#pragma unroll
  for (int it = 0; it < kIt; ++it) {
    const int i = (it * MonoConfig::kConsumerThreads + tid) * 8;
    if (i < H) {
      unpack8(ld_cg_v4(b + i), s[it]);
      if (a != nullptr) {
        float t[8];
        unpack8(ld_cg_v4(a + i), t);
        if (na > 1) {
          for (int q = 1; q < na; ++q) {
            float u[8];
            unpack8(ld_cg_v4(a + static_cast<size_t>(q) * a_stride + i), u);
#pragma unroll
            for (int e = 0; e < 8; ++e) t[e] += u[e];
          }
#pragma unroll
          for (int e = 0; e < 8; ++e) t[e] = round_bf16(t[e]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) s[it][e] = t[e] + s[it][e];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = fmaf(s[it][e], s[it][e], ss);
    }
  }
  ss = consumer_sum(ss, red);
  const float r = rsqrtf(ss / static_cast<float>(H) + eps);
  bool over = false;
  cp_async_wait_all();
#pragma unroll
  for (int it = 0; it < kIt; ++it) {
    const int i = (it * MonoConfig::kConsumerThreads + tid) * 8;
    if (i < H) {
      float wf[8], y[8];
      unpack8(*reinterpret_cast<const uint4*>(x_s + i), wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = __fmul_rn(round_bf16(__fmul_rn(s[it][e], r)), wf[e]);
      if constexpr (kF16) {
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = round_bf16(y[e]);
        *reinterpret_cast<uint4*>(x_s + i) = make_uint4(pack2_f16(y[0], y[1], over), pack2_f16(y[2], y[3], over),
                                                        pack2_f16(y[4], y[5], over), pack2_f16(y[6], y[7], over));
      } else {
        *reinterpret_cast<uint4*>(x_s + i) = pack8(y);
      }
    }
  }
  if constexpr (kF16) return consumer_sync_or(over);
  consumer_sync();
  return false;
}

// x_s[0:n] = src[0:n] (bf16, n % 8 == 0, written by other blocks). Ends with a consumer barrier. kF16 and the
// result: as rmsnorm_to_smem's.
template <bool kF16 = false>
__device__ __forceinline__ bool copy_to_smem(bf16* x_s, const bf16* src, int n) {
  bool over = false;
  for (int i = threadIdx.x * 8; i < n; i += MonoConfig::kConsumerThreads * 8) {
    const uint4 v = ld_cg_v4(src + i);
    *reinterpret_cast<uint4*>(x_s + i) = kF16 ? bf16x8_to_f16x8(v, over) : v;
  }
  if constexpr (kF16) return consumer_sync_or(over);
  consumer_sync();
  return false;
}

}  // namespace kog
