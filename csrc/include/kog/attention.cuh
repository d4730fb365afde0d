// GQA decode attention for one query token, split over the context: task (kv head h, split j) covers positions
// [j * len, min((j + 1) * len, pos + 1)) with len = ceil((pos + 1) / S), rounded up to whole kAttnTileLen tiles when
// it exceeds kAttnShortLen (plan_attention_split), for all g = nh / nkv query heads of h
// (kHeadsPerPass at a time). The split holding `pos` first appends this token's K (qk-norm, RoPE) and V at the
// slot vLLM assigned. Each split writes (m, l, acc) per query head; the last split of h to finish (counter, no
// waiting) combines them into bf16 attention output:
//   scores in log2 units: s = (q . k) * D^-0.5 * log2(e); m = max s; l = sum 2^(s - m); acc = sum 2^(s - m) v
//   out = sum_j 2^(m_j - M) acc_j / sum_j 2^(m_j - M) l_j,  M = max_j m_j
//
// Lane layout of the CUDA-core passes: a group of LPP = D / 8 lanes holds one position (16 B of K and of V per lane),
// a warp holds PPW = 32 / LPP positions, kAttnUnroll positions per group are loaded before the first use. Splits
// longer than kAttnShortLen take the tensor-core pass by default (ModelArgs::attn_mode kAttnModeMma):
// attention_mma.cuh.
#pragma once

#include <cmath>

#include "kog/args.cuh"
#include "kog/attention_mma.cuh"
#include "kog/attn_split.cuh"
#include "kog/config.cuh"
#include "kog/numerics.cuh"
#include "kog/rope.cuh"
#include "kog/sync.cuh"
#include "kog/tagged.cuh"
#include "kog/trace.cuh"

namespace kog {

// Whether this block runs an attention split (kv head b / S, split b % S of nkv x S tasks): the consumers run it,
// and the loader's hand-off hold waits for its publish, so both must agree.
__device__ __forceinline__ bool has_attn_task(int nkv, int S) { return static_cast<int>(blockIdx.x) < nkv * S; }

// Rows of rotated q a pass keeps in shared memory: kHeadsPerPass, or a tensor-core pass's kMmaColumns.
constexpr int kAttnQRows = MonoConfig::kHeadsPerPass > kMmaColumns ? MonoConfig::kHeadsPerPass : kMmaColumns;
static_assert(kAttnQRows <= MonoConfig::kConsumerWarps, "one consumer warp computes each q row of a pass");

// Floats of shared memory attention_task uses (in the work region): q rows, then the warps' m, l and acc of
// kHeadsPerPass heads.
__host__ __device__ constexpr int attn_work_floats(int D) {
  return kAttnQRows * D + 2 * MonoConfig::kConsumerWarps * MonoConfig::kHeadsPerPass +
         MonoConfig::kConsumerWarps * MonoConfig::kHeadsPerPass * D;
}

__device__ __forceinline__ float dot8f(const float (&q)[8], const uint4 k) {
  float a = 0.f, b = 0.f;
  a = fmaf(q[0], bf_lo(k.x), a); b = fmaf(q[1], bf_hi(k.x), b);
  a = fmaf(q[2], bf_lo(k.y), a); b = fmaf(q[3], bf_hi(k.y), b);
  a = fmaf(q[4], bf_lo(k.z), a); b = fmaf(q[5], bf_hi(k.z), b);
  a = fmaf(q[6], bf_lo(k.w), a); b = fmaf(q[7], bf_hi(k.w), b);
  return a + b;
}

// One round of a lane group's K / V loads: U positions (16 B of K and of V each); ok[u] false past the split's end or
// where the block table has no block (then zeros, never used).
template <int U>
struct KvRound {
  uint4 k[U], v[U];
  bool ok[U];
};

// Issues the loads of the round starting at position `base` (positions base + u * NG + warp * PPW + group).
template <int D, int U>
__device__ __forceinline__ void load_kv_round(const KvSource& src, const AttnTask& task, int base, KvRound<U>& r) {
  constexpr int W = MonoConfig::kConsumerWarps;
  constexpr int LPP = D / 8, PPW = 32 / LPP, NG = W * PPW;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int grp = lane / LPP, sub = lane % LPP;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int p = base + u * NG + warp * PPW + grp;
    r.k[u] = make_uint4(0, 0, 0, 0);
    r.v[u] = r.k[u];
    const int64_t off = p < task.end ? src.row(p) : -1;
    r.ok[u] = off >= 0;
    if (r.ok[u]) {
      r.k[u] = ld_cg_v4(src.k + off + sub * 8);
      r.v[u] = ld_cg_v4(src.v + off + sub * 8);
    }
  }
}

