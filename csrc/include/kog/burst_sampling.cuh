// Top-k, top-p and min-p inside a K-token burst: vLLM 0.26's filtered Gumbel-max draw (sampling.cuh), decided
// across the grid without sorting the vocabulary. Torch reference of the same schedule: kog_backend/reference/sampling.py
// (burst_cut, burst_token).
//
// vLLM keeps a suffix of the row's ascending (value, column) order (min_p, then top-k, then top-p over the
// survivors' fp32 softmax) and draws argmax(x + Gumbel noise) over it. Every cut but top-p's falls between two
// bf16 values, and all columns holding one bf16 value (a "level": its 16-bit order key) have one probability, so
// a count of columns per level is all a cut needs. Per token, after the LM head:
//   1. every block, over its own LM-head rows: x = tempered logit (bf16, as vLLM stores it), level(x) and the
//      Gumbel score x + noise, kept in shared memory; it adds 1 per row to the grid's level histogram (kLevels
//      counters) and, per bin of 256 levels, the rows' count and fp64 mass exp(x) to the grid's bins;
//   2. the last block to arrive (the cutter) finds the top level, min_p's level, top-k's level (counting from the
//      top) and, with top-p, the levels where the exact ascending cumulative mass crosses vLLM's fp32 threshold
//      q = 1 - p, widened by a bound on vLLM's own fp32 rounding (TopPBound): `cand`, below which vLLM keeps no
//      row, and `sure`, from which up vLLM keeps every row;
//   3. every block's best score among its rows at levels >= cand, tagged with level >= sure; the grid's best
//      (the LM counter's last block, consumers.cuh) is vLLM's token when tagged. Otherwise its fate depends on
//      vLLM's fp32 rounding, or on which columns of a level vLLM's top-p splits: the launch ends before that token
//      ("deferred") and the host draws it with vLLM's own sampler from this token's logits (kog_backend/engine/runner.py).
// Only one block reads the grid's bins and histogram: it zeroes the bins itself, every block zeroes its share of
// the histogram once the cut is published, so both are zero again before the next token's first add.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kog/config.cuh"
#include "kog/numerics.cuh"
#include "kog/philox.cuh"
#include "kog/sampling.cuh"
#include "kog/sync.cuh"
#include "kog/warp.cuh"

