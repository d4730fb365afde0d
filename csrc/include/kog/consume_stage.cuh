// The consumer warps' pass over one stage's chunks: wait for each slot, GEMV partials, release the slot, batched
// epilogues; and the small helpers of the stage epilogues.
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/config.cuh"
#include "kog/fp8.cuh"
#include "kog/gemv.cuh"
#include "kog/numerics.cuh"
#include "kog/smem_header.cuh"
#include "kog/sync.cuh"
#include "kog/trace.cuh"

namespace kog {

// The consumers' read position in the ring of weight slots (the loader fills the slots in the same order).
struct Ring {
  uint8_t* base;
  int ns;
  int slot;
  uint32_t phase;
  int parity;  // alternates per batch of chunks: SmemHeader::epi
  uint32_t slot_bytes;  // ModelArgs::slot_bytes
};

// Consume this block's chunks of one stage: c = c0, c0 + G, ... ; epi(row, k, v0, v1) per output unit, k = the
// unit's index among this block's units of the stage (j-th chunk of the block: k = j * nu + unit). landed_ev >= 0:
// the timeline event marked when the last chunk's wait returns (token t, layer l).
//
// Per chunk a warp only computes its partial, releases the slot and leaves the partial in shared memory: no
// barrier and no epilogue on the per-chunk path. Every kEpilogueBatch chunks (and after the stage's last) the
// consumer barrier, then one thread per unit sums the unit's parts in part order and runs its epilogue, all units
// of the batch at once. The two EpiBatch buffers alternate: a warp writes batch i + 2's partials into batch i's
// buffer only after the barrier of batch i + 1, which every thread reaches after its reads of batch i.
// kFp8W: the stage's chunks are FP8 rows with their scales (fp8_scale: the stage's scale tensor, laid out by
// fp8_mode; fp8.cuh); else bf16 rows.
// consume_chunks takes the stage's geometry itself (a MoE router's lives in SmemHeader::moe). kSlotX: unit u's input
// vector is slot (u & (2^x_slots_log2 - 1)) of x_s, K elements each (the MoE down stage: each slot's act), else x_s.
template <bool kPair, bool kFp8W = false, bool kSlotX = false, class Epi>
__device__ __forceinline__ void consume_chunks(const ModelArgs& m, SmemHeader& hdr, Ring& ring, const bf16* x_s,
                                               const StageGeom g, int c0, Epi&& epi, const Tracer& tr, int t, int l,
                                               int landed_ev, int fp8_mode = kFp8None,
                                               const float* fp8_scale = nullptr, int x_slots_log2 = 0) {
  constexpr int kLog2W = 3, F = MonoConfig::kEpilogueBatch;
  static_assert(MonoConfig::kConsumerWarps == 1 << kLog2W, "warps per block");
  static_assert(!(kSlotX && kFp8W), "per-slot inputs are a bf16 MoE stage's");
  const int G = gridDim.x;
  const int n = g.chunks, K = g.k, N = g.n, nu = g.nu;
  // nu and wpu = kConsumerWarps / nu are powers of two (plan.py): shifts, not divisions, on the per-chunk path.
  const int nu_log2 = __ffs(nu) - 1, wpu_log2 = kLog2W - nu_log2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint32_t* const ctrs = m.counters;
  for (int c = c0, j = 0; c < n; c += G, ++j) {
    const int jb = j & (F - 1);  // this chunk's place in its batch
    // (An abort may end this wait with the slot's copy still in flight: the loader then issues nothing more and drains
    // its copies before the block exits; this launch's results are discarded.)
    if (!mbar_wait(&hdr.full[ring.slot], ring.phase, ctrs, kSiteFull)) hdr.abandoned = 1;
    if (landed_ev >= 0 && c + G >= n && threadIdx.x == 0) tr.mark(t, l, landed_ev);
    float a0, a1;
    if constexpr (kFp8W) {
      const uint8_t* w_s = ring.base + static_cast<size_t>(ring.slot) * ring.slot_bytes;
      const int nvalid = min(nu, N - c * nu);
      const uint32_t skip0 = fp8_span(fp8_scale, fp8_mode, K, c * nu, nvalid).skip;
      const uint32_t skip1 = kPair ? fp8_span(fp8_scale, fp8_mode, K, N + c * nu, nvalid).skip : 0u;
      gemv_partial_fp8<kPair>(w_s, skip0, skip1, x_s, K, nu, wpu_log2, nvalid, fp8_mode, a0, a1);
    } else {
      const bf16* w_s = reinterpret_cast<const bf16*>(ring.base + static_cast<size_t>(ring.slot) * ring.slot_bytes);
      const bf16* x_w = x_s;
      if constexpr (kSlotX) x_w = x_s + static_cast<size_t>((warp >> wpu_log2) & ((1 << x_slots_log2) - 1)) * K;
      gemv_partial<kPair>(w_s, x_w, K, nu, wpu_log2, min(nu, N - c * nu), a0, a1);
    }
    // The warp's reads of the slot are done (its sums consumed them): release it before anything else.
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(&hdr.empty[ring.slot]);
      hdr.epi[ring.parity].v[jb][0][warp] = a0;
      if constexpr (kPair) hdr.epi[ring.parity].v[jb][1][warp] = a1;
    }
    if (++ring.slot == ring.ns) {
      ring.slot = 0;
      ring.phase ^= 1u;
    }
    if (jb == F - 1 || c + G >= n) {
      consumer_sync();
      const EpiBatch& eb = hdr.epi[ring.parity];
      const int q = threadIdx.x;  // one unit of the batch: (jb + 1) * nu <= F * kConsumerWarps threads
      if (q < (jb + 1) << nu_log2) {
        const int cb = q >> nu_log2, unit = q & (nu - 1);
        const int jj = j - jb + cb;  // the unit's chunk among the block's chunks of the stage
        const int r = (c0 + jj * G) * nu + unit;
        if (r < N) {
          const int w0 = unit << wpu_log2;  // the unit's parts, summed in part order
          float v0 = eb.v[cb][0][w0], v1 = kPair ? eb.v[cb][1][w0] : 0.f;
          for (int p = 1; p < 1 << wpu_log2; ++p) {
            v0 += eb.v[cb][0][w0 + p];
            if constexpr (kPair) v1 += eb.v[cb][1][w0 + p];
          }
          epi(r, (jj << nu_log2) + unit, v0, v1);
        }
      }
      ring.parity ^= 1;
    }
  }
}