// Folds a loaded round into the online-softmax state (m, l, acc) of this lane's position group for HP query heads.
template <int D, int U, int HP>
__device__ __forceinline__ void attend_kv_round(const KvRound<U>& r, int hp, float scale, const float (&q)[HP][8],
                                                float (&mrun)[HP], float (&lrun)[HP], float (&acc)[HP][8]) {
  constexpr int LPP = D / 8;
  float s[U][HP];
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int i = 0; i < HP; ++i) {
      float v = dot8f(q[i], r.k[u]);
#pragma unroll
      for (int off = 1; off < LPP; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      s[u][i] = v * scale;
    }
  }
#pragma unroll
  for (int i = 0; i < HP; ++i) {
    if (i >= hp) continue;
    float mx = mrun[i];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r.ok[u]) mx = fmaxf(mx, s[u][i]);
    if (mx == -INFINITY) continue;
    const float corr = exp2_or_zero(mrun[i], mx);
    lrun[i] *= corr;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] *= corr;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!r.ok[u]) continue;
      const float pu = exp2f(s[u][i] - mx);
      float v[8];
      unpack8(r.v[u], v);
      lrun[i] += pu;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(pu, v[e], acc[i][e]);
    }
    mrun[i] = mx;
  }
}

// One pass over a split's positions for HP query heads: the online-softmax state (m, l, acc) of this lane's
// position group, U positions per group loaded before the first use. attention_task instantiates it twice: with
// kAttnUnroll, and with the unroll that covers kAttnShortLen positions in one round, for splits that short (every
// split at ctx 32, and up to ctx 512 with 16 splits): the long body's unused unrolled positions are neither
// computed nor fetched as instructions (the attention code runs once per layer, cold in the instruction cache).
template <int D, int U, int HP>
__device__ __forceinline__ void attend_positions(const KvSource& src, const AttnTask& task, int hp, float scale,
                                                 const float (&q)[HP][8], float (&mrun)[HP], float (&lrun)[HP],
                                                 float (&acc)[HP][8]) {
  constexpr int NG = MonoConfig::kConsumerWarps * (32 / (D / 8));
  for (int base = task.start; base < task.end; base += NG * U) {
    KvRound<U> r;
    load_kv_round<D, U>(src, task, base, r);
    attend_kv_round<D, U, HP>(r, hp, scale, q, mrun, lrun, acc);
  }
}

// A KV head's output is complete: counter ctr_done + 1, through a release (its barrier orders every thread's
// attn_out stores before it), or without one when the O stage reads the tagged words (`relaxed`).
__device__ __forceinline__ void signal_done(uint32_t* ctrs, int ctr_done, bool relaxed) {
  if (relaxed) {
    consumer_signal_relaxed(ctrs, ctr_done, 1u);
  } else {
    consumer_signal<kRelaxAttn>(ctrs, ctr_done, 1u);
  }
}

// Merges the warps' (m, l, acc) of hp heads (wm / wl / wacc, slots 0..hp-1) and writes this split's partial of
// query heads head0.. (attn_ml / attn_acc), or, for a single split, the final bf16 output (and its tagged words).
template <int D, int HP, bool kTagged>
__device__ __forceinline__ void write_split_heads(const LayerArgs& L, const AttnTask& task, int S, int head0, int hp,
                                                  const float* wm, const float* wl, const float* wacc, uint32_t tag,
                                                  uint32_t* attn_t) {
  constexpr int W = MonoConfig::kConsumerWarps;
  for (int idx = threadIdx.x; idx < hp * D; idx += MonoConfig::kConsumerThreads) {
    const int i = idx / D, d = idx - (idx / D) * D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) M = fmaxf(M, wm[w * HP + i]);
    float A = 0.f, Ls = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float c = exp2_or_zero(wm[w * HP + i], M);
      A = fmaf(c, wacc[(w * HP + i) * D + d], A);
      Ls = fmaf(c, wl[w * HP + i], Ls);
    }
    const int head = head0 + i;
    if (task.single) {  // the one partial is final: out = A / L, as combining it alone would give
      const float o = A / Ls;
      reinterpret_cast<uint16_t*>(L.attn_out)[head * D + d] = f2bf_bits(o);
      if constexpr (kTagged) st_relaxed_u32(attn_t + head * D + d, tagged_word(tag, o));
      continue;
    }
    L.attn_acc[(static_cast<size_t>(head) * S + task.split) * D + d] = A;
    if (d == 0) {
      L.attn_ml[(static_cast<size_t>(head) * S + task.split) * 2] = M;
      L.attn_ml[(static_cast<size_t>(head) * S + task.split) * 2 + 1] = Ls;
    }
  }
}

