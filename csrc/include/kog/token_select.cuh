// The consumer warps' steps from the last layer to the token: final norm + LM head with this block's best key over
// its rows (greedy argmax key, or the sampled Gumbel-max key), the filtered draw (top-k / top-p / min-p:
// burst_sampling.cuh), the block's key to the grid, and in the block that arrives last on the LM counter (the
// finisher) the grid's best key. The finisher publishes the token (run_consumers, consumers.cuh).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/burst_sampling.cuh"
#include "kog/config.cuh"
#include "kog/consume_stage.cuh"
#include "kog/consumer_state.cuh"
#include "kog/gemv.cuh"
#include "kog/lm_head.cuh"
#include "kog/numerics.cuh"
#include "kog/penalties.cuh"
#include "kog/rmsnorm.cuh"
#include "kog/sampling.cuh"
#include "kog/sync.cuh"
#include "kog/tp.cuh"
#include "kog/trace.cuh"

namespace kog {

// The LM head over the logical vocabulary, this block's chunks c0, c0 + G, ... (`mine` > 0; the caller finds them
// and advances the schedule past the stage): final norm of the last layer's output, this block's rows of the token's
// logits (bf16, penalised in place with vLLM's penalties), and this thread's best key over its rows: greedy argmax,
// or vLLM's Gumbel-max draw (kSampled; 0 for a filtered draw, which ranks the rows once the grid's cut is known:
// filtered_draw). rkey: the sampler's row key of the token.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ uint64_t lm_head_stage(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, Ring& ring,
                                                  const TokenStep& tk, int c0, bf16* logits, uint32_t rkey) {
  using C = MonoConfig;
  const ModelArgs& m = c.m;
  const StepArgs& step = c.step;
  SmemHeader& hdr = c.hdr;
  const int t = tk.t, L = c.L, H = c.H, W = c.tp.W;
  const LayerArgs& last = hdr.lay[(L - 1) & 1];
  uint64_t best = 0;
  consumer_wait(c.ctrs, layer_counter_index(L - 1, c.nkv, C::kStageDown), tk.next * c.n_down * c.tp.nw + c.fault_bias,
                kTP);
  rmsnorm_to_smem(c.x_s, kTP ? layer_parts(m, L - 1, kPartDown, W, H) : last.down_out, last.rmid,
                  hdr.hot.final_norm, H, c.eps, hdr.red_norm, W, H);
  if (c.tid == 0) c.tr.mark(t, L, kEvLmReady);
  const uint32_t row0 = static_cast<uint32_t>(m.vocab_start);  // keys carry global vocabulary ids
  consume_stage<false>(m, hdr, ring, c.x_s, C::kStageLM, c0, [&](int r, int, float v, float) {
    float lv = round_bf16(v);
    if constexpr (kSampled && !kTP) {
      // vLLM's penalties write the bf16 logits in place: the logits this launch keeps are the penalised ones
      if (c.penalized.on) lv = penalties::penalized(lv, static_cast<uint32_t>(r), c.pen);
    }
    st_bf16(logits, r, lv);
    uint64_t k;
    if constexpr (kSampled) {
      // (a filtered draw reads the row back once the grid's cut is known: filtered_draw)
      k = c.filtered.on ? 0 : sampling::sampled_key(lv, row0 + static_cast<uint32_t>(r), step.temperature, rkey);
    } else {
      k = argmax_key(lv, row0 + static_cast<uint32_t>(r));
    }
    best = k > best ? k : best;
  }, c.tr, t, L, -1);
  return best;
}

// top-k / top-p / min-p: burst_sampling.cuh's three steps over this block's rows of the logits (every block adds
// its rows to the grid's histogram; the last to arrive finds the cut and publishes it; every block then ranks its
// rows against the cut). c0, mine: the block's LM-head chunks (mine may be 0). Returns this thread's best key.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ uint64_t filtered_draw(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, const TokenStep& tk,
                                                  int c0, int mine, const bf16* logits, uint32_t rkey) {
  using C = MonoConfig;
  const ModelArgs& m = c.m;
  const StepArgs& step = c.step;
  SmemHeader& hdr = c.hdr;
  const int t = tk.t, G = c.G, tid = c.tid;
  const int nu_lm = hdr.geo[C::kStageLM].nu, rows = mine > 0 ? mine * nu_lm : 0;
  const int n_rows = hdr.geo[C::kStageLM].n;
  const auto row_of = [=](int k) { return owned_row(c0, k, nu_lm); };
  const burst::Filters f{step.temperature, step.top_p, step.min_p, step.top_k};
  const burst::BlockView sv = burst::BlockView::carve(reinterpret_cast<uint8_t*>(c.work), rows);
  const burst::GridView gv = burst::GridView::of(m.sample_work);
  burst::add_rows(logits, rows, n_rows, row_of, static_cast<uint32_t>(m.vocab_start), f, rkey, sv, gv);
  consumer_sync();  // every thread's adds before thread 0's release (cumulative)
  if (tid == 0) {
    const uint32_t old = atom_acq_rel_add(counter(c.ctrs, kCtrSampleArrive), 1u);
    hdr.bcast[2] = (old + 1u == static_cast<uint32_t>(t + 1) * static_cast<uint32_t>(G)) ? 1 : 0;
  }
  consumer_sync();
  burst::Cut cut;
  if (hdr.bcast[2] != 0) {  // the cutter: every block's adds are visible (its acquire, then the barrier)
    cut = burst::find_cut(f, sv, gv);
    if (tid == 0) gv.publish(cut);
    consumer_sync();  // the cutter's reads of the histogram and its stores before the release
    if (tid == 0) st_release(counter(c.ctrs, kCtrSampleReady), static_cast<uint32_t>(t + 1));
  } else {
    consumer_wait(c.ctrs, kCtrSampleReady, static_cast<uint32_t>(t + 1));
    cut = gv.published();
  }
  burst::zero_hist_share(gv);
  return burst::thread_best(sv, rows, row_of, static_cast<uint32_t>(m.vocab_start), cut, gv);
}

// The block's best key to the grid (argmax_slots[b]), then one add to the LM counter: true in the block whose add
// completes the token's count (the finisher).
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ bool block_best_to_grid(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, const TokenStep& tk,
                                                   uint64_t best) {
  using C = MonoConfig;
  SmemHeader& hdr = c.hdr;
  const int t = tk.t, L = c.L;
  best = consumer_max_key(best, hdr.keys);
  if (c.tid == 0) {
    hdr.hot.argmax_slots[c.b] = best;
    const uint32_t old = atom_acq_rel_add(counter(c.ctrs, kCtrLM), 1u);
    hdr.released = hand_off_seq(t, L, C::kStageLM, L);  // (also when this block owned no LM chunk: harmless)
    hdr.bcast[1] = (old + 1u == tk.next * static_cast<uint32_t>(c.G)) ? 1 : 0;
    c.tr.mark(t, L, kEvLmDone);
  }
  consumer_sync();
  return hdr.bcast[1] != 0;
}

// Run by the finisher's warp 0: the grid's best key.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ uint64_t grid_best_key(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c) {
  uint64_t k = grid_max_key(c.hdr.hot.argmax_slots, c.G);
  if constexpr (kSampled && !kTP) {
    if (c.filtered.on) {  // the split level's rows, ranked by column (burst_sampling.cuh), gathered into the work
                          // area: this block's rows there are done with (its best is in)
      const burst::GridView gv = burst::GridView::of(c.m.sample_work);
      k = burst::resolve_split(k, gv.published(), gv, reinterpret_cast<uint64_t*>(c.work));
    }
  }
  return k;
}

}  // namespace kog