namespace kog {
namespace burst {

struct BurstSamplingConfig {
  static constexpr int kLevels = 1 << 16;  // bf16 order keys (sampling::bf16_order_key)
  static constexpr int kBinShift = 8;
  static constexpr int kBins = kLevels >> kBinShift;  // one per consumer thread
  static constexpr uint32_t kNoLevel = kLevels;       // a cut above every level: no row is sure
  // A top-p cut inside one level ("split": vLLM keeps that level's highest columns) is resolved exactly from the
  // level's rows: each block publishes up to kSplitPerBlock of them, the grid at most kMaxSplit (else deferred).
  static constexpr int kSplitPerBlock = 4;
  static constexpr int kMaxSplit = 64;
  static constexpr int kMaxGrid = 256;  // blocks whose split rows the buffer holds (sm_90 parts have <= 132 SMs)
  // The grid's buffer (ModelArgs::sample_work), bytes: level counts u32 [kLevels], bin counts u32 [kBins], bin
  // masses f64 [kBins], the published cut u32 [8] (CutWords), split rows u64 [kMaxGrid][kSplitPerBlock] and
  // their counts u32 [kMaxGrid].
  static constexpr int kBinCountOffset = kLevels * 4;
  static constexpr int kBinMassOffset = kBinCountOffset + kBins * 4;
  static constexpr int kCutOffset = kBinMassOffset + kBins * 8;
  static constexpr int kSplitOffset = kCutOffset + 32;
  static constexpr int kSplitCountOffset = kSplitOffset + kMaxGrid * kSplitPerBlock * 8;
  static constexpr int kGridBytes = kSplitCountOffset + kMaxGrid * 4;
  // Shared memory past a block's rows (level u16, score f32 per row; BlockView): its bins, then the cutter's
  // scratch (per-bin suffix counts and masses, three bins of level counts, reduction words).
  static constexpr int kFixedSmemBytes = kBins * (4 + 8) + kBins * (4 + 8) + 3 * kBins * 4 + 64 * 8;
  // exp(x) in fp64 overflows past ~709.8: a top-p row above this level defers every token's draw to vLLM.
  static constexpr float kMaxExpArg = 700.f;
};
static_assert(BurstSamplingConfig::kBins == MonoConfig::kConsumerThreads, "the cutter gives each bin one thread");
static_assert(BurstSamplingConfig::kBinMassOffset % 8 == 0 && BurstSamplingConfig::kSplitOffset % 8 == 0,
              "fp64 bin masses and u64 split rows are 8-byte aligned");
static_assert(BurstSamplingConfig::kMaxSplit * 8 <= BurstSamplingConfig::kFixedSmemBytes,
              "the resolving block gathers the split rows into its work area");

// Bytes of the work area a block needs for `rows` LM-head rows (plan.py mirrors it: sample_smem_bytes).
__host__ __device__ constexpr int smem_bytes(int rows) {
  return ((rows * 2 + 15) / 16) * 16 + ((rows * 4 + 15) / 16) * 16 + BurstSamplingConfig::kFixedSmemBytes;
}

// The request's filters as vLLM's SamplingStates holds them: top_k 0 = off (vLLM: k == V), top_p 1 = off.
struct Filters {
  float temperature;
  float top_p;
  float min_p;
  int32_t top_k;
};

// Rows with level >= cand may be vLLM's token; rows with level >= sure are kept by vLLM for certain. split (or
// kNoLevel): the one level in [cand, sure), whose n rows vLLM keeps by column: in ascending column order, ranks
// 1..j_lo masked for certain, j_lo + 1..j_hi undecided (vLLM's rounding), the rest kept for certain.
struct Cut {
  uint32_t cand;
  uint32_t sure;
  uint32_t split;
  uint32_t j_lo;
  uint32_t j_hi;
  uint32_t n;
};
__device__ __forceinline__ Cut plain_cut(uint32_t cand, uint32_t sure) {
  return {cand, sure, BurstSamplingConfig::kNoLevel, 0u, 0u, 0u};
}

// The block's shared-memory view (in the monokernel's work area, free once the LM stage's GEMV is done).
struct BlockView {
  uint16_t* level;      // [rows]
  float* score;         // [rows]: fp32(x) + Gumbel noise; -inf for rows past the vocabulary
  uint32_t* bin_count;  // [kBins]
  double* bin_mass;     // [kBins]
  uint32_t* suf_count;  // [kBins + 1] cutter: rows at bins >= b
  double* suf_mass;     // [kBins + 1] cutter: mass at bins >= b
  uint32_t* fine[3];    // [kBins] cutter: level counts of one bin each
  uint64_t* red;        // [64] reduction words

  __device__ static BlockView carve(uint8_t* base, int rows) {
    using C = BurstSamplingConfig;
    BlockView v;
    size_t off = 0;
    v.level = reinterpret_cast<uint16_t*>(base + off);
    off += ((rows * 2 + 15) / 16) * 16;
    v.score = reinterpret_cast<float*>(base + off);
    off += ((rows * 4 + 15) / 16) * 16;
    v.bin_mass = reinterpret_cast<double*>(base + off);
    off += C::kBins * 8;
    v.suf_mass = reinterpret_cast<double*>(base + off);
    off += C::kBins * 8;
    v.bin_count = reinterpret_cast<uint32_t*>(base + off);
    off += C::kBins * 4;
    v.suf_count = reinterpret_cast<uint32_t*>(base + off);
    off += C::kBins * 4;
    for (int i = 0; i < 3; ++i) {
      v.fine[i] = reinterpret_cast<uint32_t*>(base + off);
      off += C::kBins * 4;
    }
    v.red = reinterpret_cast<uint64_t*>(base + off);
    return v;
  }
};

struct GridView {
  uint32_t* hist;          // [kLevels]
  uint32_t* bin_count;     // [kBins]
  double* bin_mass;        // [kBins]
  uint32_t* cut;           // [8]: Cut's six words
  uint64_t* split_rows;    // [kMaxGrid][kSplitPerBlock]: winner_key(score, col, false) of the split level's rows
  uint32_t* split_count;   // [kMaxGrid]: the block's rows at the split level (may exceed kSplitPerBlock)