// HP: query heads per pass (<= kHeadsPerPass; the kernel's pass width, plan.heads_per_pass: 2 when a KV head has at
// most 2, so that Qwen3's GQA 2 computes no empty heads). kTagged (every TP = 1 kernel, tagged_attention_chain):
// q / k / v come from the layer's tagged words qkv_t (the caller did not wait for the QKV counter) and the output
// also goes to the tagged words attn_t, signalled without a release; otherwise qkv_out after the caller's counter
// wait, and a release (qkv_t, attn_t unused).
template <int D, int HP, bool kTagged>
__device__ void attention_task(const HotArgs& m, const LayerArgs& L, const AttnTask& task, int pos, int64_t slot,
                               const int32_t* block_table, int bt_len, const int* bt_s, float* work, int* bcast,
                               uint32_t* ctrs, int ctr_kv, int ctr_done, uint32_t epoch, const uint32_t* qkv_t,
                               uint32_t* attn_t, const Tracer& tr, int t, int l) {
  constexpr int W = MonoConfig::kConsumerWarps;
  constexpr int LPP = D / 8, PPW = 32 / LPP, NG = W * PPW;
  constexpr int U = MonoConfig::kAttnUnroll, E = D / 32;
  static_assert(HP >= 1 && HP <= MonoConfig::kHeadsPerPass, "attn_work_floats sizes the work area for kHeadsPerPass");
  constexpr int kShortU = MonoConfig::kAttnShortLen / NG > 0 ? MonoConfig::kAttnShortLen / NG : 1;
  static_assert(kShortU <= U && kShortU * NG >= MonoConfig::kAttnShortLen,
                "the short pass covers its splits in one round");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int sub = lane % LPP;
  const int nh = static_cast<int>(m.num_heads), nkv = static_cast<int>(m.num_kv_heads);
  const int g = nh / nkv, S = static_cast<int>(m.num_splits), bs = static_cast<int>(m.block_size);
  const int q_size = nh * D, kv_size = nkv * D;
  const float eps = m.rms_eps;
  const float scale = m.attn_scale_log2;
  const int64_t s_blk = m.kv_stride_block, s_pos = m.kv_stride_pos, s_head = m.kv_stride_head;
  const bf16* cs_row = m.cos_sin + static_cast<size_t>(pos) * D;
  const int kvh = task.kvh;
  const uint32_t tag = handoff_tag(epoch);
  const KvSource src{L.k_cache, L.v_cache, block_table, task.bt_count >= 0 ? bt_s : nullptr, task.bt_first, bt_len,
                     31 - __clz(bs), s_blk, s_pos, kvh * s_head};
  // Single-split mode: the empty splits only keep ctr_kv at S per token, so that the "last split combines" target
  // (epoch + 1) x S holds whichever mode a later token runs in (no data is published through these adds; a later
  // token's atomic on ctr_kv follows them in causality order through the layer's hand-offs).
  if (task.single && task.split > 0) {
    if (tid == 0) red_relaxed_add(counter(ctrs, ctr_kv), 1u);
    return;
  }
  if constexpr (diag::kSaltMid > 0) diag::salt_mid(nh < 0);  // (diagnostics.cuh)
  // Splits longer than kAttnShortLen run on the tensor cores unless the mode says otherwise; their first rounds head
  // for L2 now, while this token's q and K / V are still on their way (the tagged reads below wait for them).
  const bool mma = task.mode != kAttnModeRounds && task.end - task.start > MonoConfig::kAttnShortLen;
  // (The span is recomputed where it is used rather than kept across the q pass: at the kernel's register cap, a
  // value live across it made ptxas spill in the norms and the KV append.)
  if (mma && task.prefetch > 0) prefetch_mma_pass_start<D>(src, kv_prefetch_span<D>(src, m, kvh), task);

  float* qs = work;                     // [kAttnQRows][D] rotated q of this pass
  float* wm = qs + kAttnQRows * D;      // [W][HP]    per-warp running max
  float* wl = wm + W * HP;              // [W][HP]    per-warp sum
  float* wacc = wl + W * HP;            // [W][HP][D] per-warp accumulator

  if constexpr (!diag::kNoAttn) {  // (diagnostics.cuh: a build with the hand-offs only)
    if (task.owner && warp == W - 1) {
      float y[E];
      const bf16* knorm = m.qk_norm ? L.k_norm : nullptr;
      const int64_t off = (slot / bs) * s_blk + (slot % bs) * s_pos + kvh * s_head;
      uint16_t* kdst = reinterpret_cast<uint16_t*>(L.k_cache + off);
      uint16_t* vdst = reinterpret_cast<uint16_t*>(L.v_cache + off);
      uint16_t v[E];
      if constexpr (kTagged) {
        qk_norm_rope_warp<D, true>(qkv_t + q_size + kvh * D, knorm, eps, cs_row, y, tag, ctrs);
        tagged_lane_words<E>(qkv_t + q_size + kv_size + kvh * D, lane, tag, ctrs, v);
      } else {
        qk_norm_rope_warp<D>(L.qkv_out + q_size + kvh * D, knorm, eps, cs_row, y);
        const uint16_t* vsrc = reinterpret_cast<const uint16_t*>(L.qkv_out + q_size + kv_size + kvh * D);
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = ld_cg_u16(vsrc + lane + 32 * e);
      }
#pragma unroll
      for (int e = 0; e < E; ++e) {
        kdst[lane + 32 * e] = f2bf_bits(y[e]);
        vdst[lane + 32 * e] = v[e];
      }
    }
    // (The barrier after the q pass below orders these cache writes before this block's reads of `pos`.)

    // Query heads of one pass over the split's K / V: HP, or on the tensor cores with kAttnModeMmaWide every query
    // head of the KV head up to the mma's kMmaColumns (one read of the split's K / V instead of ceil(g / HP)).
    const int pass_heads = mma && task.mode == kAttnModeMmaWide ? min(g, kMmaColumns) : HP;
    for (int hb = 0; hb < g; hb += pass_heads) {
      const int hq = min(pass_heads, g - hb);
      // A later pass over the same split (mode 1 past 4 query heads, mode 2 past 8) re-reads it from its start.
      if (hb > 0 && mma && task.prefetch > 0) {
        prefetch_mma_pass_start<D>(src, kv_prefetch_span<D>(src, m, kvh), task);
      }
      if (warp < hq) {
        const int head = kvh * g + hb + warp;
        float y[E];
        const bf16* qnorm = m.qk_norm ? L.q_norm : nullptr;
        if constexpr (kTagged) {
          qk_norm_rope_warp<D, true>(qkv_t + head * D, qnorm, eps, cs_row, y, tag, ctrs);
        } else {
          qk_norm_rope_warp<D>(L.qkv_out + head * D, qnorm, eps, cs_row, y);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) {
          qs[warp * D + lane + 32 * e] = y[e];
          if (task.split == 0) reinterpret_cast<uint16_t*>(L.q_out)[head * D + lane + 32 * e] = f2bf_bits(y[e]);
        }
      }
      consumer_sync();
      if (hb == 0 && tid == 0) tr.mark(t, l, kEvAttnQ);

      if (mma) {
        // Tensor cores: the warps' states leave registers HP heads at a time (wacc holds HP per warp).
        const MmaState<D> st =
            attend_positions_mma<D>(src, kv_prefetch_span<D>(src, m, kvh), task, hq, scale, qs);
        for (int ob = 0; ob < hq; ob += HP) {
          const int hp = min(HP, hq - ob);
          store_mma_state<D, HP>(st, ob, hp, wm, wl, wacc);
          consumer_sync();
          if (hb + ob == 0 && tid == 0) tr.mark(t, l, kEvAttnKV);
          write_split_heads<D, HP, kTagged>(L, task, S, kvh * g + hb + ob, hp, wm, wl, wacc, tag, attn_t);
          consumer_sync();
        }
      } else {
        const int hp = hq;  // <= HP
        float q[HP][8], mrun[HP], lrun[HP], acc[HP][8];
#pragma unroll
        for (int i = 0; i < HP; ++i) {
          mrun[i] = -INFINITY;
          lrun[i] = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            q[i][e] = i < hp ? qs[i * D + sub * 8 + e] : 0.f;
            acc[i][e] = 0.f;
          }
        }

        if (task.end - task.start <= MonoConfig::kAttnShortLen) {
          attend_positions<D, kShortU, HP>(src, task, hp, scale, q, mrun, lrun, acc);
        } else {
          attend_positions<D, U, HP>(src, task, hp, scale, q, mrun, lrun, acc);
        }

        // Merge the PPW position groups of each warp (lanes with equal `sub`).
#pragma unroll
        for (int off = LPP; off < 32; off <<= 1) {
#pragma unroll
          for (int i = 0; i < HP; ++i) {
            const float mo = __shfl_xor_sync(0xffffffffu, mrun[i], off);
            const float lo = __shfl_xor_sync(0xffffffffu, lrun[i], off);
            const float mn = fmaxf(mrun[i], mo);
            const float c1 = exp2_or_zero(mrun[i], mn), c2 = exp2_or_zero(mo, mn);
            lrun[i] = lrun[i] * c1 + lo * c2;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              const float ao = __shfl_xor_sync(0xffffffffu, acc[i][e], off);
              acc[i][e] = acc[i][e] * c1 + ao * c2;
            }
            mrun[i] = mn;
          }
        }
        if (lane < LPP) {
#pragma unroll
          for (int i = 0; i < HP; ++i) {
#pragma unroll
            for (int e = 0; e < 8; ++e) wacc[(warp * HP + i) * D + sub * 8 + e] = acc[i][e];
            if (lane == 0) {
              wm[warp * HP + i] = mrun[i];
              wl[warp * HP + i] = lrun[i];
            }
          }
        }
        consumer_sync();
        if (hb == 0 && tid == 0) tr.mark(t, l, kEvAttnKV);
        write_split_heads<D, HP, kTagged>(L, task, S, kvh * g + hb, hp, wm, wl, wacc, tag, attn_t);
        consumer_sync();
      }
      if (hb == 0 && tid == 0) tr.mark(t, l, kEvAttnPart);
    }
  }
  if (task.single) {
    if (tid == 0) red_relaxed_add(counter(ctrs, ctr_kv), 1u);
    signal_done(ctrs, ctr_done, kTagged);
    return;
  }
  // Publish this split; the last of kv head h's S splits combines (its acquire covers the other splits' writes).
  if (tid == 0) {
    const uint32_t old = diag::relaxed(kRelaxAttn) ? atom_relaxed_add(counter(ctrs, ctr_kv), 1u)
                                                   : atom_acq_rel_add(counter(ctrs, ctr_kv), 1u);
    bcast[0] = (old + 1u == (epoch + 1u) * static_cast<uint32_t>(S)) ? 1 : 0;
  }
  consumer_sync();
  if (bcast[0] == 0) return;
  // kCombineBatch splits per round trip: a batch's loads are all issued before any is used (one L2 round trip per
  // batch instead of one per split: measured 7.4 us for the sixteen splits of ctx 32 when loaded one split at a
  // time, docs/tuning.md). Within a batch: M_b = max m_j, then sums in split order; batches merge with the
  // usual rescaling (S <= kCombineBatch: exactly reference.combine_splits' formula).
  constexpr int kB = MonoConfig::kCombineBatch;
  if constexpr (!diag::kNoAttn) {
    for (int idx = tid; idx < g * D; idx += MonoConfig::kConsumerThreads) {
      const int i = idx / D, d = idx - (idx / D) * D;
      const int head = kvh * g + i;
      const float* ml = L.attn_ml + static_cast<size_t>(head) * S * 2;
      const float* ac = L.attn_acc + static_cast<size_t>(head) * S * D + d;
      float M = -INFINITY, num = 0.f, den = 0.f;
      for (int j0 = 0; j0 < S; j0 += kB) {
        float mj[kB], lj[kB], aj[kB];
#pragma unroll
        for (int u = 0; u < kB; ++u) {
          const bool in = j0 + u < S;
          mj[u] = in ? ld_cg_f32(ml + 2 * (j0 + u)) : -INFINITY;
          lj[u] = in ? ld_cg_f32(ml + 2 * (j0 + u) + 1) : 0.f;
          aj[u] = in ? ld_cg_f32(ac + static_cast<size_t>(j0 + u) * D) : 0.f;
        }
        float mb = -INFINITY;
#pragma unroll
        for (int u = 0; u < kB; ++u) mb = fmaxf(mb, mj[u]);
        if (mb == -INFINITY) continue;
        if (mb > M) {
          const float c = exp2_or_zero(M, mb);
          num *= c;
          den *= c;
          M = mb;
        }
#pragma unroll
        for (int u = 0; u < kB; ++u) {
          const float c = exp2_or_zero(mj[u], M);
          den = fmaf(c, lj[u], den);
          num = fmaf(c, aj[u], num);
        }
      }
      const float o = num / den;
      reinterpret_cast<uint16_t*>(L.attn_out)[head * D + d] = f2bf_bits(o);
      if constexpr (kTagged) st_relaxed_u32(attn_t + head * D + d, tagged_word(tag, o));
    }
  }
  signal_done(ctrs, ctr_done, kTagged);
}

}  // namespace kog
