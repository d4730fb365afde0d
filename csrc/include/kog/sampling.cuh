// vLLM 0.26's V2 sampling on the GPU, bit for bit (torch reference of the same steps: kog_backend/reference/sampling.py).
//
// What is reproduced, per row of bf16 logits x[V] sampled at `position` with the request's int64 `seed`:
//   temperature  x = bf16_rn(div.full.f32(float(x), t)) unless t == 0 or t == 1 (vLLM _temperature_kernel writes
//                the quotient back into its bf16 logits; Triton lowers fp32 `/` to div.full.f32);
//   min_p        x < fp32(max x) + logf(min_p) -> -inf (min_p.py), skipped when min_p == 0;
//   top-k/top-p  a cut in the ascending (value, column) order of the row: keep (key, col) >= (cut_key, cut_col)
//                (see Cut below; top-k's cut comes from block_kth_largest_key);
//   Gumbel-max   u = rng::uniform_f32(rng::row_key(seed, position), col) (kog/philox.cuh);
//                score = float(x) + (0 - logf(0 - log1pf(0 - u)))  (Triton's unary minus is 0 - x);
//                the token is the lowest column holding the largest score, which is what vLLM's per-1024-column
//                tl.max (first index on ties) followed by torch.argmax over block maxima (first block) returns.
//                Any partition of the columns combined with ScoreKey order gives the same winner.
// logf/log1pf are libdevice's polynomials, as in Triton's PTX; Triton compiles them with FTZ on, which changes
// nothing here: u is in [2^-31, 1), no operand or intermediate is subnormal. Build without --use_fast_math
// (setup.py) and keep the explicit __f*_rn forms: nvcc must not contract a multiply and an add into an FMA.
// NaN logits are outside the contract (vLLM's in-block NaN handling depends on Triton's reduction tree).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kog/philox.cuh"
#include "kog/warp.cuh"

namespace kog {
namespace sampling {

struct SamplingConfig {
  // vLLM gumbel_sample's column block; only its tie rule matters here (lowest column wins).
  static constexpr int kVllmBlock = 1024;
  // Histogram bins per radix-select pass over 16-bit bf16 order keys (two passes: high byte, low byte).
  static constexpr int kRadixBins = 256;
};

static_assert(SamplingConfig::kRadixBins * SamplingConfig::kRadixBins == 1 << 16, "two passes cover 16 bits");

// ------------------------------------------------------------------------------------------------ noise
__device__ __forceinline__ float gumbel_noise_f32(float u) {
  return __fsub_rn(0.f, logf(__fsub_rn(0.f, log1pf(__fsub_rn(0.f, u)))));
}
__device__ __forceinline__ double gumbel_noise_f64(double u) {
  return __dsub_rn(0.0, log(__dsub_rn(0.0, log(u))));
}

// ------------------------------------------------------------------------------------------------ logits
// Triton's fp32 `/` (PTX div.full.f32: x * MUFU.RCP(t) for normal operands, within 2 ulp of IEEE division).
__device__ __forceinline__ float div_full(float x, float t) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(x), "f"(t));
  return q;
}

// Monotone 16-bit key of a bf16 value: larger value, larger key; -0 and +0 share one key (both sort equal).
__device__ __forceinline__ uint32_t bf16_order_key(__nv_bfloat16 v) {
  uint32_t u = __bfloat16_as_ushort(v);
  if (u == 0x8000u) u = 0u;
  return (u & 0x8000u) ? (~u & 0xFFFFu) : (u | 0x8000u);
}

// Keep (key, col) >= (key_min, col_min) in the ascending (value, column) order of vLLM's stable sort.
// top-k alone: (k-th largest key, 0). top-p: the first kept position of the sorted row.
struct Cut {
  uint32_t key_min;
  uint32_t col_min;
};
__device__ __forceinline__ bool keeps(const Cut& cut, uint32_t key, uint32_t col) {
  return key > cut.key_min || (key == cut.key_min && col >= cut.col_min);
}

// Everything a block needs to process one row. temperature/min_p_threshold as vLLM holds them (fp32);
// min_p_threshold = -inf when min_p == 0.
struct RowParams {
  float temperature;
  float min_p_threshold;
  Cut cut;
  uint32_t has_cut;
  uint32_t key;  // rng::row_key(seed, position)
};

__device__ __forceinline__ bool is_greedy(const RowParams& p) { return p.temperature == 0.f; }

