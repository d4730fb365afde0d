// The consumer warps' steps of one decoder layer, in schedule order: the layer's table into shared memory, QKV
// projection of rmsnorm(residual), attention split (+ combine), O projection + residual, gate/up of
// rmsnorm(o + residual) with SiLU(gate) * up, down projection + residual. Each stage consumes this block's chunks of
// its weight matrix (consume_stage.cuh) after waiting only for the data it reads (docs/monokernel.md), then hands
// its output off (a counter release, or tagged words: tagged.cuh).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/attention.cuh"
#include "kog/config.cuh"
#include "kog/consume_stage.cuh"
#include "kog/consumer_state.cuh"
#include "kog/diagnostics.cuh"
#include "kog/handoff_hold.cuh"
#include "kog/numerics.cuh"
#include "kog/rmsnorm.cuh"
#include "kog/sync.cuh"
#include "kog/tagged.cuh"
#include "kog/tp.cuh"
#include "kog/trace.cuh"

namespace kog {

// Layer l's table into shared memory, SmemHeader::lay[l & 1] (the previous layer's stays in the other slot): the stage
// prologues read its pointers right after their waits, whose acquire invalidates L1, so from the global table each
// read would be an L2 round trip before the hand-off's data loads could even be issued.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void layer_table_to_smem(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, int l) {
  SmemHeader& hdr = c.hdr;
  const int tid = c.tid;
  // The barrier first: every thread is past its reads of layer l - 2's copy. Warp 1 copies while thread 0 already
  // spins on the QKV stage's wait; that wait's barrier (or the one below at l == 0, which has no wait) publishes the
  // copy.
  consumer_sync();
  if (tid >= 32 && tid < 32 + kLayerArgsWords) {
    reinterpret_cast<uint64_t*>(&hdr.lay[l & 1])[tid - 32] =
        __ldg(reinterpret_cast<const uint64_t*>(hdr.hot.layers + l) + (tid - 32));
  }
  if constexpr (kFp8) {  // and its FP8 scale pointers (Fp8LayerScales: 4 words)
    constexpr int kWords = static_cast<int>(sizeof(Fp8LayerScales) / 8);
    static_assert(kLayerArgsWords + kWords <= 32, "warp 1 copies both tables");
    if (tid >= 32 + kLayerArgsWords && tid < 32 + kLayerArgsWords + kWords) {
      const int i = tid - 32 - kLayerArgsWords;
      reinterpret_cast<uint64_t*>(&hdr.fp8_lay[l & 1])[i] =
          __ldg(reinterpret_cast<const uint64_t*>(c.m.fp8_scales + l) + i);
    }
  }
  if (l == 0) consumer_sync();
}

// Layer l's FP8 scale pointers (copied with its table); a bf16 kernel reads none (nulls, no load).
template <bool kFp8>
__device__ __forceinline__ Fp8LayerScales fp8_scale(const SmemHeader& hdr, int l) {
  if constexpr (kFp8) return hdr.fp8_lay[l & 1];
  return Fp8LayerScales{nullptr, nullptr, nullptr, nullptr};
}

// The stages below run this block's chunks of their weight matrix: c0, c0 + G, ... (`mine` of them, > 0); the
// caller finds them and advances the schedule's base past the stage (schedule.cuh), whether the block owns any.

