// FP8 (e4m3) projection weights, weight-only: the FP8 kernel instantiation (kFp8) streams the four projections of
// every layer as float8 bytes with their fp32 scales and multiplies them with the bf16 input vector in fp32. The LM
// head, embedding and norms stay bf16.
//
// Scales (ModelArgs::fp8_scaling; vLLM's loaded weight_scale / weight_scale_inv), for a projection of N rows, K columns:
//   kFp8PerTensor  s[0]                              one per matrix (vLLM requantises fused shards to one at load)
//   kFp8PerRow     s[n]                              [N] (gate/up: gate rows then up rows)
//   kFp8Block128   s[(n / 128) * ceil(K / 128) + k / 128]   [ceil(N / 128), ceil(K / 128)] row-major
// W[n, k] = float(w8[n, k]) * scale(n, k); y[n] = sum_k x[k] W[n, k] in fp32, rounded once to bf16 by the stage.
//
// A chunk's slot holds its rows (nu x K bytes; a gate/up chunk: gate rows, then up rows) and after them its scales:
// the loader copies, with the rows, the 16-byte-aligned span of global memory around the scales the chunk uses (the
// rows' words per row, one block row per block-scaled half: a chunk's nu <= 8 consecutive rows never straddle two
// 128-row blocks), so the consumers read scales from shared memory and never wait on global memory for them. The
// span starts up to 3 words before the first scale and ends up to 3 words after the last, inside the same 16-byte
// sectors: within the scale tensor's allocation (the CUDA caching allocator rounds every block to 512 bytes).
// Where the chunk's scales start inside its span (`skip`, in words) follows from the scale tensor's address: the
// loader and the consumers compute it alike (fp8_span).
#pragma once

#include <cstdint>

#include "kog/config.cuh"
#include "kog/gemv.cuh"
#include "kog/numerics.cuh"

