// FP8 activations (ModelArgs::fp8_act, a variant of the FP8 kernel instantiation): each FP8 stage's input vector is
// quantised to e4m3 in shared memory as stock vLLM 0.26 quantises a linear layer's input on Hopper, and the stage's
// GEMV multiplies e4m3 weights by e4m3 inputs on the tensor cores (mma.m16n8k32, fp32 accumulators).
//
// Input scales (vLLM's QuantFP8, input_quant_fp8.py), by the weights' layout (ModelArgs::fp8_scaling):
//   kFp8Block128      per 128-element group g: s[g] = max(amax(x[g]) / 448, kFp8MinScale); q = e4m3(x / s[g])
//   kFp8PerRow/Tensor per token (one vector):   s    = max(amax(x) / 448, kFp8MinScale);    q = e4m3(x * (1 / s))
// (division and reciprocal correctly rounded, e4m3 round-to-nearest-even with saturation to +-448; the torch
// reference is reference/fp8_linear.quantise_input). y[n] = sum over 128-groups g of s_w(n, g) s[g] sum_{k in g}
// q[k] w8[n, k] (block), s_w(n) s sum_k q[k] w8[n, k] (per row / tensor).
//
// In shared memory the quantised vector replaces the bf16 one at x_s: bytes [0, K) the e4m3 values, then from byte
// fp8_act_scales_offset(K) the fp32 scales (ceil(K / 128) of them for block scales, else one). The bf16 vector is
// 2K bytes, so the quantised one fits inside it (K >= 32).
//
// The GEMV (gemv_partial_fp8_mma) keeps the CUDA-core form's split of a chunk (warp_share: a warp's unit and vector
// range; lane i takes vector base + i, 16 weight bytes and the 16 input bytes of the same columns). Lane 4 g + t
// passes its input words as its A fragment (rows g and g + 8 alike: columns 4t..4t+3 from word 0 / 2, 16+4t.. from
// word 1 / 3) and its weight words as its B fragment (column g, the same columns), so D[g][g] is the dot product of
// the 64 bytes the four lanes of group g own; the rest of D pairs one group's inputs with another's weights and is
// dropped. C's fragment puts D[g][g] on lane 4 g + g / 2 (element g % 2). A group's four vectors lie in one
// 128-column block (the pass starts at a multiple of 4 vectors), so block scales weigh D[g][g] once per step. Every
// step starts from zero accumulators and adds its 64-product sum into an fp32 register: the tensor cores' own FP8
// accumulation is narrower than fp32 (DeepSeek-V3's report, section 3.3.2, measured ~14 bits on Hopper) and sums
// only 64 products here. Per 16 bytes of weights a lane issues 2 shared-memory loads and 2 mma (and per 128
// columns a scale product) against the CUDA-core form's ~63 instructions (integration_tests/README.md: Nsight
// Compute on that form). tests/test_fp8_act_fragments.py replays the fragment maps lane by lane.
#pragma once

#include <cstdint>

#include "kog/config.cuh"
#include "kog/fp8.cuh"
#include "kog/gemv.cuh"
#include "kog/numerics.cuh"
#include "kog/sync.cuh"

namespace kog {

// Consumers::fp8_mode carries the weights' scaling (kFp8* of fp8.cuh) and, in this bit, ModelArgs::fp8_act.
constexpr int kFp8ScalingMask = 0xf;
constexpr int kFp8ActE4m3 = 0x10;
static_assert(kFp8Block128 <= kFp8ScalingMask, "the scaling modes fit below the activation bit");

__host__ __device__ constexpr int fp8_mode_word(int64_t scaling, int64_t act) {
  return static_cast<int>(scaling) | (act != 0 ? kFp8ActE4m3 : 0);
}

constexpr float kE4m3Max = 448.f;
// vLLM's _FP8_MIN_SCALING_FACTOR (input_quant_fp8.py): 1 / (448 * 512).
constexpr float kFp8MinScale = 1.f / (448.f * 512.f);
// Input elements one consumer thread quantises per pass (one 16-byte load of bf16), and per pass the block.
constexpr int kFp8ActPerThread = 8;
constexpr int kFp8ActPerPass = MonoConfig::kConsumerThreads * kFp8ActPerThread;
// Threads of one 128-element group: the group's amax is a shuffle reduction over them.
constexpr int kFp8ActGroupThreads = kFp8BlockLen / kFp8ActPerThread;
// The longest input a stage may have: the block-scale path keeps pass j's scales on the j-th thread of each group
// (an FFN of up to 32768: Llama-3-70B's 28672 under TP, Qwen2.5-32B's 27648).
constexpr int kFp8ActMaxK = kFp8ActPerPass * kFp8ActGroupThreads;
static_assert(kFp8ActGroupThreads == 16 && kFp8ActPerPass % kFp8BlockLen == 0, "half a warp per 128-element group");
static_assert(kFp8ActMaxK == 32768, "16 passes of 2048 inputs");

// Byte offset of the input scales after the K e4m3 values.
__host__ __device__ constexpr uint32_t fp8_act_scales_offset(int K) { return (static_cast<uint32_t>(K) + 15u) & ~15u; }

// Two floats as e4m3 (round to nearest even, saturating to +-448): lo in the low byte.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// Eight bf16 inputs (one 16-byte vector) times `mul` (per token) or divided by `div` (block), as 8 e4m3 bytes.
template <bool kDivide>
__device__ __forceinline__ uint2 quantise8(const uint4 v, float s) {
  float f[8];
  unpack8(v, f);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = kDivide ? __fdiv_rn(f[i], s) : __fmul_rn(f[i], s);
  return make_uint2(f32x2_to_e4m3x2(f[0], f[1]) | f32x2_to_e4m3x2(f[2], f[3]) << 16,
                    f32x2_to_e4m3x2(f[4], f[5]) | f32x2_to_e4m3x2(f[6], f[7]) << 16);
}

__device__ __forceinline__ float amax8(const uint4 v) {
  float f[8];
  unpack8(v, f);
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(f[i]));
  return m;
}

