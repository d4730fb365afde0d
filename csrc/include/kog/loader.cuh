// The loader warp (one lane): streams this block's weight chunks into the ring of shared-memory slots, in schedule
// order and independently of any data dependency (monokernel.cuh).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/attention.cuh"
#include "kog/config.cuh"
#include "kog/diagnostics.cuh"
#include "kog/fp8.cuh"
#include "kog/gemv.cuh"
#include "kog/handoff_hold.cuh"
#include "kog/moe_route.cuh"
#include "kog/schedule.cuh"
#include "kog/smem_header.cuh"
#include "kog/sync.cuh"
#include "kog/tagged.cuh"
#include "kog/trace.cuh"

namespace kog {

// The weight matrix a stage streams: layer table La's for the layer stages, the LM head's for kStageLM.
__device__ __forceinline__ const bf16* stage_weight(const HotArgs& h, const LayerArgs& La, int st) {
  switch (st) {
    case MonoConfig::kStageQKV: return La.qkv;
    case MonoConfig::kStageO: return La.o_proj;
    case MonoConfig::kStageGU: return La.gate_up;
    case MonoConfig::kStageDown: return La.down;
    default: return h.lm_head;
  }
}

// The fp32 scales of a layer stage's FP8 weight (fp8.cuh).
__device__ __forceinline__ const float* stage_scale(const Fp8LayerScales& f, int st) {
  switch (st) {
    case MonoConfig::kStageQKV: return f.qkv;
    case MonoConfig::kStageO: return f.o_proj;
    case MonoConfig::kStageGU: return f.gate_up;
    default: return f.down;
  }
}

// A cursor's FP8 state (kFp8): the scales of its stage's weight and the launch's scale table; empty in a bf16 kernel,
// whose cursors keep the layout (and the code) they have without FP8.
template <bool kFp8>
struct Fp8CursorState {
  const float* s;             // the stage's scales: read once per stage, not per chunk
  const Fp8LayerScales* fp8;  // ModelArgs::fp8_scales
};
template <>
struct Fp8CursorState<false> {};

// A cursor's MoE state (kMoe): the launch's MoE constants and the loader's copy of the layer's route (SmemHeader::moe)
// and the routers' weight table; empty in the other kernels.
template <bool kMoe>
struct MoeCursorState {
  const MoeHot* moe;
  const bf16* const* routers;  // ModelArgs::moe_routers
};
template <>
struct MoeCursorState<false> {};

// This block's chunks in schedule order: token t, layer l, stage st (QKV, O, GU, down per layer, then LM), chunk c.
// kFp8: the layer stages' weights are FP8 rows with scales (fp8.cuh); the LM head's are bf16. kMoe: a layer's stages
// are QKV, O, the router (kStageMoeRouter), the experts' gate/up (kStageGU) and down (kStageDown) (moe_stages.cuh).
template <bool kFp8, bool kMoe = false>
struct ChunkCursor : Fp8CursorState<kFp8>, MoeCursorState<kMoe> {
  int t, l, st, c, base;
  bool done;
  const bf16* w;  // weight matrix of stage (l, st): read from global memory once per stage, not per chunk