// QKV projection of rmsnorm(residual): the residual is the embedding row at layer 0, else the previous layer's
// down output + rmid (under TP: the sum of every rank's down partials). Output qkv_out (bf16 [(nh + 2 nkv) D]),
// and its tagged words in a TP = 1 kernel.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void qkv_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, Ring& ring, const TokenStep& tk,
                                          const LayerStep& ly, int c0, int mine) {
  using C = MonoConfig;
  constexpr bool tagged_qkv = tagged_attention_chain<kTP>();
  const int t = tk.t, l = ly.l, H = c.H, W = c.tp.W;
  const LayerArgs& La = ly.La;
  if (l == 0) {
    c.fill_x(C::kStageQKV, l, [&](auto f16) {
      return rmsnorm_to_smem<decltype(f16)::value>(c.x_s, nullptr, tk.emb, La.input_norm, H, c.eps, c.hdr.red_norm);
    });
  } else {
    consumer_wait(c.ctrs, layer_counter_index(l - 1, c.nkv, C::kStageDown), tk.next * c.n_down * c.tp.nw, kTP);
    c.fill_x(C::kStageQKV, l, [&](auto f16) {
      return rmsnorm_to_smem<decltype(f16)::value>(c.x_s, kTP ? layer_parts(c.m, l - 1, kPartDown, W, H)
                                                               : ly.prev->down_out,
                                                   ly.prev->rmid, La.input_norm, H, c.eps, c.hdr.red_norm, W, H);
    });
  }
  if (c.tid == 0) c.tr.mark(t, l, kEvQkvReady);
  bf16* const qkv_out = La.qkv_out;
  // Qwen2's bias joins the fp32 sum before the one bf16 rounding (as cuBLAS's bias epilogue in stock);
  // null for Llama / Qwen3 / Mistral.
  const bf16* const qkv_bias = La.qkv_bias;
  if constexpr (tagged_qkv) {
    uint32_t* const qkv_t = ly.tagged_l + c.I;
    const uint32_t tag = handoff_tag(tk.e);
    consume_stage<false, kFp8>(c.m, c.hdr, ring, c.x_s, C::kStageQKV, c0, [=](int r, int, float v, float) {
      if (qkv_bias != nullptr) v += bf2f(reinterpret_cast<const uint16_t*>(qkv_bias)[r]);
      st_bf16(qkv_out, r, v);
      st_relaxed_u32(qkv_t + r, tagged_word(tag, v));
    }, c.tr, t, l, kEvQkvLanded, c.fp8_mode, fp8_scale<kFp8>(c.hdr, l).qkv, c.fp8_gemv);
    // The attention splits poll the words: no release.
    consumer_signal_relaxed(c.ctrs, layer_counter_index(l, c.nkv, C::kStageQKV), static_cast<uint32_t>(mine));
  } else {
    consume_stage<false, kFp8>(c.m, c.hdr, ring, c.x_s, C::kStageQKV, c0, [=](int r, int, float v, float) {
      if (qkv_bias != nullptr) v += bf2f(reinterpret_cast<const uint16_t*>(qkv_bias)[r]);
      st_bf16(qkv_out, r, v);
    }, c.tr, t, l, kEvQkvLanded, c.fp8_mode, fp8_scale<kFp8>(c.hdr, l).qkv, c.fp8_gemv);
    consumer_signal<kRelaxQKV>(c.ctrs, layer_counter_index(l, c.nkv, C::kStageQKV), static_cast<uint32_t>(mine));
  }
  c.handed_off(t, l, C::kStageQKV, kEvQkvDone);
}

// This block's attention split of the layer (+ the combine, by the last split of the KV head to finish):
// attention.cuh. Run by the blocks with a split (Consumers::has_task) only; it streams no weights. qkv_t / attn_t:
// the layer's tagged q / k / v and attention-output words (null where the chain goes through counters).
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void attention_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, const TokenStep& tk,
                                                const AttnTask& task, const LayerStep& ly, const uint32_t* qkv_t,
                                                uint32_t* attn_t) {
  using C = MonoConfig;
  constexpr bool tagged_qkv = tagged_attention_chain<kTP>();
  constexpr bool tagged_attn = tagged_attn_output<kTP>();
  const int t = tk.t, l = ly.l, nkv = c.nkv;
  if (!tagged_qkv) consumer_wait(c.ctrs, layer_counter_index(l, nkv, C::kStageQKV), tk.next * c.n_qkv);
  if (c.tid == 0) c.tr.mark(t, l, kEvAttnReady);
  attention_task<D, HP, tagged_attn>(c.hdr.hot, ly.La, task, tk.pos, tk.slot, c.step.block_table,
                                     c.step.block_table_len, c.hdr.bt, c.work, c.hdr.bcast, c.ctrs,
                                     layer_counter_index(l, nkv, kCtrAttnKV + task.kvh),
                                     layer_counter_index(l, nkv, kCtrAttnDone), tk.e, qkv_t, attn_t, c.tr, t, l);
  c.handed_off(t, l, kHandoffAttn, kEvAttnDone);
}

