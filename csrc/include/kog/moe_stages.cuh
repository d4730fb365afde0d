// The consumer warps' steps of a mixture-of-experts layer's MLP (the MoE kernel instantiation; docs/moe.md), in place
// of layer_stages.cuh's gate/up and down, in schedule order after the O projection:
//   router      logits = bf16(router @ x), x = rmsnorm(o + rin); the stage's last block routes (moe_route.cuh) and
//               publishes the k experts and weights (ModelArgs::moe_route), which the loaders wait for
//   expert_gu   act[slot * I + j] = bf16(bf16(silu(gate)) * up) of the slot's expert (vLLM's silu_and_mul op), nu
//               row pairs per chunk
//   expert_down every slot's row of w2 for nu / k output rows per chunk: y_s = bf16(fp32 dot * weight_s), the slots'
//               sum in slot order in fp32 rounded once (vLLM's moe_sum), down_out = that sum, rin_next =
//               bf16(sum + rmid): the dense layer's outputs, so the next layer and the LM head read them unchanged
// The reference is kog_backend/monokernel/moe_reference.py (moe_step's numerics, chunk by chunk in this schedule).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/config.cuh"
#include "kog/consume_stage.cuh"
#include "kog/consumer_state.cuh"
#include "kog/moe_route.cuh"
#include "kog/numerics.cuh"
#include "kog/rmsnorm.cuh"
#include "kog/sync.cuh"
#include "kog/trace.cuh"

namespace kog {

// Counter indices of layer l's router stage: its chunks (all blocks) and its published route (one per token).
__device__ __forceinline__ int moe_router_counter(const MoeHot& mo, int l) { return mo.ctr_base + 2 * l; }
__device__ __forceinline__ int moe_route_counter(const MoeHot& mo, int l) { return mo.ctr_base + 2 * l + 1; }

// The route's scratch: the block's residual rows (free between the O stage's epilogue and the down stage's gather).
static_assert(kMoeMaxExperts <= MonoConfig::kMaxResidRows, "the route's probabilities fit SmemHeader::resid");

// x_s = rmsnorm(o + rin) with the post-attention norm, once the O stage is complete (the router's and the experts'
// input, as the dense gate/up stage's).
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void moe_input_to_smem(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c,
                                                  const TokenStep& tk, const LayerStep& ly) {
  consumer_wait(c.ctrs, layer_counter_index(ly.l, c.nkv, MonoConfig::kStageO), tk.next * c.n_o);
  rmsnorm_to_smem(c.x_s, ly.La.o_out, ly.rin, ly.La.post_norm, c.H, c.eps, c.hdr.red_norm);
}

// The router GEMV over this block's chunks (`mine` > 0 of them), then the stage's count; the block whose count
// completes the stage routes. Leaves x_s as the experts' input.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void router_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, Ring& ring,
                                             const TokenStep& tk, const LayerStep& ly, int c0, int mine) {
  SmemHeader& hdr = c.hdr;
  const MoeHot& mo = hdr.moe;
  const int l = ly.l;
  moe_input_to_smem(c, tk, ly);
  bf16* const logits = mo.logits + static_cast<size_t>(l) * mo.experts;
  consume_chunks<false>(c.m, hdr, ring, c.x_s, mo.router, c0, [=](int r, int, float v, float) {
    st_bf16(logits, r, v);
  }, c.tr, tk.t, l, -1);
  // Every thread's logits before thread 0's count (acq_rel: the last block's acquire covers every block's writes).
  consumer_sync();
  if (c.tid == 0) {
    const uint32_t n = static_cast<uint32_t>(mo.router.chunks);
    const uint32_t old = atom_acq_rel_add(counter(c.ctrs, moe_router_counter(mo, l)), static_cast<uint32_t>(mine));
    hdr.bcast[0] = old + static_cast<uint32_t>(mine) == tk.next * n ? 1 : 0;
  }
  consumer_sync();
  if (hdr.bcast[0] != 0) {  // (the same value in every thread: read after the barrier)
    if (c.tid < 32) {
      int32_t* const route = mo.route + static_cast<size_t>(l) * 2 * kMoeMaxTopK;
      moe_route_warp(reinterpret_cast<const uint16_t*>(logits), mo.experts, mo.top_k, mo.norm_topk != 0, route,
                     reinterpret_cast<float*>(route + kMoeMaxTopK), hdr.resid, hdr.moe.weights);
      // Lane 0 wrote the route: its release publishes it to the loaders and the down stages.
      if (c.tid == 0) st_release(counter(c.ctrs, moe_route_counter(mo, l)), tk.next);
    }
    // The route's scratch (resid, moe.weights) is the down stage's: no warp goes on before warp 0 is done with it.
    consumer_sync();
  }
}