// The stage's input x_s (bf16 [K], complete: the fill's barrier published it) quantised in place as the header says;
// every consumer thread calls it, and its last barrier publishes the result. Pass p reads elements [2048 p,
// 2048 (p + 1)) (thread i: 8 at 2048 p + 8 i) and, after a barrier, writes their bytes [2048 p, 2048 (p + 1)): those
// overlay bf16 elements [1024 p, 1024 (p + 1)), read in pass p / 2 <= p, and no later pass's elements. The scales
// go last, after the barrier that ends every read. red: kConsumerWarps floats of scratch (SmemHeader::red_norm).
__device__ __forceinline__ void quantise_input_e4m3(bf16* x_s, int K, int scaling, float* red) {
  const int tid = threadIdx.x;
  const uint4* xv = reinterpret_cast<const uint4*>(x_s);
  uint2* qv = reinterpret_cast<uint2*>(x_s);
  float* scales = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(x_s) + fp8_act_scales_offset(K));
  const int passes = (K + kFp8ActPerPass - 1) / kFp8ActPerPass;
  if (scaling == kFp8Block128) {
    // The 16 threads of a group take turns keeping its scale until the end: the j-th of them pass j's (one
    // register each instead of one per pass).
    const int j = tid % kFp8ActGroupThreads;
    float kept = 0.f;
    for (int p = 0; p < passes; ++p) {
      const int e = p * kFp8ActPerPass + tid * kFp8ActPerThread;
      const uint4 v = e < K ? xv[e / kFp8ActPerThread] : make_uint4(0u, 0u, 0u, 0u);
      float m = amax8(v);
#pragma unroll
      for (int o = kFp8ActGroupThreads / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      const float s = fmaxf(__fdiv_rn(m, kE4m3Max), kFp8MinScale);
      if (p == j) kept = s;
      const uint2 q = quantise8<true>(v, s);
      consumer_sync();  // every read of the bytes this pass writes is done
      if (e < K) qv[e / kFp8ActPerThread] = q;
    }
    consumer_sync();  // every read is done: the scales' bytes are free
    // group of pass j for this thread's half-warp: j * (kFp8ActPerPass / 128) + tid / 16
    const int group = j * (kFp8ActPerPass / kFp8BlockLen) + tid / kFp8ActGroupThreads;
    if (j < passes && group * kFp8BlockLen < K) scales[group] = kept;
  } else {
    float m = 0.f;
    for (int e = tid * kFp8ActPerThread; e < K; e += kFp8ActPerPass) m = fmaxf(m, amax8(xv[e / kFp8ActPerThread]));
    m = warp_max(m);
    if ((tid & 31) == 0) red[tid >> 5] = m;
    consumer_sync();
    m = red[0];
#pragma unroll
    for (int w = 1; w < MonoConfig::kConsumerWarps; ++w) m = fmaxf(m, red[w]);
    const float s = fmaxf(__fdiv_rn(m, kE4m3Max), kFp8MinScale);
    const float inv = __frcp_rn(s);
    for (int p = 0; p < passes; ++p) {
      const int e = p * kFp8ActPerPass + tid * kFp8ActPerThread;
      const uint4 v = e < K ? xv[e / kFp8ActPerThread] : make_uint4(0u, 0u, 0u, 0u);
      const uint2 q = quantise8<false>(v, inv);
      consumer_sync();
      if (e < K) qv[e / kFp8ActPerThread] = q;
    }
    consumer_sync();  // (red is read by every thread before its first pass; rmsnorm reuses it only after this)
    if (tid == 0) scales[0] = s;
  }
  consumer_sync();
}

// d = A B: mma.m16n8k32, e4m3 A (row) and B (col), fp32 accumulators from zero. a01 / a23: this lane's A words of
// row g, columns 4t.. / 16 + 4t.. (row g + 8 gets the same); b0 / b1: its B words of column g, the same columns.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a01, uint32_t a23, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %4, %5, %5}, {%6, %7}, "
      "{%8, %8, %8, %8};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a01), "r"(a23), "r"(b0), "r"(b1), "f"(0.f));
}