  __device__ static GridView of(uint8_t* base) {
    using C = BurstSamplingConfig;
    return {reinterpret_cast<uint32_t*>(base), reinterpret_cast<uint32_t*>(base + C::kBinCountOffset),
            reinterpret_cast<double*>(base + C::kBinMassOffset), reinterpret_cast<uint32_t*>(base + C::kCutOffset),
            reinterpret_cast<uint64_t*>(base + C::kSplitOffset),
            reinterpret_cast<uint32_t*>(base + C::kSplitCountOffset)};
  }
  __device__ void publish(const Cut& c) const {
    cut[0] = c.cand;
    cut[1] = c.sure;
    cut[2] = c.split;
    cut[3] = c.j_lo;
    cut[4] = c.j_hi;
    cut[5] = c.n;
  }
  __device__ Cut published() const {
    return {ld_cg_u32(cut), ld_cg_u32(cut + 1), ld_cg_u32(cut + 2), ld_cg_u32(cut + 3), ld_cg_u32(cut + 4),
            ld_cg_u32(cut + 5)};
  }
};

// The bf16 value (as fp32) of a level: the inverse of sampling::bf16_order_key (level 0x8000 is +0).
__host__ __device__ __forceinline__ float level_value(uint32_t level) {
  const uint32_t u = (level & 0x8000u) ? (level & 0x7FFFu) : (~level & 0xFFFFu);
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u << 16);
#else
  return rng::bits_to_float(u << 16);
#endif
}

// ------------------------------------------------------------------------------------------------ block helpers
// (every consumer thread calls them; results returned to every thread; `red` reusable after return)
__device__ __forceinline__ uint32_t block_max_u32(uint32_t v, uint64_t* red) {
  v = __reduce_max_sync(0xFFFFFFFFu, v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  consumer_sync();
  uint32_t r = 0;
#pragma unroll
  for (int w = 0; w < MonoConfig::kConsumerWarps; ++w) r = max(r, static_cast<uint32_t>(red[w]));
  consumer_sync();
  return r;
}
__device__ __forceinline__ uint32_t block_min_u32(uint32_t v, uint64_t* red) {
  v = __reduce_min_sync(0xFFFFFFFFu, v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  consumer_sync();
  uint32_t r = 0xFFFFFFFFu;
#pragma unroll
  for (int w = 0; w < MonoConfig::kConsumerWarps; ++w) r = min(r, static_cast<uint32_t>(red[w]));
  consumer_sync();
  return r;
}
// Inclusive prefix sum over thread index (warp scans, then the warps' totals in order).
template <class T>
__device__ __forceinline__ T block_inclusive_scan(T v, uint64_t* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xFFFFFFFFu, v, o);
    if (lane >= o) v += n;
  }
  T* tot = reinterpret_cast<T*>(red);
  if (lane == 31) tot[warp] = v;
  consumer_sync();
  T add = 0;
  for (int w = 0; w < warp; ++w) add += tot[w];
  consumer_sync();
  return v + add;
}

// ------------------------------------------------------------------------------------------------ step 1
// The block's rows k < rows of this token's logits row (bf16, written by this block's LM stage; the consumer
// barrier before this call orders those stores before these loads): levels and scores into shared memory, counts
// into the grid's histogram, counts and masses per bin into the grid's bins. row_of(k): the vocabulary row.
template <class RowOf>
__device__ __forceinline__ void add_rows(const bf16* logits, int rows, int num_rows, const RowOf& row_of,
                                         uint32_t col0, const Filters& f, uint32_t row_key, const BlockView& s,
                                         const GridView& g) {
  const int tid = threadIdx.x;
  s.bin_count[tid] = 0u;
  s.bin_mass[tid] = 0.0;
  consumer_sync();
  for (int k = tid; k < rows; k += MonoConfig::kConsumerThreads) {
    const int r = row_of(k);
    if (r >= num_rows) {
      s.level[k] = 0;
      s.score[k] = -INFINITY;
      continue;
    }
    const __nv_bfloat16 x = sampling::tempered(__ushort_as_bfloat16(ld_cg_u16(logits + r)), f.temperature);
    const uint32_t lv = sampling::bf16_order_key(x);
    const float xf = __bfloat162float(x);
    s.level[k] = static_cast<uint16_t>(lv);
    const uint32_t col = col0 + static_cast<uint32_t>(r);
    s.score[k] = __fadd_rn(xf, sampling::gumbel_noise_f32(rng::uniform_f32(row_key, col)));
    red_relaxed_add(g.hist + lv, 1u);
    atomicAdd(&s.bin_count[lv >> BurstSamplingConfig::kBinShift], 1u);
    atomicAdd(&s.bin_mass[lv >> BurstSamplingConfig::kBinShift], exp(static_cast<double>(xf)));
  }
  consumer_sync();
  if (s.bin_count[tid] != 0u) {
    red_relaxed_add(g.bin_count + tid, s.bin_count[tid]);
    atomicAdd(g.bin_mass + tid, s.bin_mass[tid]);
  }
}

// ------------------------------------------------------------------------------------------------ step 2
// A bound rho on vLLM's relative error in the ascending cumulative probability c of any kept row:
// |c_vllm - c| <= rho c. softmax: each exp(x - M) within (|x - M| + 3) u (the fp32 subtraction's rounding, expf's
// 2 ulp), their fp32 sum within (n - 1) u of the exact sum for n nonzero terms in any order, the division u; the
// fp32 cumsum adds at most (n - 1) u over the prefix's terms (all positive; the masked zeros add exactly):
// rho = (2 n + 2 D + 8) u with D = M - x of the lowest survivor and u = 2^-24, here with 12 u to spare for this
// kernel's own fp32 exp argument and fp64 sums.
__device__ __forceinline__ double top_p_rho(uint32_t survivors, float span) {
  return (2.0 * survivors + 2.0 * ceil(static_cast<double>(span)) + 20.0) * 0x1p-24;
}

// Level counts of bin b into dst (one load per thread, from L2: other blocks added them).
__device__ __forceinline__ void load_bin(uint32_t* dst, const GridView& g, uint32_t b) {
  dst[threadIdx.x] = ld_cg_u32(g.hist + (b << BurstSamplingConfig::kBinShift) + threadIdx.x);
}

// The cutter (the last block to add its rows): reads the grid's bins and histogram, zeroes the bins, returns the
// cut (every thread). Called by every consumer thread of that block after the acquire of every block's adds.
__device__ Cut find_cut(const Filters& f, const BlockView& s, const GridView& g) {
  using C = BurstSamplingConfig;
  const uint32_t tid = threadIdx.x;
  const uint32_t cnt = ld_cg_u32(g.bin_count + tid);
  const double mass = ld_cg_f64(g.bin_mass + tid);
  g.bin_count[tid] = 0u;  // this block is their only reader; the next token's adds come after the cut's release
  g.bin_mass[tid] = 0.0;
  // Suffix sums over bins, from the top: thread i holds bin 255 - i.
  const uint32_t rb = C::kBins - 1 - tid;
  s.bin_count[tid] = cnt;
  s.bin_mass[tid] = mass;
  consumer_sync();
  const uint32_t sc = block_inclusive_scan<uint32_t>(s.bin_count[rb], s.red);
  const double sm = block_inclusive_scan<double>(s.bin_mass[rb], s.red);
  s.suf_count[rb] = sc;
  s.suf_mass[rb] = sm;
  if (tid == 0) {
    s.suf_count[C::kBins] = 0u;
    s.suf_mass[C::kBins] = 0.0;
  }
  consumer_sync();
  const uint32_t b_max = block_max_u32(cnt != 0u ? tid : 0u, s.red);
  const bool top_k = f.top_k > 0;
  // top-k's bin: the highest bin with at least k rows at or above it.
  const uint32_t b_k =
      top_k ? block_max_u32(s.suf_count[tid] >= static_cast<uint32_t>(f.top_k) ? tid : 0u, s.red) : 0u;
  load_bin(s.fine[0], g, b_max);
  if (top_k) load_bin(s.fine[1], g, b_k);
  consumer_sync();
  const uint32_t top = (b_max << C::kBinShift) + block_max_u32(s.fine[0][tid] != 0u ? tid : 0u, s.red);
  const float M = level_value(top);
  uint32_t lo = 0u;  // the lowest level any filter leaves
  if (f.min_p > 0.f) {
    // vLLM masks x < M + log(min_p): the lowest level left is the smallest bf16 >= the threshold.
    lo = sampling::bf16_order_key(__float2bfloat16_ru(sampling::min_p_threshold(M, f.min_p)));
  }
  if (top_k) {
    // rows at or above level (b_k, j): suf_count[b_k + 1] + the bin's counts from j up.
    const uint32_t up = s.fine[1][C::kBins - 1 - tid];
    const uint32_t at = block_inclusive_scan<uint32_t>(up, s.red) + s.suf_count[b_k + 1];
    const uint32_t j = block_max_u32(at >= static_cast<uint32_t>(f.top_k) ? C::kBins - 1 - tid : 0u, s.red);
    lo = max(lo, (b_k << C::kBinShift) + j);
  }
  if (!(f.top_p < 1.f)) return plain_cut(lo, lo);
  if (!(M <= C::kMaxExpArg)) return plain_cut(lo, C::kNoLevel);

  // top-p over the survivors (levels >= lo), in exact masses exp(x) relative to Z.
  const uint32_t b_lo = lo >> C::kBinShift;
  load_bin(s.fine[2], g, b_lo);
  consumer_sync();
  const uint32_t lv = (b_lo << C::kBinShift) + tid;
  const uint32_t n_lo = lv >= lo ? s.fine[2][tid] : 0u;
  const double m_lo = n_lo != 0u ? n_lo * exp(static_cast<double>(level_value(lv))) : 0.0;
  const double part = block_inclusive_scan<double>(m_lo, s.red);
  const uint32_t n_part = block_inclusive_scan<uint32_t>(n_lo, s.red);
  if (tid == C::kBins - 1) {
    s.red[16] = __double_as_longlong(part);
    s.red[17] = n_part;
  }
  consumer_sync();
  const double Z = __longlong_as_double(static_cast<long long>(s.red[16])) + s.suf_mass[b_lo + 1];
  const uint32_t n = static_cast<uint32_t>(s.red[17]) + s.suf_count[b_lo + 1];
  consumer_sync();
  // The lowest survivor's value bounds vLLM's exp arguments: exact within lo's bin, else the start of the lowest
  // non-empty bin above it (a lower value: a larger, safe bound).
  const uint32_t j_min = block_min_u32(n_lo != 0u ? tid : C::kBins, s.red);
  const uint32_t b_min = block_min_u32(tid > b_lo && s.bin_count[tid] != 0u ? tid : C::kBins - 1, s.red);
  const uint32_t lowest = j_min < C::kBins ? (b_lo << C::kBinShift) + j_min : b_min << C::kBinShift;
  const double rho = top_p_rho(n, M - level_value(lowest));
  if (!(Z > 0.0) || !(Z < INFINITY) || !(rho < 0.25)) return plain_cut(lo, C::kNoLevel);
  const double q = static_cast<double>(__fsub_rn(1.f, f.top_p));  // vLLM: 1 - p in fp32
  const double t_lo = q / (1.0 + rho) * Z;  // cumulative mass at or below this: vLLM masks the row
  const double t_hi = q / (1.0 - rho) * Z;  // above this: vLLM keeps it
  // Ascending cumulative mass at the top of bin b >= b_lo: Z - mass of the bins above it.
  const double end_b = tid >= b_lo ? Z - s.suf_mass[tid + 1] : -1.0;
  const uint32_t b_c = block_min_u32(end_b > t_lo ? tid : C::kBins - 1, s.red);
  const uint32_t b_h = block_min_u32(end_b > t_hi ? tid : C::kBins, s.red);
  load_bin(s.fine[0], g, b_c);
  if (b_h < C::kBins) load_bin(s.fine[1], g, b_h);
  consumer_sync();
  // Within a bin: each level's (rows, mass) from its counts; cumulative from the bin's start.
  auto level_scan = [&](const uint32_t* fine, uint32_t b, uint32_t& n_j, double& e_j, double& end_j) {
    const uint32_t l = (b << C::kBinShift) + tid;
    n_j = l >= lo ? fine[tid] : 0u;
    e_j = exp(static_cast<double>(level_value(l)));
    const double start = b == b_lo ? 0.0 : Z - s.suf_mass[b];
    end_j = start + block_inclusive_scan<double>(n_j != 0u ? n_j * e_j : 0.0, s.red);
  };
  uint32_t n_j;
  double e_j, end_j;
  level_scan(s.fine[0], b_c, n_j, e_j, end_j);
  // cand: the first level with a row above t_lo (every row below is masked by vLLM); if rounding hides it, the
  // bin's start (lower is safe: a candidate vLLM masks is never sure).
  const uint32_t j_c = block_min_u32(n_j != 0u && end_j > t_lo ? tid : C::kBins, s.red);
  const uint32_t cand = max(lo, (b_c << C::kBinShift) + (j_c < C::kBins ? j_c : 0u));
  double* const at_cand = reinterpret_cast<double*>(s.red + 20);  // cand's start mass, one row's mass, rows
  if (tid == j_c) {
    at_cand[0] = end_j - n_j * e_j;
    at_cand[1] = e_j;
    s.red[22] = n_j;
  }
  // The next non-empty level above cand within its bin (else: see below).
  const uint32_t j_next = block_min_u32(j_c < C::kBins && tid > j_c && s.fine[0][tid] != 0u ? tid : C::kBins, s.red);
  const uint32_t b_next = block_min_u32(tid > b_c && s.bin_count[tid] != 0u ? tid : C::kBins, s.red);
  uint32_t sure = C::kNoLevel, next = C::kNoLevel;
  if (b_h < C::kBins) {
    level_scan(s.fine[1], b_h, n_j, e_j, end_j);
    const uint32_t j_h = block_min_u32(n_j != 0u && end_j > t_hi ? tid : C::kBins, s.red);
    const uint32_t j_low = block_min_u32(s.fine[1][tid] != 0u ? tid : C::kBins, s.red);
    if (j_h < C::kBins) {
      // The level's lowest row: its cumulative mass is the level's start + one row's mass.
      if (tid == j_h) s.red[18] = end_j - n_j * e_j + e_j > t_hi ? 1u : 0u;
      consumer_sync();
      const bool whole = s.red[18] != 0u;
      consumer_sync();
      if (whole) {
        sure = (b_h << C::kBinShift) + j_h;
      } else {
        // The next non-empty level above it, in this bin or the next non-empty bin (higher is safe).
        const uint32_t j_n = block_min_u32(tid > j_h && s.fine[1][tid] != 0u ? tid : C::kBins, s.red);
        if (j_n < C::kBins) {
          sure = (b_h << C::kBinShift) + j_n;
        } else {
          const uint32_t b_n = block_min_u32(tid > b_h && s.bin_count[tid] != 0u ? tid : C::kBins, s.red);
          sure = b_n < C::kBins ? b_n << C::kBinShift : C::kNoLevel;
        }
      }
    } else {
      sure = (b_h + 1u) << C::kBinShift;
    }
    if (j_next >= C::kBins && b_next == b_h && j_low < C::kBins) next = (b_h << C::kBinShift) + j_low;
  }
  if (j_next < C::kBins) {
    next = (b_c << C::kBinShift) + j_next;
  } else if (next == C::kNoLevel && b_next < C::kBins) {
    next = b_next << C::kBinShift;  // the bin's start: at or below the level (never equal to sure unless exact)
  }
  sure = max(sure, cand);
  Cut cut = plain_cut(cand, sure);
  const uint32_t n_c = static_cast<uint32_t>(s.red[22]);
  if (j_c < C::kBins && cand < sure && next == sure && n_c <= static_cast<uint32_t>(C::kMaxSplit)) {
    // One level holds every undecided row: its rows' cumulative masses are start + j e, j = 1..n.
    const double start = at_cand[0], e = at_cand[1];
    const auto rank_at_or_below = [&](double t) {
      const double j = floor((t - start) / e);
      return static_cast<uint32_t>(j < 0.0 ? 0.0 : (j > n_c ? static_cast<double>(n_c) : j));
    };
    cut.split = cand;
    cut.j_lo = rank_at_or_below(t_lo);
    cut.j_hi = max(cut.j_lo, rank_at_or_below(t_hi));
    cut.n = n_c;
  }
  consumer_sync();
  return cut;
}

// ------------------------------------------------------------------------------------------------ step 3
// The best (score, lowest column) of the block's candidate rows, as this thread saw them, with the sure tag in the
// lowest bit: (fp32 order bits << 32) | ((0x7FFFFFFF - col) << 1) | sure. 0: no candidate.
__device__ __forceinline__ uint64_t winner_key(float score, uint32_t col, bool sure) {
  const uint64_t k = sampling::score_key(score, col);
  return (k & 0xFFFFFFFF00000000ull) | (static_cast<uint64_t>(0x7FFFFFFFu - col) << 1) | (sure ? 1u : 0u);
}
__device__ __forceinline__ uint32_t winner_col(uint64_t key) {
  return 0x7FFFFFFFu - static_cast<uint32_t>((key & 0xFFFFFFFFull) >> 1);
}
__device__ __forceinline__ bool winner_sure(uint64_t key) { return (key & 1ull) != 0ull; }

// The block's rows at levels >= cut.cand: this thread's best key (split-level rows excluded), and the split
// level's rows into the grid's split_rows (every filtered token writes this block's count, 0 included).
template <class RowOf>
__device__ __forceinline__ uint64_t thread_best(const BlockView& s, int rows, const RowOf& row_of, uint32_t col0,
                                                const Cut& cut, const GridView& g) {
  using C = BurstSamplingConfig;
  uint32_t* const n_split = reinterpret_cast<uint32_t*>(s.red + 32);
  if (threadIdx.x == 0) *n_split = 0u;
  consumer_sync();
  uint64_t best = 0;
  for (int k = threadIdx.x; k < rows; k += MonoConfig::kConsumerThreads) {
    const uint32_t lv = s.level[k];
    const float sc = s.score[k];
    if (lv < cut.cand || sc == -INFINITY) continue;
    const uint32_t col = col0 + static_cast<uint32_t>(row_of(k));
    if (lv == cut.split) {
      const uint32_t i = atomicAdd(n_split, 1u);
      if (i < static_cast<uint32_t>(C::kSplitPerBlock)) {
        g.split_rows[blockIdx.x * C::kSplitPerBlock + i] = winner_key(sc, col, false);
      }
      continue;
    }
    const uint64_t key = winner_key(sc, col, lv >= cut.sure);
    best = key > best ? key : best;
  }
  consumer_sync();
  if (threadIdx.x == 0) g.split_count[blockIdx.x] = *n_split;
  return best;
}

// One full warp of the block that saw every block's best (after the acquire of all of them): the winner key, sure
// or not, once the split level's rows are ranked by column. list: kMaxSplit words of this block's shared memory.
__device__ __forceinline__ uint64_t resolve_split(uint64_t best, const Cut& cut, const GridView& g, uint64_t* list) {
  using C = BurstSamplingConfig;
  if (cut.split >= C::kNoLevel) return best;
  const uint32_t lane = threadIdx.x & 31;
  const int G = gridDim.x;
  uint32_t total = 0;
  bool over = false;
  for (int b0 = 0; b0 < G; b0 += 32) {
    const int b = b0 + static_cast<int>(lane);
    const uint32_t c = b < G ? ld_cg_u32(g.split_count + b) : 0u;
    over |= c > static_cast<uint32_t>(C::kSplitPerBlock);
    const uint32_t cc = min(c, static_cast<uint32_t>(C::kSplitPerBlock));
    uint32_t incl = cc;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
      if (static_cast<int>(lane) >= o) incl += v;
    }
    const uint32_t at = total + incl - cc;
    for (uint32_t i = 0; i < cc; ++i) {
      if (at + i < static_cast<uint32_t>(C::kMaxSplit)) list[at + i] = ld_cg_u64(g.split_rows + b * C::kSplitPerBlock + i);
    }
    total += __shfl_sync(0xFFFFFFFFu, incl, 31);
  }
  over = __any_sync(0xFFFFFFFFu, over) || total != cut.n || total > static_cast<uint32_t>(C::kMaxSplit);
  __syncwarp();
  if (over) return best & ~1ull;  // the split level's rows are not all here: never sure
  uint64_t win = best;
  for (uint32_t e = lane; e < total; e += 32) {
    const uint64_t key = list[e];
    const uint32_t col = winner_col(key);
    uint32_t rank = 1;  // ascending column order within the level, as vLLM's stable sort places them
    for (uint32_t f = 0; f < total; ++f) rank += winner_col(list[f]) < col ? 1u : 0u;
    if (rank <= cut.j_lo) continue;  // masked by vLLM
    const uint64_t tagged = (key & ~1ull) | (rank > cut.j_hi ? 1ull : 0ull);
    win = tagged > win ? tagged : win;
  }
  return warp_max_u64(win);
}

// This block's share of the level histogram back to zero (after the cut's release: the cutter read it before).
__device__ __forceinline__ void zero_hist_share(const GridView& g) {
  const int G = gridDim.x, b = blockIdx.x;
  const int begin = static_cast<int>(static_cast<int64_t>(BurstSamplingConfig::kLevels) * b / G);
  const int end = static_cast<int>(static_cast<int64_t>(BurstSamplingConfig::kLevels) * (b + 1) / G);
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += MonoConfig::kConsumerThreads) g.hist[i] = 0u;
}

}  // namespace burst
}  // namespace kog
