// Attention split on the tensor cores (ModelArgs::attn_mode kAttnModeMma, the default for splits longer than
// kAttnShortLen, and kAttnModeMmaWide): each warp takes tiles of 16 positions and computes, with bf16 mma.sync
// m16n8k16 and fp32 accumulators,
//   S^T [16 pos x 8 heads] = K_tile [16 x D] . Q^T [D x 8]        (D / 16 mma)
//   O^T [D x 8 heads]     += V_tile^T [D x 16] . P^T [16 x 8]     (D / 16 mma)
// with the online softmax (log2 units, as attention.cuh) per head column in between. Heads are the n = 8 columns:
// the pass's hq <= 8 query heads, the other columns hold zeros and are never written out. P is rounded to bf16 for
// the second product (as FlashAttention does); l sums the fp32 P.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16; lane = 4 g + t): A rows g, g + 8 and columns 2t, 2t + 1, 2t + 8,
// 2t + 9; B columns g and rows 2t, 2t + 1, 2t + 8, 2t + 9; C rows g, g + 8 and columns 2t, 2t + 1. The order of
// the head dimension inside an mma is free (a dot product over d does not depend on it), so each product's
// logical columns are mapped to physical dimensions that make every lane's loads contiguous 16-byte vectors:
//   S^T: k-step s, logical column c of lane t  -> dimension (D / 4) t + 4 s + {0, 1, 2, 3} for c = 2t, 2t + 1,
//        2t + 8, 2t + 9: lane (g, t) loads dimensions [(D / 4) t, (D / 4)(t + 1)) of positions g and g + 8, and
//        its A registers are those words as loaded; Q^T's B registers follow the same map.
//   O^T: m-tile m, logical rows g and g + 8 -> dimensions (D / 8) g + 2 m and (D / 8) g + 2 m + 1: lane (g, t)
//        loads dimensions [(D / 8) g, (D / 8)(g + 1)) of positions 2t, 2t + 1, 2t + 8, 2t + 9, and a byte permute
//        pairs two positions' values of one dimension into each A register.
// P^T comes out of the first mma as C (rows = positions); movmatrix.trans turns each 8 x 8 half into the B
// fragment of the second (rows = positions as k, columns = heads).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/attn_split.cuh"
#include "kog/config.cuh"
#include "kog/numerics.cuh"
#include "kog/sync.cuh"

namespace kog {

// Query heads one tensor-core pass can take: the mma's n = 8 columns.
constexpr int kMmaColumns = 8;

// 2^(x - m), 0 for x = -inf: exp2_or_zero (numerics.cuh) on the MUFU directly (ex2.approx.ftz). exp2f wraps the same
// MUFU in a range fix for results below 2^-126 (a compare, two multiplies and predicate moves per call, seen in the
// SASS), which this pass does not need: such a P is flushed to 0 instead of a denormal, below anything it adds to.
__device__ __forceinline__ float exp2_ftz_or_zero(float x, float m) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x - m));
  return x == -INFINITY ? 0.f : y;
}

// D += A . B, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The transpose of an 8 x 8 b16 matrix held one row per 4 lanes (lane 4 g + t: row g, columns 2t, 2t + 1).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// bf16(lo) in the low half, bf16(hi) in the high half (round to nearest even).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t y;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(y) : "f"(hi), "f"(lo));
  return y;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// A tile's loads: K rows g and g + 8 ([D / 4] dimensions each, KV4 vectors), V rows 2t, 2t + 1, 2t + 8, 2t + 9
// ([D / 8] dimensions, VV4 vectors). A row past the split's end is read as the tile's first row instead (kok false:
// its scores become -inf and its P zero, so its finite V adds +0); a tile wholly past the end or without a block is
// zeros.
template <int D>
struct MmaTile {
  static constexpr int KV4 = D / 32;
  static constexpr int VV4 = D / 64;
  uint4 k[2][KV4];
  uint4 v[4][VV4];
  bool kok[2];
};