namespace kog {

enum Fp8Scaling : int { kFp8None = 0, kFp8PerTensor = 1, kFp8PerRow = 2, kFp8Block128 = 3 };
constexpr int kFp8BlockLen = 128;      // rows and columns of one scale block
constexpr int kFp8MaxRowScales = MonoConfig::kConsumerWarps;  // scales of one half of a per-row chunk (nu)

__host__ __device__ constexpr int fp8_block_cols(int K) { return (K + kFp8BlockLen - 1) / kFp8BlockLen; }

// Bytes of one half's scale span in a slot (a gate/up chunk has two halves): the scales a half can need (block:
// ceil(K / 128); per row: nu <= kConsumerWarps; per tensor: 1) plus up to 3 words on either side, in 16-byte units.
__host__ __device__ constexpr int fp8_span_bytes(int K) {
  return ((4 * (fp8_block_cols(K) > kFp8MaxRowScales ? fp8_block_cols(K) : kFp8MaxRowScales) + 24 + 15) / 16) * 16;
}
// Bytes of a slot an FP8 layer chunk needs after its rows: the halves' scale spans. plan.py reserves them in every
// FP8 layer stage (fp8_tail_bytes there).
__host__ __device__ constexpr int fp8_tail_bytes(int K, bool pair) { return (pair ? 2 : 1) * fp8_span_bytes(K); }

// Scale span of one half of a chunk: rows [r, r + n) of a matrix of K columns with scales s.
struct Fp8Span {
  const float* src;  // 16-byte aligned
  uint32_t bytes;    // multiple of 16
  uint32_t skip;     // words from src to the first scale the half uses
};

__device__ __forceinline__ Fp8Span fp8_span(const float* s, int mode, int K, int r, int n) {
  int first = 0, count = 1;  // kFp8PerTensor
  if (mode == kFp8PerRow) {
    first = r;
    count = n;
  } else if (mode == kFp8Block128) {
    count = fp8_block_cols(K);
    first = (r / kFp8BlockLen) * count;
  }
  const uintptr_t a = reinterpret_cast<uintptr_t>(s + first);
  const uintptr_t lo = a & ~uintptr_t{15}, hi = (a + 4u * static_cast<uint32_t>(count) + 15u) & ~uintptr_t{15};
  return Fp8Span{reinterpret_cast<const float*>(lo), static_cast<uint32_t>(hi - lo), static_cast<uint32_t>((a - lo) >> 2)};
}

// Byte offset inside a slot of half h's scale span, for a chunk whose rows take rows_bytes (a multiple of 16).
__device__ __forceinline__ uint32_t fp8_span_offset(uint32_t rows_bytes, int K, int h) {
  return rows_bytes + static_cast<uint32_t>(h * fp8_span_bytes(K));
}

// Which FP8 rows chunk `c` of a layer stage covers (gemv.cuh's chunk_of with K bytes per row).
__device__ __forceinline__ Chunk chunk_of_fp8(const StageGeom& g, const bf16* w, bool pair, int c) {
  const int K = g.k, N = g.n, nu = g.nu;
  const uint8_t* w8 = reinterpret_cast<const uint8_t*>(w);
  Chunk ch;
  ch.r0 = c * nu;
  ch.nvalid = min(nu, N - ch.r0);
  ch.src0 = reinterpret_cast<const bf16*>(w8 + static_cast<size_t>(ch.r0) * K);
  ch.bytes0 = static_cast<uint32_t>(ch.nvalid) * K;
  if (pair) {
    ch.src1 = reinterpret_cast<const bf16*>(w8 + static_cast<size_t>(N + ch.r0) * K);
    ch.bytes1 = ch.bytes0;
  } else {
    ch.src1 = nullptr;
    ch.bytes1 = 0;
  }
  return ch;
}

// Copies the loader keeps in flight (run_loader's cap, ModelArgs::max_inflight) while it streams FP8 chunks of
// `bytes` rows: about cap slots' worth of bytes (tuning.md kMaxInflight: two 32 KiB copies carry the read stream).
// A bf16 chunk fills its slot wherever the slot limits nu; an FP8 chunk of the same rows is half as long, and nu
// stops at kConsumerWarps, so it takes more copies to keep as many bytes in flight. At most ns - 1; the bf16 LM head
// of an FP8 kernel keeps cap.
__device__ __forceinline__ int fp8_inflight_cap(int cap, int ns, size_t slot_bytes, uint32_t bytes) {
  if (cap <= 0 || cap >= ns || bytes == 0) return cap;
  const int n = static_cast<int>((static_cast<uint64_t>(cap) * slot_bytes) / bytes);
  return min(ns - 1, max(cap, n));
}

// Shared-memory offset (bytes) of the up rows of an FP8 gate/up chunk inside its slot: nu rows of K bytes.
__device__ __forceinline__ uint32_t fp8_pair_offset_bytes(int K, int nu) { return static_cast<uint32_t>(nu) * K; }

// Two e4m3 values (the low 16 bits of v; element 0 in the low byte) as fp32, exactly: cvt.rn.f16x2.e4m3x2 (sm_89+;
// every e4m3 value is an f16), then f16 -> f32.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t v) {
  uint32_t h2;
  const uint16_t lo16 = static_cast<uint16_t>(v & 0xffffu);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(lo16));
  float2 f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f.x) : "h"(static_cast<uint16_t>(h2 & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(f.y) : "h"(static_cast<uint16_t>(h2 >> 16)));
  return f;
}

// acc + sum_i float(w[i]) * x[i] over 4 e4m3 weights (one 32-bit word, element i in byte i) and 4 bf16 inputs
// (x01: elements 0, 1; x23: 2, 3).
__device__ __forceinline__ float dot4_e4m3(uint32_t w, uint32_t x01, uint32_t x23, float acc) {
  const float2 a = e4m3x2_to_float2(w);
  const float2 b = e4m3x2_to_float2(w >> 16);
  acc = fmaf(a.x, bf_lo(x01), acc);
  acc = fmaf(a.y, bf_hi(x01), acc);
  acc = fmaf(b.x, bf_lo(x23), acc);
  return fmaf(b.y, bf_hi(x23), acc);
}

// sum over one 16-byte vector of e4m3 weights (16 values) and the matching two 16-byte vectors of bf16 inputs, fp32,
// two independent FMA chains.
__device__ __forceinline__ float dot16_e4m3(const uint4 w, const uint4 xa, const uint4 xb) {
  float a = dot4_e4m3(w.x, xa.x, xa.y, 0.f);
  float b = dot4_e4m3(w.y, xa.z, xa.w, 0.f);
  a = dot4_e4m3(w.z, xb.x, xb.y, a);
  b = dot4_e4m3(w.w, xb.z, xb.w, b);
  return a + b;
}