// consume_chunks over layer stage st's geometry (SmemHeader::geo).
template <bool kPair, bool kFp8W = false, class Epi>
__device__ __forceinline__ void consume_stage(const ModelArgs& m, SmemHeader& hdr, Ring& ring, const bf16* x_s,
                                              int st, int c0, Epi&& epi, const Tracer& tr, int t, int l,
                                              int landed_ev, int fp8_mode = kFp8None,
                                              const float* fp8_scale = nullptr) {
  consume_chunks<kPair, kFp8W>(m, hdr, ring, x_s, hdr.geo[st], c0, static_cast<Epi&&>(epi), tr, t, l, landed_ev,
                               fp8_mode, fp8_scale);
}

__device__ __forceinline__ void st_bf16(bf16* p, int i, float v) { reinterpret_cast<uint16_t*>(p)[i] = f2bf_bits(v); }
__device__ __forceinline__ float ld_bf16_cg(const bf16* p, int i) { return bf2f(ld_cg_u16(p + i)); }

// resid[k] = src[row of the block's k-th unit] for the block's `mine` chunks of a stage (c0, c0 + G, ...), all in
// one round trip; the barrier that ends the following copy_to_smem publishes it. Rows past N read 0.
__device__ __forceinline__ void gather_rows(float* resid, const bf16* src, int c0, int mine, int nu, int N) {
  for (int k = threadIdx.x; k < mine * nu; k += MonoConfig::kConsumerThreads) {
    const int row = owned_row(c0, k, nu);
    resid[k] = row < N ? ld_bf16_cg(src, row) : 0.f;
  }
}

}  // namespace kog