// The logit after temperature (bf16, as vLLM stores it).
__device__ __forceinline__ __nv_bfloat16 tempered(__nv_bfloat16 raw, float t) {
  if (t == 0.f || t == 1.f) return raw;
  return __float2bfloat16_rn(div_full(__bfloat162float(raw), t));
}

// The logit after temperature and min_p (bf16): what top-k/top-p sort.
__device__ __forceinline__ __nv_bfloat16 before_cut(__nv_bfloat16 raw, const RowParams& p) {
  const __nv_bfloat16 x = tempered(raw, p.temperature);
  return __bfloat162float(x) < p.min_p_threshold ? __float2bfloat16_rn(-INFINITY) : x;
}

// The logit gumbel_sample reads, as fp32 (-inf where masked).
__device__ __forceinline__ float processed(__nv_bfloat16 raw, uint32_t col, const RowParams& p) {
  const __nv_bfloat16 x = before_cut(raw, p);
  if (p.has_cut && !keeps(p.cut, bf16_order_key(x), col)) return -INFINITY;
  return __bfloat162float(x);
}

// ------------------------------------------------------------------------------------------------ argmax keys
// 64-bit key: order-preserving fp32 bits above (~col): larger score first, then lower column. 0 is below every
// key of a non-NaN score, so it is the identity of max.
__device__ __forceinline__ uint64_t score_key(float v, uint32_t col) {
  if (v == 0.f) v = 0.f;
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint64_t>(~col);
}
__device__ __forceinline__ uint32_t key_col(uint64_t key) { return ~static_cast<uint32_t>(key); }

// The monokernel's key for column `col` of a sampled row with no top-k, top-p or min-p (the LM-head epilogue, one
// logit at a time): bf16 logit -> temperature -> + Gumbel noise of (row_key, col), in score_key's order, which is
// also lm_head.cuh's argmax_key order, so the grid-wide max of these keys is vLLM's sampled token. Temperature 0
// (a greedy request with penalties, which runs this instantiation): vLLM's gumbel_sample adds no noise.
__device__ __forceinline__ uint64_t sampled_key(float logit, uint32_t col, float temperature, uint32_t row_key) {
  if (temperature == 0.f) return score_key(logit, col);
  const __nv_bfloat16 x = tempered(__float2bfloat16_rn(logit), temperature);
  return score_key(__fadd_rn(__bfloat162float(x), gumbel_noise_f32(rng::uniform_f32(row_key, col))), col);
}

// fp64 scores (use_fp64_gumbel) need all 64 bits for the value: (order-preserving bits, column) pairs.
struct ScoreKey64 {
  uint64_t v;
  uint32_t col;
};
__device__ __forceinline__ ScoreKey64 score_key64(double s, uint32_t col) {
  if (s == 0.0) s = 0.0;
  uint64_t u = static_cast<uint64_t>(__double_as_longlong(s));
  u = (u >> 63) ? ~u : (u | (1ull << 63));
  return {u, col};
}
__device__ __forceinline__ ScoreKey64 better(const ScoreKey64& a, const ScoreKey64& b) {
  return (a.v > b.v || (a.v == b.v && a.col < b.col)) ? a : b;
}
__device__ __forceinline__ ScoreKey64 no_score64() { return {0ull, 0xFFFFFFFFu}; }  // below every score

__device__ __forceinline__ ScoreKey64 warp_best(ScoreKey64 v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const ScoreKey64 o = {__shfl_xor_sync(0xFFFFFFFFu, v.v, off), __shfl_xor_sync(0xFFFFFFFFu, v.col, off)};
    v = better(v, o);
  }
  return v;
}

// Block-wide combination of one value per warp (v: this thread's warp already reduced), returned to every thread:
// ident combined with the warps' values in warp order. smem: kThreads / 32 entries; reusable after return.
template <int kThreads, class T, class Op>
__device__ __forceinline__ T block_combine(T v, T* smem, T ident, Op op) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block");
  constexpr int kWarps = kThreads / 32;
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = ident;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) r = op(r, smem[w]);
  __syncthreads();
  return r;
}

// Block-wide max of keys, returned to every thread. smem: kThreads / 32 entries; reusable after return.
template <int kThreads>
__device__ __forceinline__ uint64_t block_max(uint64_t v, uint64_t* smem) {
  return block_combine<kThreads>(warp_max_u64(v), smem, uint64_t{0},
                                 [](uint64_t a, uint64_t b) { return b > a ? b : a; });
}
template <int kThreads>
__device__ __forceinline__ ScoreKey64 block_best(ScoreKey64 v, ScoreKey64* smem) {
  return block_combine<kThreads>(warp_best(v), smem, no_score64(),
                                 [](const ScoreKey64& a, const ScoreKey64& b) { return better(a, b); });
}