// O projection of the attention output, + the residual: o_out = bf16(o), rmid = bf16(o + rin) (under TP: this
// rank's partial o to every rank's layer_parts, which the gate/up and down stages sum). qkv_mine: the block's
// chunks of this layer's QKV stage.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void o_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, Ring& ring, const TokenStep& tk,
                                        const LayerStep& ly, int c0, int mine, int qkv_mine) {
  using C = MonoConfig;
  constexpr bool tagged_attn = tagged_attn_output<kTP>();
  const int t = tk.t, l = ly.l, H = c.H, W = c.tp.W, nkv = c.nkv, nh = c.nh;
  const LayerArgs& La = ly.La;
  SmemHeader& hdr = c.hdr;
  // The residual rows first: they are ready before attention is (layer input), so their round trip
  // leaves the critical path. rin is complete once the previous layer's down stage is (this block waited
  // for it in its QKV stage, or waits here: then already satisfied in practice).
  if (l > 0 && qkv_mine == 0) {
    consumer_wait(c.ctrs, layer_counter_index(l - 1, nkv, C::kStageDown), tk.next * c.n_down * c.tp.nw, kTP);
  }
  if (!kTP) {
    gather_rows(hdr.resid, ly.rin, c0, mine, hdr.geo[C::kStageO].nu, H);
  } else if (l > 0) {  // this rank's copy of rin = bf16(allreduce(down partials) + rmid), for GU and down
    sum_rows_to(ly.prev->rin_next, layer_parts(c.m, l - 1, kPartDown, W, H), W, ly.prev->rmid, c0, mine,
                hdr.geo[C::kStageO].nu, H);
  }
  if constexpr (tagged_attn) {
    c.fill_x(C::kStageO, l, [&](auto f16) {
      return tagged_to_smem<decltype(f16)::value>(c.x_s, ly.tagged_l + c.I + (nh + 2 * nkv) * D, nh * D,
                                                  handoff_tag(tk.e), c.ctrs);
    });
  } else {
    consumer_wait(c.ctrs, layer_counter_index(l, nkv, kCtrAttnDone), tk.next * static_cast<uint32_t>(nkv));
    c.fill_x(C::kStageO, l,
             [&](auto f16) { return copy_to_smem<decltype(f16)::value>(c.x_s, La.attn_out, nh * D); });
  }
  if (c.tid == 0) c.tr.mark(t, l, kEvOReady);
  bf16* const o_out = La.o_out;
  bf16* const rmid = La.rmid;
  const float* const resid = hdr.resid;
  bf16* const part = layer_parts(c.m, l, kPartO, W, H) + static_cast<size_t>(c.tp.rank) * H;
  const int64_t* const delta = c.delta;
  consume_stage<false, kFp8>(c.m, hdr, ring, c.x_s, C::kStageO, c0, [=](int r, int k, float v, float) {
    const float o = round_bf16(v);
    if constexpr (kTP) {
      push_partial(part, r, o, W, delta);
    } else {
      st_bf16(o_out, r, o);
      st_bf16(rmid, r, o + resid[k]);
    }
  }, c.tr, t, l, kEvOLanded, c.fp8_mode, fp8_scale<kFp8>(c.hdr, l).o_proj, c.fp8_gemv);
  if (kTP) {
    consumer_signal_ranks(c.ctrs, layer_counter_index(l, nkv, C::kStageO), static_cast<uint32_t>(mine), W, delta);
  } else {
    consumer_signal<kRelaxO>(c.ctrs, layer_counter_index(l, nkv, C::kStageO), static_cast<uint32_t>(mine));
  }
  c.handed_off(t, l, C::kStageO, kEvODone);
}

// gate/up of rmsnorm(o + rin): act = bf16(SiLU(gate) * up) (bf16 [I]), and its tagged words when the gate/up ->
// down hand-off goes through them (Consumers::tagged_gu).
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void gate_up_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, Ring& ring,
                                              const TokenStep& tk, const LayerStep& ly, int c0, int mine) {
  using C = MonoConfig;
  const int t = tk.t, l = ly.l, H = c.H, W = c.tp.W, nkv = c.nkv;
  const LayerArgs& La = ly.La;
  consumer_wait(c.ctrs, layer_counter_index(l, nkv, C::kStageO), tk.next * c.n_o * c.tp.nw, kTP);
  c.fill_x(C::kStageGU, l, [&](auto f16) {
    return rmsnorm_to_smem<decltype(f16)::value>(c.x_s, kTP ? layer_parts(c.m, l, kPartO, W, H) : La.o_out, ly.rin,
                                                 La.post_norm, H, c.eps, c.hdr.red_norm, W, H);
  });
  if (c.tid == 0) c.tr.mark(t, l, kEvGuReady);
  bf16* const act = La.act;
  auto silu_mul = [](float vg, float vu) {
    const float gt = round_bf16(vg), up = round_bf16(vu);
    return __fmul_rn(__fdiv_rn(gt, 1.f + expf(-gt)), up);
  };
  if (c.tagged_gu.on) {  // (a loop of its own: the default loop keeps its register budget)
    uint32_t* const act_t = ly.tagged_l;
    const uint32_t tag = handoff_tag(tk.e);
    consume_stage<true, kFp8>(c.m, c.hdr, ring, c.x_s, C::kStageGU, c0, [=](int r, int, float vg, float vu) {
      const float a = silu_mul(vg, vu);
      st_bf16(act, r, a);
      st_relaxed_u32(act_t + r, tagged_word(tag, a));
    }, c.tr, t, l, kEvGuLanded, c.fp8_mode, fp8_scale<kFp8>(c.hdr, l).gate_up, c.fp8_gemv);
    // No release: the down stage reads the tagged words, not this counter.
    consumer_signal_relaxed(c.ctrs, layer_counter_index(l, nkv, C::kStageGU), static_cast<uint32_t>(mine));
  } else {
    consume_stage<true, kFp8>(c.m, c.hdr, ring, c.x_s, C::kStageGU, c0, [=](int r, int, float vg, float vu) {
      st_bf16(act, r, silu_mul(vg, vu));
    }, c.tr, t, l, kEvGuLanded, c.fp8_mode, fp8_scale<kFp8>(c.hdr, l).gate_up, c.fp8_gemv);
    consumer_signal<kRelaxGU>(c.ctrs, layer_counter_index(l, nkv, C::kStageGU), static_cast<uint32_t>(mine));
  }
  c.handed_off(t, l, C::kStageGU, kEvGuDone);
}