// d += A B with the same operands as mma_e4m3.
__device__ __forceinline__ void mma_e4m3_acc(float (&d)[4], uint32_t a01, uint32_t a23, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %4, %5, %5}, {%6, %7}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a01), "r"(a23), "r"(b0), "r"(b1));
}

// The 64-product sum of this lane's group g for one 16-byte weight vector w and input vector x per lane: D[g][g],
// meaningful on lane 4 g + g / 2 (odd: g % 2).
__device__ __forceinline__ float group_dot64(const uint4 w, const uint4 x, bool odd) {
  float d[4];
  mma_e4m3(d, x.x, x.y, w.x, w.y);
  mma_e4m3_acc(d, x.z, x.w, w.z, w.w);
  return odd ? d[1] : d[0];
}

// gemv_partial_fp8 with e4m3 inputs on the tensor cores: same chunk, same results (the warp's fp32 partials of its
// unit's row(s) on every lane, scaled). x8: the quantised input (bytes), xs: its scales (the header's layout).
// kBlock: 128 x 128 weight blocks (scaling kFp8Block128), else per row / tensor; one loop each, unrolled twice.
template <bool kPair, bool kBlock>
__device__ __forceinline__ void gemv_partial_fp8_mma(const uint8_t* w_s, uint32_t skip0, uint32_t skip1,
                                                     const uint8_t* x8, const float* xs, int K, int nu, int wpu_log2,
                                                     int nvalid, int scaling, float& a0, float& a1) {
  const auto [lane, unit, v0, v1] = warp_share(K >> 4, wpu_log2);
  a0 = 0.f;
  a1 = 0.f;
  if (unit >= nvalid) return;  // (warp-uniform: the mma below needs the whole warp)
  const uint32_t rows_bytes = static_cast<uint32_t>(nu) * K * (kPair ? 2u : 1u);
  const float* s0 = reinterpret_cast<const float*>(w_s + fp8_span_offset(rows_bytes, K, 0)) + skip0;
  const float* s1 = reinterpret_cast<const float*>(w_s + fp8_span_offset(rows_bytes, K, 1)) + (kPair ? skip1 : 0u);
  const uint4* w0 = reinterpret_cast<const uint4*>(w_s + static_cast<size_t>(unit) * K);
  const uint4* w1 = reinterpret_cast<const uint4*>(w_s + static_cast<size_t>(nu + unit) * K);
  const uint4* xv = reinterpret_cast<const uint4*>(x8);
  const int g = lane >> 2;
  const bool odd = (g & 1) != 0, diag = (lane & 3) == (g >> 1);
  float acc0 = 0.f, acc1 = 0.f;
  int base = v0 & ~3;
  if (base == v0) {  // whole steps: every lane's vector in [v0, v1), no predicates
#pragma unroll 2
    for (; base + 32 <= v1; base += 32) {
      const int v = base + lane;
      const uint4 x = xv[v];
      if constexpr (kBlock) {
        const float sx = xs[v >> 3];
        acc0 = fmaf(group_dot64(w0[v], x, odd), s0[v >> 3] * sx, acc0);
        if constexpr (kPair) acc1 = fmaf(group_dot64(w1[v], x, odd), s1[v >> 3] * sx, acc1);
      } else {
        acc0 += group_dot64(w0[v], x, odd);
        if constexpr (kPair) acc1 += group_dot64(w1[v], x, odd);
      }
    }
  }
  // The part's first and last steps where they are partial: lanes outside [v0, v1) pass zeros (zero weights too: a
  // stale NaN byte of the slot must not reach D), so a group's D[g][g] sums its lanes inside the range. A group's
  // scale index is clamped into the range: a group wholly outside has D = 0 and a finite scale.
  for (; base < v1; base += 32) {
    const int v = base + lane;
    const bool ok = v >= v0 && v < v1;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    const uint4 x = ok ? xv[v] : z;
    if constexpr (kBlock) {
      const int blk = min(base + (lane & ~3), v1 - 1) >> 3;
      const float sx = xs[blk];
      acc0 = fmaf(group_dot64(ok ? w0[v] : z, x, odd), s0[blk] * sx, acc0);
      if constexpr (kPair) acc1 = fmaf(group_dot64(ok ? w1[v] : z, x, odd), s1[blk] * sx, acc1);
    } else {
      acc0 += group_dot64(ok ? w0[v] : z, x, odd);
      if constexpr (kPair) acc1 += group_dot64(ok ? w1[v] : z, x, odd);
    }
  }
  if constexpr (!kBlock) {
    const int si = scaling == kFp8PerRow ? unit : 0;
    acc0 *= s0[si] * xs[0];
    if constexpr (kPair) acc1 *= s1[si] * xs[0];
  }
  a0 = warp_sum(diag ? acc0 : 0.f);
  if constexpr (kPair) a1 = warp_sum(diag ? acc1 : 0.f);
}

}  // namespace kog