// Block-wide max of fp32 values (exact in any order without NaN), returned to every thread. smem: kThreads / 32.
template <int kThreads>
__device__ __forceinline__ float block_max_f32(float v, float* smem) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  return block_combine<kThreads>(v, smem, -INFINITY, [](float a, float b) { return fmaxf(a, b); });
}

// min_p.py's threshold from the row maximum of the tempered logits; -inf disables (min_p == 0).
__device__ __forceinline__ float min_p_threshold(float row_max, float min_p) {
  return min_p == 0.f ? -INFINITY : __fadd_rn(row_max, logf(min_p));
}

// ------------------------------------------------------------------------------------------------ Gumbel argmax
// Best key of columns [begin, end) of `row` (bf16 logits as the LM head wrote them), scores as vLLM forms them.
// Block-cooperative: every thread of the block calls it; any split of the vocabulary into slices, combined with
// max over keys (atomicMax on the 64-bit key works), yields vLLM's token. Returned to every thread.
template <int kThreads>
__device__ __forceinline__ uint64_t slice_best_f32(const __nv_bfloat16* row, uint32_t begin, uint32_t end,
                                                   const RowParams& p, uint64_t* smem) {
  uint64_t best = 0;
  const bool greedy = is_greedy(p);
  for (uint32_t c = begin + threadIdx.x; c < end; c += kThreads) {
    float s = processed(row[c], c, p);
    if (!greedy) s = __fadd_rn(s, gumbel_noise_f32(rng::uniform_f32(p.key, c)));
    const uint64_t k = score_key(s, c);
    best = k > best ? k : best;
  }
  return block_max<kThreads>(best, smem);
}

template <int kThreads>
__device__ __forceinline__ ScoreKey64 slice_best_f64(const __nv_bfloat16* row, uint32_t begin, uint32_t end,
                                                     const RowParams& p, ScoreKey64* smem) {
  ScoreKey64 best = no_score64();
  const bool greedy = is_greedy(p);
  for (uint32_t c = begin + threadIdx.x; c < end; c += kThreads) {
    double s = static_cast<double>(processed(row[c], c, p));
    if (!greedy) s = __dadd_rn(s, gumbel_noise_f64(rng::uniform_f64(p.key, c)));
    best = better(best, score_key64(s, c));
  }
  return block_best<kThreads>(best, smem);
}

// ------------------------------------------------------------------------------------------------ top-k
// Radix select: the 16-bit order key of the k-th largest (1 <= k <= n, counted with multiplicity) of
// value(c), c in [0, n), by one block in two histogram passes (high byte, then low byte within the chosen high
// byte). top-k keeps every column whose key is >= the result, which is vLLM's `sorted < sorted[V - k] -> -inf`.
// ValueFn: __device__ __nv_bfloat16 operator()(uint32_t col) const. hist: kRadixBins words of shared memory;
// pick: 2 words. Returned to every thread.
template <int kThreads, typename ValueFn>
__device__ uint32_t block_kth_largest_key(uint32_t n, uint32_t k, const ValueFn& value, uint32_t* hist,
                                          uint32_t* pick) {
  constexpr int kBins = SamplingConfig::kRadixBins;
  uint32_t prefix = 0;  // high byte chosen by pass 0
  uint32_t rank = k;    // rank still to find inside the chosen bin, counted from the top
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (uint32_t c = threadIdx.x; c < n; c += kThreads) {
      const uint32_t key = bf16_order_key(value(c));
      if (pass == 0) {
        atomicAdd(&hist[key >> 8], 1u);
      } else if ((key >> 8) == prefix) {
        atomicAdd(&hist[key & 0xFFu], 1u);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t above = 0;
      int b = kBins - 1;
      while (b > 0 && above + hist[b] < rank) above += hist[b--];
      pick[0] = static_cast<uint32_t>(b);
      pick[1] = rank - above;
    }
    __syncthreads();
    if (pass == 0) prefix = pick[0];
    rank = pick[1];
    __syncthreads();
  }
  return (prefix << 8) | pick[0];
}

}  // namespace sampling
}  // namespace kog