  __device__ __forceinline__ void start(const HotArgs& h, const StageGeom* geo, int num_tokens,
                                        const Fp8LayerScales* fp8_scales, const MoeHot* moe = nullptr,
                                        const bf16* const* routers = nullptr) {
    if constexpr (kFp8) this->fp8 = fp8_scales;
    if constexpr (kMoe) {
      this->moe = moe;
      this->routers = routers;
    }
    t = 0;
    l = 0;
    st = MonoConfig::kStageQKV;
    base = 0;
    done = num_tokens <= 0;
    c = first_chunk(blockIdx.x, base, gridDim.x);
    settle(h, geo, num_tokens, true);
  }
  // The geometry of the cursor's stage.
  __device__ __forceinline__ const StageGeom& geom(const StageGeom* geo) const {
    if constexpr (kMoe) {
      if (st == kStageMoeRouter) return this->moe->router;
    }
    return geo[st];
  }
  // Moves past stages in which this block owns no (more) chunks.
  __device__ __forceinline__ void settle(const HotArgs& h, const StageGeom* geo, int num_tokens, bool moved) {
    const int G = gridDim.x;
    while (!done && c >= geom(geo).chunks) {
      base = (base + geom(geo).chunks) % G;
      if (st == MonoConfig::kStageLM) {
        ++t;
        l = 0;
        st = MonoConfig::kStageQKV;
        done = t >= num_tokens;
      } else if (st == MonoConfig::kStageDown) {
        ++l;
        st = l == h.num_layers ? MonoConfig::kStageLM : MonoConfig::kStageQKV;
      } else if (kMoe && st == MonoConfig::kStageO) {
        st = kStageMoeRouter;
      } else if (kMoe && st == kStageMoeRouter) {
        st = MonoConfig::kStageGU;
      } else {
        ++st;
      }
      c = first_chunk(blockIdx.x, base, G);
      moved = true;
    }
    if (moved && !done) {
      if (kMoe && st == kStageMoeRouter) {
        if constexpr (kMoe) w = this->routers[l];
      } else {
        w = st == MonoConfig::kStageLM ? h.lm_head : stage_weight(h, h.layers[l], st);
      }
      if constexpr (kFp8) this->s = st == MonoConfig::kStageLM ? nullptr : stage_scale(this->fp8[l], st);
    }
  }
  // Whether the current stage streams FP8 rows.
  __device__ __forceinline__ bool fp8_stage() const { return kFp8 && st != MonoConfig::kStageLM; }
  __device__ __forceinline__ void advance(const HotArgs& h, const StageGeom* geo, int num_tokens) {
    c += gridDim.x;
    settle(h, geo, num_tokens, false);
  }
  __device__ __forceinline__ Chunk chunk(const StageGeom* geo) const {
    if constexpr (kFp8) {
      if (fp8_stage()) return chunk_of_fp8(geo[st], w, st == MonoConfig::kStageGU, c);
    }
    if constexpr (kMoe) {
      const MoeHot& mo = *this->moe;
      if (st == kStageMoeRouter) return chunk_of(mo.router, w, false, c);
      if (st == MonoConfig::kStageGU) {  // units slot * I + row: nu gate/up row pairs of the slot's expert
        const StageGeom& g = geo[st];
        const int per_slot = mo.inter / g.nu;
        const int s = c / per_slot;
        const bf16* we = w + static_cast<size_t>(mo.ids[s]) * 2 * mo.inter * g.k;
        return chunk_of(StageGeom{g.k, mo.inter, g.nu, per_slot}, we, true, c - s * per_slot);
      }
      // kStageDown: bytes0 is the chunk's (nu rows of K); run_loader copies each row from its slot's expert.
    }
    return chunk_of(geo[st], w, st == MonoConfig::kStageGU, c);
  }
};

// A chunk's weight rows towards L2 (both halves of a gate/up chunk).
__device__ __forceinline__ void prefetch_chunk_l2(const Chunk& ch) {
  bulk_prefetch_l2(ch.src0, ch.bytes0);
  if (ch.bytes1 != 0) bulk_prefetch_l2(ch.src1, ch.bytes1);
}

// Streams the block's chunks into the ring; also keeps `prefetch_chunks` further chunks on their way into L2
// (cp.async.bulk.prefetch.L2), so HBM keeps streaming while the consumers wait on a dependency and the ring is full,
// or (`stall_prefetch_chunks`, with prefetch_chunks 0) sends its next chunks towards L2 only while it waits for a
// slot: the cursor `pref` is then `lead` chunks past `fill` (lead 0: the chunk fill is about to copy).
// With stage_end_copies / attn_end_copies below num_slots it holds around the block's hand-offs (handoff_hold.cuh).
// No deadlock: a loader held at a hand-off has issued every chunk up to it, so the earliest hand-off not yet made
// anywhere has all its chunks in its ring and, by induction over the schedule, all its inputs on their way.
// Where the loader stopped: the ring position after its last copy and how many it issued (drain_copies).
struct LoaderExit {
  int slot;
  uint32_t phase;
  int issued;
};

template <bool kTP, bool kFp8, bool kMoe>
__device__ LoaderExit stream_chunks(const ModelArgs& m, const StepArgs& step, SmemHeader& hdr, uint8_t* ring) {
  static_assert(!kMoe || (!kTP && !kFp8), "the MoE kernel streams bf16 experts on one GPU");
  const uint64_t policy = l2_evict_first_policy();
  const int ns = static_cast<int>(m.num_slots);
  const size_t slot_bytes = static_cast<size_t>(m.slot_bytes);
  const int hold_stage = static_cast<int>(m.stage_end_copies), hold_attn = static_cast<int>(m.attn_end_copies);
  const bool has_task = has_attn_task(static_cast<int>(m.num_kv_heads), static_cast<int>(m.num_splits));
  // (No hold in a MoE kernel: its router stage has no hand-off sequence number.)
  const bool holding = !kMoe && (hold_stage < ns || (has_task && hold_attn < ns));
  // A QKV hand-off through tagged words has no release (tagged.cuh): nothing to hold for.
  constexpr bool qkv_unfenced = tagged_attention_chain<kTP>();
  const int L = static_cast<int>(m.num_layers);
  const int fp8_mode = kFp8 ? static_cast<int>(m.fp8_scaling) : static_cast<int>(kFp8None);
  HandoffHold hh;
  int issued = 0;
  // (None in a MoE kernel: the prefetch cursor would have to wait for routes ahead of the copies.)
  const int ahead = kMoe ? 0 : static_cast<int>(m.prefetch_chunks);
  const int stall_ahead = kMoe || ahead > 0 ? 0 : static_cast<int>(m.stall_prefetch_chunks);
  const int cap = static_cast<int>(m.max_inflight);  // 0 or >= ns: no cap
  int lead = 0;
  const int ntok = step.num_tokens;
  int slot = 0, cur_t = 0, mark_t = -1, mark_l = -1;
  uint32_t phase = 0;
  const Tracer tr(m);
  const StageGeom* geo = hdr.geo;
  const HotArgs& hot = hdr.hot;
  uint32_t* const ctrs = m.counters;
  ChunkCursor<kFp8, kMoe> fill, pref;
  fill.start(hot, geo, ntok, kFp8 ? m.fp8_scales : nullptr, &hdr.moe, m.moe_routers);
  pref.start(hot, geo, ntok, kFp8 ? m.fp8_scales : nullptr, &hdr.moe, m.moe_routers);
  // MoE: the (token, layer) whose route hdr.moe.ids holds, and the counters' epoch at the launch's start (token t's
  // route is published as epoch0 + t + 1).
  int route_t = -1, route_l = -1;
  const auto stopped = [&] { return LoaderExit{slot, phase, issued}; };
  const uint32_t epoch0 = kMoe ? ld_relaxed(counter(ctrs, kCtrEpoch)) : 0u;
  for (int i = 0; i < ahead && !pref.done; ++i) {
    prefetch_chunk_l2(pref.chunk(geo));
    pref.advance(hot, geo, ntok);
  }
  while (!fill.done) {
    if (fill.t > cur_t) {
      // The next token's weights are the same bytes; wait until the consumers know whether it exists.
      const long long t0 = clock64();
      // (tok_stop also ends the wait: a block that owns no chunk of token t + 1 waits here for t + 2.) The consumers'
      // thread 0 decides for the block after every token, an abort included (token_stops): the loader follows that
      // one decision, so that it never leaves consumers that go on without it.
      while (hdr.tok_go < fill.t && hdr.tok_stop == 0) {
        __nanosleep(64);
        if (clock64() - t0 > kWaitTimeoutCycles) {
          record_abort(m.counters, kSiteTokenGo, static_cast<uint32_t>(fill.t), 0u, 0u);
          return stopped();
        }
      }
      __threadfence_block();  // tok_stop read after tok_go (token_stops writes tok_stop, a fence, then tok_go)
      if (hdr.tok_stop) return stopped();
      cur_t = fill.t;
    }
    if constexpr (kMoe) {
      // An expert chunk's source is its slot's routed expert: the layer's route, published by the router stage's last
      // block (moe_stages.cuh), is this loader's one wait on data. Every chunk before it is issued already, so the
      // router stage it waits for is never behind it (the induction of the no-deadlock argument above).
      if ((fill.st == MonoConfig::kStageGU || fill.st == MonoConfig::kStageDown) &&
          (fill.t != route_t || fill.l != route_l)) {
        spin_until(ctrs, static_cast<int>(hdr.moe.ctr_base) + 2 * fill.l + 1, epoch0 + static_cast<uint32_t>(fill.t) + 1u,
                   false);
        if (aborted(ctrs)) return stopped();
        const int32_t* r = hdr.moe.route + static_cast<size_t>(fill.l) * 2 * kMoeMaxTopK;
        for (int s = 0; s < hdr.moe.top_k; ++s) hdr.moe.ids[s] = static_cast<int>(ld_cg_u32(reinterpret_cast<const uint32_t*>(r) + s));
        route_t = fill.t;
        route_l = fill.l;
      }
    }
    const Chunk ch = fill.chunk(geo);
    const int K = fill.geom(geo).k, nu = fill.geom(geo).nu;
    if (tr.p != nullptr && (fill.t != mark_t || fill.l != mark_l)) {
      tr.mark(fill.t, fill.st == MonoConfig::kStageLM ? static_cast<int>(m.num_layers) : fill.l, kEvLoaderLayer);
      mark_t = fill.t;
      mark_l = fill.l;
    }
    if (holding && !hh.before_issue(hdr.released, issued, ctrs)) return stopped();
    if (stall_ahead > 0) {  // the slot still being read: the ring is full, HBM idles for this SM
      while (lead < stall_ahead && !pref.done && !mbar_test_wait(&hdr.empty[slot], phase ^ 1u)) {
        prefetch_chunk_l2(pref.chunk(geo));
        pref.advance(hot, geo, ntok);
        ++lead;
      }
    }
    if (!mbar_wait(&hdr.empty[slot], phase ^ 1u, ctrs, kSiteEmpty)) return stopped();
    int capn = cap;
    if constexpr (kFp8) capn = fp8_inflight_cap(cap, ns, slot_bytes, ch.bytes0 + ch.bytes1);
    if (capn > 0 && capn < ns && issued >= capn) {
      // At most `capn` copies in flight: the one issued `capn` copies ago (slot - capn, in this lap of the ring or
      // the previous one) must have landed. Its full phase cannot have moved on since: the slot is refilled
      // only after this loader has issued ns - capn more copies (capn may change between stages: any capn < ns
      // names a copy this loader issued whose phase is still the one computed here).
      int ps = slot - capn;
      uint32_t pp = phase;
      if (ps < 0) {
        ps += ns;
        pp ^= 1u;
      }
      if (!mbar_wait(&hdr.full[ps], pp, ctrs, kSiteFull, false)) return stopped();  // (a copy it issued)
    }
    // A consumer gave up on a slot after an abort (consume_stage.cuh): no copy may follow (it could re-arm a slot
    // whose copy is still in flight); the ones issued are drained. The flag is read after the empty wait, whose
    // acquire orders it after the consumers' arrivals that released the slot.
    if (hdr.abandoned) return stopped();
    if constexpr (diag::kNoCopy) {  // (diagnostics.cuh) the slot marked full, nothing copied
      mbar_arrive(&hdr.full[slot]);
    } else if (fill.fp8_stage()) {
      if constexpr (kFp8) {  // (fill.s exists in FP8 kernels only)
        // FP8 rows, then each half's scale span (fp8.cuh).
        const bool pair = ch.bytes1 != 0;
        const Fp8Span s0 = fp8_span(fill.s, fp8_mode, K, ch.r0, ch.nvalid);
        const Fp8Span s1 =
            pair ? fp8_span(fill.s, fp8_mode, K, geo[fill.st].n + ch.r0, ch.nvalid) : Fp8Span{nullptr, 0u, 0u};
        uint8_t* dst = ring + static_cast<size_t>(slot) * slot_bytes;
        mbar_arrive_expect_tx(&hdr.full[slot], ch.bytes0 + ch.bytes1 + s0.bytes + s1.bytes);
        bulk_copy_g2s(dst, ch.src0, ch.bytes0, &hdr.full[slot], policy);
        if (pair) bulk_copy_g2s(dst + fp8_pair_offset_bytes(K, nu), ch.src1, ch.bytes1, &hdr.full[slot], policy);
        // The spans sit after nu rows per half (also in a last chunk of fewer rows), where the consumers look.
        const uint32_t rows_bytes = fp8_pair_offset_bytes(K, nu) * (pair ? 2u : 1u);
        bulk_copy_g2s(dst + fp8_span_offset(rows_bytes, K, 0), s0.src, s0.bytes, &hdr.full[slot], policy);
        if (pair) bulk_copy_g2s(dst + fp8_span_offset(rows_bytes, K, 1), s1.src, s1.bytes, &hdr.full[slot], policy);
      }
    } else if (kMoe && fill.st == MonoConfig::kStageDown) {
      // nu / k output rows, each from every slot's expert (unit u: row u >> log2 k of the chunk, slot u & (k - 1)),
      // one K-element row per copy, in unit order where the consumers read them.
      const MoeHot& mo = hdr.moe;
      const uint32_t row_bytes = static_cast<uint32_t>(K) * 2u;
      const int H = geo[MonoConfig::kStageDown].n >> mo.log2_top_k;
      const int row0 = fill.c * (nu >> mo.log2_top_k);
      uint8_t* dst = ring + static_cast<size_t>(slot) * slot_bytes;
      mbar_arrive_expect_tx(&hdr.full[slot], ch.bytes0);
      for (int u = 0; u < ch.nvalid; ++u) {
        const int e = mo.ids[u & (mo.top_k - 1)], row = row0 + (u >> mo.log2_top_k);
        bulk_copy_g2s(dst + u * row_bytes, fill.w + (static_cast<size_t>(e) * H + row) * K, row_bytes,
                      &hdr.full[slot], policy);
      }
    } else {
      mbar_arrive_expect_tx(&hdr.full[slot], ch.bytes0 + ch.bytes1);
      uint8_t* dst = ring + static_cast<size_t>(slot) * slot_bytes;
      bulk_copy_g2s(dst, ch.src0, ch.bytes0, &hdr.full[slot], policy);
      if (ch.bytes1 != 0) bulk_copy_g2s(dst + pair_offset_bytes(K, nu), ch.src1, ch.bytes1, &hdr.full[slot], policy);
    }
    if (++slot == ns) {
      slot = 0;
      phase ^= 1u;
    }
    ++issued;
    if (holding && fill.c + static_cast<int>(gridDim.x) >= fill.geom(geo).chunks) {  // the block's last chunk of it
      // Up to max(h, ns - mine) chunks past it, mine = the block's chunks of the stage (fill.c = c0 + (mine - 1) G,
      // c0 < G): a stage of few chunks per block (O of the 1-2B shapes: 2) lets the ring fill behind the
      // attention's wait, and a full ring has nothing in flight when the release comes (docs/monokernel.md item 9).
      const int mine = fill.c / static_cast<int>(gridDim.x) + 1;
      if (hold_stage < ns && !(qkv_unfenced && fill.st == MonoConfig::kStageQKV)) {
        hh.arm(hand_off_seq(fill.t, fill.l, fill.st, L), issued + max(hold_stage, ns - mine));
      }
      if (fill.st == MonoConfig::kStageQKV && has_task && hold_attn < ns) {
        hh.arm(hand_off_seq(fill.t, fill.l, kHandoffAttn, L), issued + hold_attn);
      }
    }
    fill.advance(hot, geo, ntok);
    if (stall_ahead > 0) {  // keep pref = fill + lead: the chunk just copied was prefetched, or pref moves with it
      if (lead > 0) {
        --lead;
      } else {
        pref.advance(hot, geo, ntok);
      }
    }
    if (ahead > 0 && !pref.done) {  // (ahead 0: no prefetch at all, not one of the chunk just copied)
      prefetch_chunk_l2(pref.chunk(geo));
      pref.advance(hot, geo, ntok);
    }
  }
  return stopped();
}

// Waits until every bulk copy the loader issued has landed, so that the block never exits (its shared memory
// going to the next kernel on the SM) with a copy in flight: after an abort the consumers may have stopped
// waiting for some. At most the last ns copies can be pending, one per slot (a slot is re-armed only after its
// previous copy was consumed, hence landed), and no later copy went into their slots, so each one's full phase
// parity names it unambiguously. (At the end of a launch that did not abort up to ns copies may still be in flight:
// the consumers wait for them too, so this only adds waits that end as they land.)
__device__ __forceinline__ void drain_copies(SmemHeader& hdr, const LoaderExit& e, int ns, uint32_t* ctrs) {
  const int n = min(e.issued, ns);
  for (int i = 1; i <= n; ++i) {
    int s = e.slot - i;
    uint32_t p = e.phase;
    if (s < 0) {
      s += ns;
      p ^= 1u;
    }
    mbar_wait(&hdr.full[s], p, ctrs, kSiteFull, false);
  }
}

template <bool kTP, bool kFp8, bool kMoe>
__device__ void run_loader(const ModelArgs& m, const StepArgs& step, SmemHeader& hdr, uint8_t* ring) {
  const LoaderExit e = stream_chunks<kTP, kFp8, kMoe>(m, step, hdr, ring);
  drain_copies(hdr, e, static_cast<int>(m.num_slots), m.counters);
}

}  // namespace kog