// ---- the f16 form (ModelArgs::fp8_gemv kFp8GemvHalf) -------------------------------------------------------------
// x_s holds the input as f16 times 2^-kFp8HalfShift (the stage's fill converts it: rmsnorm_to_smem<true> and its
// siblings, numerics.cuh pack2_f16); a launch whose input holds |x| > kFp8HalfMaxInput aborts instead (site
// kSiteFp8Range) and the host moves its table to the CUDA-core form. Per 16-byte vector a lane converts its 16 e4m3
// weights pairwise to f16x2 (exact), multiplies them with the 16 inputs in two chains of four f16x2 FMAs (f16 sums,
// one rounding per step), adds the chains and converts the pair to fp32: ~24 instructions per vector where the
// CUDA-core form issues ~60 (8 conversions, 16 f16 -> fp32 conversions, 16 input unpacks, 16 FMAs). Range: |w| <= 448
// and |x| 2^-kFp8HalfShift <= 16 keep every f16 partial sum within 8 x 448 x 16 = 57,344 < 65,504 (config.cuh).
// Precision: the f16 sums put the dot product ~4e-4 (relative norm) from its exact value, a quarter of its final
// bf16 rounding (reference/fp8_linear.py half_form_linear_fp32 replays them; tests/test_fp8_half_form.py measures it).

// f16x2 of two e4m3 values (the low 16 bits of v; element 0 in the low half): exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<uint16_t>(v & 0xffffu)));
  return h2;
}
// The same of the high 16 bits of v (element 2 in the low half), taken as the register's upper half, so that no shift
// precedes the conversion.
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t v) {
  uint32_t h2;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(h2) : "r"(v));
  return h2;
}
// f16x2 a * b and a * b + c, rounded once per lane.
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t hadd2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// fp32 lo + hi of an f16x2.
__device__ __forceinline__ float f16x2_sum(uint32_t v) {
  float lo, hi;
  asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
      : "=f"(lo), "=f"(hi)
      : "r"(v));
  return lo + hi;
}

// One 16-byte vector of 16 e4m3 weights w against its 16 scaled f16 inputs xa (elements 0-7, one f16x2 per word), xb
// (8-15): chain a takes element pairs {0, 1}, {2, 3}, {8, 9}, {10, 11}, chain b {4, 5}, {6, 7}, {12, 13}, {14, 15},
// each in this order; then a + b and its two halves in fp32. The scaled dot product (times 2^-kFp8HalfShift).
__device__ __forceinline__ float half_dot16_e4m3(const uint4 w, const uint4 xa, const uint4 xb) {
  uint32_t a = hmul2(e4m3x2_to_f16x2(w.x), xa.x);
  uint32_t b = hmul2(e4m3x2_to_f16x2(w.y), xa.z);
  a = hfma2(e4m3x2_hi_to_f16x2(w.x), xa.y, a);
  b = hfma2(e4m3x2_hi_to_f16x2(w.y), xa.w, b);
  a = hfma2(e4m3x2_to_f16x2(w.z), xb.x, a);
  b = hfma2(e4m3x2_to_f16x2(w.w), xb.z, b);
  a = hfma2(e4m3x2_hi_to_f16x2(w.z), xb.y, a);
  b = hfma2(e4m3x2_hi_to_f16x2(w.w), xb.w, b);
  return f16x2_sum(hadd2(a, b));
}