template <int D>
__device__ __forceinline__ void load_mma_tile(const KvSource& src, int end, int tile, int g, int t, MmaTile<D>& r) {
  static_assert(MonoConfig::kAttnTileLen == 16, "a tile is the mma's 16 rows");
  // The tile starts on a multiple of 16 inside one KV block (plan_attention_split): one block-table entry for all
  // its rows, row j at row(tile) + j s_pos. The same for every lane, so the branch below is warp-uniform and the
  // loads under it carry no predicate: ptxas then issues V's with K's, before the first product (with a predicate
  // per row it deferred V's past the softmax, a second memory latency per round, seen in the SASS).
  const int64_t base = tile < end ? src.row(tile) : -1;
  if (base < 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      r.kok[h] = false;
#pragma unroll
      for (int jj = 0; jj < MmaTile<D>::KV4; ++jj) r.k[h][jj] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int jj = 0; jj < MmaTile<D>::VV4; ++jj) r.v[i][jj] = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const int rows = end - tile;  // rows of the tile inside the split (>= 1)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = g + 8 * h;
    r.kok[h] = j < rows;
    const bf16* row = src.k + base + (j < rows ? j : 0) * src.s_pos + (D / 4) * t;
#pragma unroll
    for (int jj = 0; jj < MmaTile<D>::KV4; ++jj) r.k[h][jj] = ld_cg_v4(row + 8 * jj);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int j = 2 * t + (i & 1) + 8 * (i >> 1);
    const bf16* row = src.v + base + (j < rows ? j : 0) * src.s_pos + (D / 8) * g;
#pragma unroll
    for (int jj = 0; jj < MmaTile<D>::VV4; ++jj) r.v[i][jj] = ld_cg_v4(row + 8 * jj);
  }
}

// Tiles a warp loads in one round before their first use (registers: 32 / 64 per tile for head dim 64 / 128): a
// round is 8 KiB of K and V per warp for both head dims.
template <int D>
constexpr int kMmaRoundTiles = D == 64 ? 2 : 1;

// Positions between one round of a warp and its next: the W warps' rounds are contiguous, warp w's at
// start + w 16 kMmaRoundTiles.
template <int D>
constexpr int kMmaRoundStride = MonoConfig::kConsumerWarps * MonoConfig::kAttnTileLen * kMmaRoundTiles<D>;

// What one tile's L2 prefetch covers (attention_mma's prefetch_mma_round): its 16 positions of K and V, as one
// contiguous span of `bytes` starting `delta` elements from the tile's first K row of this KV head.
//   vLLM's NHD memory ([block][position][KV head][K | V], s_pos = nkv s_head, V inside the head's row): the 16
//     positions of every KV head are one span of 16 s_pos elements; the nkv blocks that take the same split of
//     their KV heads read all of it at about the same time, so KV head h's block sends slice h of it (16 s_head
//     elements): between them the nkv blocks prefetch each byte once.
//   HND memory ([block][KV head][position][K | V], V inside the position's row): the head's 16 rows are one span
//     of 16 s_pos elements.
// Either way kKvPrefetchBytes<D> = 64 D bytes (K and V of 16 positions, rows of 2 D elements as vLLM lays them out);
// delta -1 (no prefetch) for any other layout or alignment. (One value, so that the round loop, at the kernel's
// register cap, keeps as little as possible live for it.)
struct KvPrefetch {
  int64_t delta;
};
template <int D>
constexpr uint32_t kKvPrefetchBytes = 64u * D;

// hot: the block's HotArgs in shared memory, whose KV-head count and head stride are read here, at the use
// (volatile: not kept in registers from an earlier read across the q pass, where the kernel is at its register cap
// and ptxas spilled in the norms and the KV append for them).
template <int D>
__device__ __forceinline__ KvPrefetch kv_prefetch_span(const KvSource& src, const HotArgs& hot, int kvh) {
  const int nkv = *reinterpret_cast<const volatile int*>(&hot.num_kv_heads);
  const int64_t s_head = *reinterpret_cast<const volatile int64_t*>(&hot.kv_stride_head);
  const int64_t gap = src.v - src.k;  // V's offset from K in a row, in elements (vLLM's: D)
  const bool aligned = (src.s_blk | src.s_pos | s_head) % 8 == 0;  // 16-byte spans
  if (aligned && gap == D && s_head == 2 * D && src.s_pos == nkv * s_head) {
    return {kvh * (MonoConfig::kAttnTileLen * s_head) - src.head_off};
  }
  if (aligned && gap == D && src.s_pos == 2 * D && s_head >= MonoConfig::kAttnTileLen * src.s_pos) {
    return {0};
  }
  return {-1};
}