// down projection of act, + the residual: down_out = bf16(d), rin_next = bf16(d + rmid), the next layer's input
// (under TP: this rank's partial d to every rank's layer_parts, which the next QKV and O stages sum). gu_mine: the
// block's chunks of this layer's gate/up stage.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void down_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, Ring& ring, const TokenStep& tk,
                                           const LayerStep& ly, int c0, int mine, int gu_mine) {
  using C = MonoConfig;
  const int t = tk.t, l = ly.l, H = c.H, W = c.tp.W, nkv = c.nkv;
  const LayerArgs& La = ly.La;
  SmemHeader& hdr = c.hdr;
  // rmid is complete with the O stage (this block waited for it in its gate/up stage, or waits here).
  if (gu_mine == 0) consumer_wait(c.ctrs, layer_counter_index(l, nkv, C::kStageO), tk.next * c.n_o * c.tp.nw, kTP);
  if (kTP) {  // this rank's copy of rmid = bf16(allreduce(O partials) + rin), for the next QKV / O
    sum_rows_to(La.rmid, layer_parts(c.m, l, kPartO, W, H), W, ly.rin, c0, mine, hdr.geo[C::kStageDown].nu, H);
  } else {
    gather_rows(hdr.resid, La.rmid, c0, mine, hdr.geo[C::kStageDown].nu, H);
  }
  if (c.tagged_gu.on) {
    c.fill_x(C::kStageDown, l, [&](auto f16) {
      return tagged_to_smem<decltype(f16)::value>(c.x_s, ly.tagged_l, c.I, handoff_tag(tk.e), c.ctrs);
    });
  } else {
    consumer_wait(c.ctrs, layer_counter_index(l, nkv, C::kStageGU), tk.next * c.n_gu);
    c.fill_x(C::kStageDown, l, [&](auto f16) { return copy_to_smem<decltype(f16)::value>(c.x_s, La.act, c.I); });
  }
  if (c.tid == 0) c.tr.mark(t, l, kEvDownReady);
  bf16* const down_out = La.down_out;
  bf16* const rin_next = La.rin_next;
  const float* const resid = hdr.resid;
  bf16* const part = layer_parts(c.m, l, kPartDown, W, H) + static_cast<size_t>(c.tp.rank) * H;
  const int64_t* const delta = c.delta;
  consume_stage<false, kFp8>(c.m, hdr, ring, c.x_s, C::kStageDown, c0, [=](int r, int k, float v, float) {
    const float d = round_bf16(v);
    if constexpr (kTP) {
      push_partial(part, r, d, W, delta);
    } else {
      st_bf16(down_out, r, d);
      st_bf16(rin_next, r, d + resid[k]);
    }
  }, c.tr, t, l, kEvDownLanded, c.fp8_mode, fp8_scale<kFp8>(c.hdr, l).down, c.fp8_gemv);
  if (kTP) {
    consumer_signal_ranks(c.ctrs, layer_counter_index(l, nkv, C::kStageDown), static_cast<uint32_t>(mine), W, delta);
  } else {
    consumer_signal<kRelaxDown>(c.ctrs, layer_counter_index(l, nkv, C::kStageDown), static_cast<uint32_t>(mine));
  }
  c.handed_off(t, l, C::kStageDown, kEvDownDone);
}

}  // namespace kog