// The routed experts' gate/up (this block's `mine` > 0 chunks): act[slot * I + j] = bf16(silu(gate) * up).
// router_mine: the block's router chunks (x_s then holds the input already).
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void expert_gu_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, Ring& ring,
                                                const TokenStep& tk, const LayerStep& ly, int c0, int mine,
                                                int router_mine) {
  using C = MonoConfig;
  const int t = tk.t, l = ly.l;
  if (router_mine == 0) moe_input_to_smem(c, tk, ly);
  if (c.tid == 0) c.tr.mark(t, l, kEvGuReady);
  bf16* const act = ly.La.act;
  consume_stage<true>(c.m, c.hdr, ring, c.x_s, C::kStageGU, c0, [=](int r, int, float vg, float vu) {
    // vLLM's silu_and_mul op (the fused MoE's activation): silu rounded to bf16, times up, rounded again.
    const float gt = round_bf16(vg), up = round_bf16(vu);
    st_bf16(act, r, __fmul_rn(round_bf16(__fdiv_rn(gt, 1.f + expf(-gt))), up));
  }, c.tr, t, l, kEvGuLanded);
  consumer_signal(c.ctrs, layer_counter_index(l, c.nkv, C::kStageGU), static_cast<uint32_t>(mine));
  c.handed_off(t, l, C::kStageGU, kEvGuDone);
}

// The routed experts' down projections and their sum (this block's `mine` > 0 chunks): unit r = row * k + slot.
// The k units of a row are k consecutive lanes of one warp in the batched epilogue (nu = R k units per chunk, k a
// power of two, and every unit valid: N = k H, R | H): they meet by shuffles, and the row's slot-0 lane adds them in
// slot order and the residual.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void expert_down_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, Ring& ring,
                                                  const TokenStep& tk, const LayerStep& ly, int c0, int mine,
                                                  int earlier_mine) {
  using C = MonoConfig;
  const int t = tk.t, l = ly.l, H = c.H;
  SmemHeader& hdr = c.hdr;
  const MoeHot& mo = hdr.moe;
  const int k = mo.top_k, log2k = mo.log2_top_k;
  const LayerArgs& La = ly.La;
  // rmid is complete with the O stage (waited for by this block's router or gate/up stage, or here).
  if (earlier_mine == 0) consumer_wait(c.ctrs, layer_counter_index(l, c.nkv, C::kStageO), tk.next * c.n_o);
  gather_rows(hdr.resid, La.rmid, c0, mine, hdr.geo[C::kStageDown].nu >> log2k, H);
  // The route's weights (published before any gate/up chunk could stream: the wait is already satisfied), then every
  // slot's act; copy_to_smem's barrier publishes both.
  if (c.tid == 0) spin_until(c.ctrs, moe_route_counter(mo, l), tk.next, false);
  consumer_wait(c.ctrs, layer_counter_index(l, c.nkv, C::kStageGU), tk.next * c.n_gu);
  if (c.tid < k) {
    const int32_t* route = mo.route + static_cast<size_t>(l) * 2 * kMoeMaxTopK;
    hdr.moe.weights[c.tid] = __uint_as_float(ld_cg_u32(reinterpret_cast<const uint32_t*>(route + kMoeMaxTopK) + c.tid));
  }
  copy_to_smem(c.x_s, La.act, c.I);
  if (c.tid == 0) c.tr.mark(t, l, kEvDownReady);
  bf16* const down_out = La.down_out;
  bf16* const rin_next = La.rin_next;
  const float* const resid = hdr.resid;
  const float* const weights = hdr.moe.weights;
  consume_chunks<false, false, true>(c.m, hdr, ring, c.x_s, hdr.geo[C::kStageDown], c0,
                                     [=](int r, int kk, float v, float) {
    const int s = r & (k - 1);
    const float y = round_bf16(v * weights[s]);
    const int lane = static_cast<int>(threadIdx.x & 31), first = lane & ~(k - 1);
    const unsigned group = (k == 32 ? 0xffffffffu : ((1u << k) - 1u)) << first;
    // vLLM's moe_sum: the k bf16 slot outputs added in fp32 in slot order, rounded once.
    float sum = __shfl_sync(group, y, first);
    for (int q = 1; q < k; ++q) sum += __shfl_sync(group, y, first + q);
    if (s == 0) {
      const int row = r >> log2k;
      const float o = round_bf16(sum);
      st_bf16(down_out, row, o);
      st_bf16(rin_next, row, o + resid[kk >> log2k]);
    }
  }, c.tr, t, l, kEvDownLanded, kFp8None, nullptr, log2k);
  consumer_signal(c.ctrs, layer_counter_index(l, c.nkv, C::kStageDown), static_cast<uint32_t>(mine));
  c.handed_off(t, l, C::kStageDown, kEvDownDone);
}

}  // namespace kog