// The lane's fp32 sums of the unit's row(s) over its vectors of [v0, v1), scaled (block scales per vector, per-row
// and per-tensor once); kHalf: the f16 form (x_s holds the scaled f16 input), else the CUDA-core form.
template <bool kPair, bool kHalf>
__device__ __forceinline__ void fp8_lane_sums(const uint4* w0, const uint4* w1, const float* s0, const float* s1,
                                              const uint4* xv, int lane, int unit, int v0, int v1, int mode,
                                              float& a0, float& a1) {
  auto dot = [](const uint4 w, const uint4 xa, const uint4 xb) {
    if constexpr (kHalf) {
      return half_dot16_e4m3(w, xa, xb);
    } else {
      return dot16_e4m3(w, xa, xb);
    }
  };
  if (mode == kFp8Block128) {
#pragma unroll 4
    for (int v = v0 + lane; v < v1; v += 32) {
      const uint4 xa = xv[2 * v], xb = xv[2 * v + 1];
      a0 = fmaf(s0[v >> 3], dot(w0[v], xa, xb), a0);
      if constexpr (kPair) a1 = fmaf(s1[v >> 3], dot(w1[v], xa, xb), a1);
    }
  } else {
#pragma unroll 4
    for (int v = v0 + lane; v < v1; v += 32) {
      const uint4 xa = xv[2 * v], xb = xv[2 * v + 1];
      a0 += dot(w0[v], xa, xb);
      if constexpr (kPair) a1 += dot(w1[v], xa, xb);
    }
    const int si = mode == kFp8PerRow ? unit : 0;
    a0 *= s0[si];
    if constexpr (kPair) a1 *= s1[si];
  }
  if constexpr (kHalf) {  // undo the input's scaling (exact: a power of two)
    a0 *= kFp8HalfUnscale;
    if constexpr (kPair) a1 *= kFp8HalfUnscale;
  }
}

// One warp's share of one FP8 chunk's dot products with x_s (gemv.cuh's gemv_partial over FP8 rows, scaled): a row
// is K / 16 16-byte vectors (K a multiple of 16, plan.py), split over wpu = kConsumerWarps / nu warps as there.
// Vector v holds elements [16 v, 16 v + 16), one 128-column scale block's (v / 8). w_s: the chunk in its slot,
// rows_bytes = nu x K (x 2 for a pair) bytes of rows, then the scale spans (fp8_span_offset); skip0 / skip1: where
// each half's scales start in its span (fp8_span).
// gemv: ModelArgs::fp8_gemv (kFp8GemvHalf: x_s holds the scaled f16 input, fp8_lane_sums<.., true>).
template <bool kPair>
__device__ __forceinline__ void gemv_partial_fp8(const uint8_t* w_s, uint32_t skip0, uint32_t skip1, const bf16* x_s,
                                                 int K, int nu, int wpu_log2, int nvalid, int mode, int gemv,
                                                 float& a0, float& a1) {
  const auto [lane, unit, v0, v1] = warp_share(K >> 4, wpu_log2);
  a0 = 0.f;
  a1 = 0.f;
  if (unit < nvalid) {
    const uint32_t rows_bytes = static_cast<uint32_t>(nu) * K * (kPair ? 2u : 1u);
    const float* s0 = reinterpret_cast<const float*>(w_s + fp8_span_offset(rows_bytes, K, 0)) + skip0;
    const float* s1 = reinterpret_cast<const float*>(w_s + fp8_span_offset(rows_bytes, K, 1)) + (kPair ? skip1 : 0u);
    const uint4* w0 = reinterpret_cast<const uint4*>(w_s + static_cast<size_t>(unit) * K);
    const uint4* w1 = reinterpret_cast<const uint4*>(w_s + static_cast<size_t>(nu + unit) * K);
    const uint4* xv = reinterpret_cast<const uint4*>(x_s);
    if (gemv == kFp8GemvHalf) {
      fp8_lane_sums<kPair, true>(w0, w1, s0, s1, xv, lane, unit, v0, v1, mode, a0, a1);
    } else {
      fp8_lane_sums<kPair, false>(w0, w1, s0, s1, xv, lane, unit, v0, v1, mode, a0, a1);
    }
    a0 = warp_sum(a0);
    if constexpr (kPair) a1 = warp_sum(a1);
  }
}

// The FP8 scaling mode of a launch (ModelArgs::fp8_scaling): read at the start in an FP8 kernel, the constant
// kFp8None elsewhere (no field: consumer_state.cuh's Consumers takes it as a base, empty there).
// fp8_gemv: ModelArgs::fp8_gemv in an FP8 kernel, kFp8GemvCudaCores elsewhere.
template <bool kFp8>
struct Fp8Mode {
  int fp8_mode;
  int fp8_gemv;
  __device__ __forceinline__ Fp8Mode(int64_t v, int64_t gemv)
      : fp8_mode(static_cast<int>(v)), fp8_gemv(static_cast<int>(gemv)) {}
};
template <>
struct Fp8Mode<false> {
  static constexpr int fp8_mode = kFp8None;
  static constexpr int fp8_gemv = kFp8GemvCudaCores;
  __device__ __forceinline__ Fp8Mode(int64_t, int64_t) {}
};

}  // namespace kog
