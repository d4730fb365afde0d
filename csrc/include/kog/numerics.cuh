// bf16 <-> fp32 and the small reductions every stage uses. Rounding follows torch: fp32 -> bf16 is
// round-to-nearest-even (__float2bfloat16_rn), bf16 -> fp32 is exact.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

#include "kog/config.cuh"

namespace kog {

__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf2f(uint16_t u) { return __uint_as_float(static_cast<uint32_t>(u) << 16); }
__device__ __forceinline__ uint16_t f2bf_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
// The value a torch bf16 tensor would hold for f.
__device__ __forceinline__ float round_bf16(float f) { return bf2f(f2bf_bits(f)); }

__device__ __forceinline__ void unpack8(const uint4 v, float (&f)[8]) {
  f[0] = bf_lo(v.x); f[1] = bf_hi(v.x); f[2] = bf_lo(v.y); f[3] = bf_hi(v.y);
  f[4] = bf_lo(v.z); f[5] = bf_hi(v.z); f[6] = bf_lo(v.w); f[7] = bf_hi(v.w);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return static_cast<uint32_t>(f2bf_bits(lo)) | (static_cast<uint32_t>(f2bf_bits(hi)) << 16);
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}

// The f16 pair {lo, hi} (lo in the low half) of two fp32 values that hold bf16 values, times 2^-kFp8HalfShift (the FP8
// kernel's f16 input vector, fp8.cuh): exact for 2^-6 <= |v| (bf16's 8-bit significand fits f16's 11 bits), an
// absolute error <= 2^-17 below. `over` is set where |v| > kFp8HalfMaxInput or v is NaN (config.cuh).
__device__ __forceinline__ uint32_t pack2_f16(float lo, float hi, bool& over) {
  over |= !(fabsf(lo) <= kFp8HalfMaxInput) || !(fabsf(hi) <= kFp8HalfMaxInput);
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi * kFp8HalfScale), "f"(lo * kFp8HalfScale));
  return r;
}
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t u, bool& over) {
  return pack2_f16(bf_lo(u), bf_hi(u), over);
}
__device__ __forceinline__ uint4 bf16x8_to_f16x8(const uint4 v, bool& over) {
  return make_uint4(bf16x2_to_f16x2(v.x, over), bf16x2_to_f16x2(v.y, over), bf16x2_to_f16x2(v.z, over),
                    bf16x2_to_f16x2(v.w, over));
}

// acc + sum_i w[i] * x[i] over 8 bf16 pairs, fp32, two independent FMA chains.
__device__ __forceinline__ float dot8(const uint4 w, const uint4 x, float acc) {
  float a = 0.f, b = 0.f;
  a = fmaf(bf_lo(w.x), bf_lo(x.x), a); b = fmaf(bf_hi(w.x), bf_hi(x.x), b);
  a = fmaf(bf_lo(w.y), bf_lo(x.y), a); b = fmaf(bf_hi(w.y), bf_hi(x.y), b);
  a = fmaf(bf_lo(w.z), bf_lo(x.z), a); b = fmaf(bf_hi(w.z), bf_hi(x.z), b);
  a = fmaf(bf_lo(w.w), bf_lo(x.w), a); b = fmaf(bf_hi(w.w), bf_hi(x.w), b);
  return acc + (a + b);
}

// 2^(x - m), and 0 for x = -inf (also where m is -inf: an empty online-softmax state contributes nothing).
__device__ __forceinline__ float exp2_or_zero(float x, float m) { return x == -INFINITY ? 0.f : exp2f(x - m); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

}  // namespace kog