// Sends this warp's round at `base` towards L2 (cp.async.bulk.prefetch.L2 from lane 0, a hint: nothing waits for
// it and no register holds its data), so that the round's loads hit L2 when it comes. A bulk operation takes its
// address from uniform registers, so one lane issues it (from 32 lanes ptxas loops over them, one per trip).
// Tiles wholly past the split's end or without a block are skipped. A prefetched row may still be written before
// it is read (this token's row, appended by the owning split): the write lands in the same L2 line, the single
// cached copy that the ld.global.cg loads read.
template <int D>
__device__ __forceinline__ void prefetch_mma_round(const KvSource& src, const KvPrefetch& pf, int end, int base) {
  if ((threadIdx.x & 31) != 0) return;
#pragma unroll
  for (int u = 0; u < kMmaRoundTiles<D>; ++u) {
    const int tile = base + MonoConfig::kAttnTileLen * u;
    if (tile >= end) break;
    const int64_t row0 = src.row(tile);
    if (row0 >= 0) bulk_prefetch_l2(src.k + row0 + pf.delta, kKvPrefetchBytes<D>);
  }
}

// The first task.prefetch rounds of this warp's tensor-core pass, sent towards L2 before the pass can start (while
// the block waits for this token's q): attend_positions_mma then keeps task.prefetch rounds ahead.
template <int D>
__device__ __forceinline__ void prefetch_mma_pass_start(const KvSource& src, const KvPrefetch& pf,
                                                        const AttnTask& task) {
  if (pf.delta < 0) return;
  const int warp = threadIdx.x >> 5;
  const int first = task.start + warp * MonoConfig::kAttnTileLen * kMmaRoundTiles<D>;
  for (int r = 0; r < task.prefetch; ++r) {
    const int base = first + r * kMmaRoundStride<D>;
    if (base >= task.end) break;
    prefetch_mma_round<D>(src, pf, task.end, base);
  }
}

// A warp's state after its pass, for head columns 2t and 2t + 1 of lane (g, t): O^T's C registers per m-tile
// ([dim (D / 8) g + 2m][2t, 2t + 1], [dim + 1][2t, 2t + 1]), the running max and the warp's sum of P.
template <int D>
struct MmaState {
  float o[D / 16][4];
  float mrow[2], lrow[2];
};

// One pass over the split for hq <= kMmaColumns query heads whose rotated q (fp32) are rows of qs [hq][D].
// Tiles of a round are warp-contiguous: warp w takes [start + (r W + w) 16 kTiles, + 16 kTiles). Each round, after
// its loads, sends the warp's round task.prefetch rounds later towards L2 (prefetch_mma_pass_start sent the first
// ones).
template <int D>
__device__ __forceinline__ MmaState<D> attend_positions_mma(const KvSource& src, const KvPrefetch& pf,
                                                            const AttnTask& task, int hq, float scale,
                                                            const float* qs) {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  constexpr int KS = D / 16;  // k-steps of S^T, m-tiles of O^T
  constexpr int kTiles = kMmaRoundTiles<D>;
  constexpr int kStride = kMmaRoundStride<D>;
  // Positions between a round and the round it sends towards L2 (0: no prefetch).
  const int ahead = pf.delta >= 0 ? task.prefetch * kStride : 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  // Q^T's B registers: column g = head g (zeros past hq), rows of k-step s = dimensions (D / 4) t + 4 s + 0..3.
  uint32_t qb[KS][2];
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    const float* qr = qs + g * D + (D / 4) * t + 4 * s;
    qb[s][0] = g < hq ? pack_bf16x2(qr[0], qr[1]) : 0u;
    qb[s][1] = g < hq ? pack_bf16x2(qr[2], qr[3]) : 0u;
  }
  // State of head columns 2t and 2t + 1 (the same in the 8 lanes of equal t once a tile's maxima are reduced).
  MmaState<D> st;
