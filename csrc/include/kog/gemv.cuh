// Matrix-vector products over weight chunks streamed into shared memory.
//
// A stage's output is split into units (one row; for gate/up one gate row and its up row), a chunk is nu units
// (nu a power of two <= kConsumerWarps) of full rows, copied whole by the loader. Each unit is owned by
// wpu = kConsumerWarps / nu warps, each taking a contiguous part of the row (16 B per lane per step, see
// gemv_partial); partial sums of one unit meet in shared memory in a fixed order, so the result
// does not depend on timing.
#pragma once

#include "kog/args.cuh"
#include "kog/config.cuh"
#include "kog/numerics.cuh"
#include "kog/sync.cuh"

namespace kog {

struct Chunk {
  const bf16* src0;  // first nvalid rows (gate rows for gate/up)
  const bf16* src1;  // up rows for gate/up, else null
  uint32_t bytes0;
  uint32_t bytes1;
  int r0;      // first unit
  int nvalid;  // units in this chunk (< nu only for the last chunk)
};

// A stage's geometry (ModelArgs::stage_*: input length, output units, units per chunk, chunks), kept in shared
// memory for the launch (SmemHeader::geo): the loader reads it per chunk, after waits whose "memory" clobbers
// would otherwise make it re-read the global table every time.
struct StageGeom {
  int k, n, nu, chunks;
};

// Which weight rows chunk `c` of a stage with weight w covers. For gate/up (pair), units are rows j of gate and j of
// up (row I + j).
__device__ __forceinline__ Chunk chunk_of(const StageGeom& g, const bf16* w, bool pair, int c) {
  const int K = g.k, N = g.n, nu = g.nu;
  Chunk ch;
  ch.r0 = c * nu;
  ch.nvalid = min(nu, N - ch.r0);
  ch.src0 = w + static_cast<size_t>(ch.r0) * K;
  ch.bytes0 = static_cast<uint32_t>(ch.nvalid) * K * 2u;
  if (pair) {
    ch.src1 = w + static_cast<size_t>(N + ch.r0) * K;
    ch.bytes1 = ch.bytes0;
  } else {
    ch.src1 = nullptr;
    ch.bytes1 = 0;
  }
  return ch;
}

// Output row of the k-th unit a block owns in a stage whose chunks it takes at c0, c0 + G, ... (nu units each):
// the residual gathers of the O / down epilogues (consume_stage.cuh gather_rows, tp.cuh) index their rows by it.
__device__ __forceinline__ int owned_row(int c0, int k, int nu) {
  return (c0 + (k / nu) * static_cast<int>(gridDim.x)) * nu + k % nu;
}

// Shared-memory offset (bytes) of the up rows of a gate/up chunk inside its slot.
__device__ __forceinline__ uint32_t pair_offset_bytes(int K, int nu) { return static_cast<uint32_t>(nu) * K * 2u; }

// A warp's share of a chunk: unit warp >> wpu_log2, part warp & (wpu - 1), and the part's vectors [v0, v1) of a row
// of nvec vectors, [p nvec / wpu, (p + 1) nvec / wpu) for part p (gemv_partial, gemv_partial_fp8).
struct WarpShare {
  int lane, unit, v0, v1;
};
__device__ __forceinline__ WarpShare warp_share(int nvec, int wpu_log2) {
  const int warp = threadIdx.x >> 5;
  const int part = warp & ((1 << wpu_log2) - 1);
  return WarpShare{static_cast<int>(threadIdx.x & 31), warp >> wpu_log2, (part * nvec) >> wpu_log2,
                   ((part + 1) * nvec) >> wpu_log2};
}

// One warp's share of one chunk's dot products with x_s: the fp32 sums of unit `warp >> wpu_log2` over its
// part `warp & (wpu - 1)`, on every lane; 0 for warps whose unit is past nvalid. A row is K / 8 16-byte vectors
// (K a multiple of 8, plan.py); part p takes vectors [p V / wpu, (p + 1) V / wpu), V = K / 8, lane i every 32nd of
// them from the part's first + i. Where K / wpu is a multiple of kWarpStride every lane runs the same number of
// steps (the 1B/8B/Qwen3-1.7B shapes: the sums are the ones of the former equal-segment split, bit for bit);
// otherwise the part's last step has idle lanes (hidden 2560, 3584, 896 ...). w_s: the chunk in its ring slot; a1:
// the up row of a gate/up unit. The caller sums the parts of a unit in part order (consume_stage's batched
// epilogue), so a result does not depend on timing.
template <bool kPair>
__device__ __forceinline__ void gemv_partial(const bf16* w_s, const bf16* x_s, int K, int nu, int wpu_log2,
                                             int nvalid, float& a0, float& a1) {
  const auto [lane, unit, v0, v1] = warp_share(K >> 3, wpu_log2);
  a0 = 0.f;
  a1 = 0.f;
  if (unit < nvalid) {
    const uint4* w0 = reinterpret_cast<const uint4*>(w_s + static_cast<size_t>(unit) * K);
    const uint4* w1 = reinterpret_cast<const uint4*>(w_s + static_cast<size_t>(nu + unit) * K);
    const uint4* xv = reinterpret_cast<const uint4*>(x_s);
    const int vend = diag::kNoMath ? v0 : v1;  // (diagnostics.cuh)
#pragma unroll 4
    for (int v = v0 + lane; v < vend; v += 32) {
      const uint4 x = xv[v];
      a0 = dot8(w0[v], x, a0);
      if constexpr (kPair) a1 = dot8(w1[v], x, a1);
    }
    a0 = warp_sum(a0);
    if constexpr (kPair) a1 = warp_sum(a1);
  }
}

// The per-warp partial sums of up to kEpilogueBatch consecutive chunks of a block (consume_stage): [chunk of the
// batch][0: row / gate row, 1: up row][warp], warp = unit * wpu + part.
struct EpiBatch {
  float v[MonoConfig::kEpilogueBatch][2][MonoConfig::kConsumerWarps];
};

}  // namespace kog