#pragma unroll
  for (int m = 0; m < KS; ++m) st.o[m][0] = st.o[m][1] = st.o[m][2] = st.o[m][3] = 0.f;
  st.mrow[0] = st.mrow[1] = -INFINITY;
  st.lrow[0] = st.lrow[1] = 0.f;

  for (int base = task.start + warp * 16 * kTiles; base < task.end; base += kStride) {
    MmaTile<D> tl[kTiles];
#pragma unroll
    for (int u = 0; u < kTiles; ++u) load_mma_tile<D>(src, task.end, base + 16 * u, g, t, tl[u]);
    // (After this round's loads: issued first, lane 0's block-table lookup and bulk issue delayed them.)
    if (ahead > 0) prefetch_mma_round<D>(src, pf, task.end, base + ahead);
#pragma unroll
    for (int u = 0; u < kTiles; ++u) {
      const MmaTile<D>& r = tl[u];
      float sc[4] = {0.f, 0.f, 0.f, 0.f};  // S^T: [pos g][head 2t, 2t + 1], [pos g + 8][head 2t, 2t + 1]
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const uint32_t a[4] = {word_of(r.k[0][s / 2], 2 * (s % 2)), word_of(r.k[1][s / 2], 2 * (s % 2)),
                               word_of(r.k[0][s / 2], 2 * (s % 2) + 1), word_of(r.k[1][s / 2], 2 * (s % 2) + 1)};
        mma_16816(sc, a, qb[s][0], qb[s][1]);
      }
      float p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) sc[i] = r.kok[i >> 1] ? sc[i] * scale : -INFINITY;
      float corr[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float mx = fmaxf(sc[c], sc[2 + c]);
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float mn = fmaxf(st.mrow[c], mx);
        corr[c] = exp2_ftz_or_zero(st.mrow[c], mn);
        p[c] = exp2_ftz_or_zero(sc[c], mn);
        p[2 + c] = exp2_ftz_or_zero(sc[2 + c], mn);
        st.lrow[c] = st.lrow[c] * corr[c] + (p[c] + p[2 + c]);
        st.mrow[c] = mn;
      }
      // P^T halves (positions 0-7, 8-15) as bf16, transposed into B: [k = pos 2t, 2t + 1 (+ 8)][n = head g].
      const uint32_t pb0 = movmatrix_trans(pack_bf16x2(p[0], p[1]));
      const uint32_t pb1 = movmatrix_trans(pack_bf16x2(p[2], p[3]));
      // corr is exactly 1 (2^0) where a column's running max did not move, and multiplying by 1 is the identity: the
      // warp rescales O only when some lane's column moved (a warp-uniform vote; after a split's first tiles the max
      // rarely moves).
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int m = 0; m < KS; ++m) {
          st.o[m][0] *= corr[0];
          st.o[m][1] *= corr[1];
          st.o[m][2] *= corr[0];
          st.o[m][3] *= corr[1];
        }
      }
#pragma unroll
      for (int m = 0; m < KS; ++m) {
        // O^T C: [dim (D / 8) g + 2m][head 2t, 2t + 1], [dim + 1][head 2t, 2t + 1]
        const int vj = m / 4, vw = m % 4;  // word m of the lane's [D / 8] dimensions
        const uint32_t w0 = word_of(r.v[0][vj], vw), w1 = word_of(r.v[1][vj], vw);
        const uint32_t w2 = word_of(r.v[2][vj], vw), w3 = word_of(r.v[3][vj], vw);
        const uint32_t a[4] = {__byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632), __byte_perm(w2, w3, 0x5410),
                               __byte_perm(w2, w3, 0x7632)};
        mma_16816(st.o[m], a, pb0, pb1);
      }
    }
  }
  // l over the warp's positions (each lane summed its rows g, g + 8); m is already equal across g.
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) st.lrow[c] += __shfl_xor_sync(0xffffffffu, st.lrow[c], off);
  }
  return st;
}

// The warp's (m, l, acc) of head columns [h0, h0 + hp) (hp <= HP) into wm / wl [W][HP] and wacc [W][HP][D], slots
// 0..hp-1, as the CUDA-core passes leave theirs after their merge.
template <int D, int HP>
__device__ __forceinline__ void store_mma_state(const MmaState<D>& st, int h0, int hp, float* wm, float* wl,
                                                float* wacc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int i = 2 * t + c - h0;
    if (i < 0 || i >= hp) continue;
    if (g == 0) {
      wm[warp * HP + i] = st.mrow[c];
      wl[warp * HP + i] = st.lrow[c];
    }
    float* dst = wacc + (warp * HP + i) * D + (D / 8) * g;
#pragma unroll
    for (int m = 0; m < D / 16; ++m) {
      dst[2 * m] = st.o[m][c];
      dst[2 * m + 1] = st.o[m][2 + c];
    }
  }
}

}  // namespace kog
