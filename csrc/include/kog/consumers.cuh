// The consumer warps (kConsumerWarps): the step flow of a launch, token by token and layer by layer. Each step is a
// device function of layer_stages.cuh (a layer's stages), token_select.cuh (LM head to the grid's best key) or
// token_stages.cuh (around the layers); all inline into this one function.
//
// Where the cuts are: NVVM simplifies each function on its own before inlining it, so a cut can change the code of
// the whole kernel, the loader's included. These cuts leave every kernel's SASS as the one-function run_consumers
// had it (compared instruction by instruction); what stays here for that: the schedule position (the ring slot of
// the block's next chunk, the base of the next stage: schedule.cuh; each stage's chunks are found before the stage
// and the base advanced after it, whether the block owns any), the layer's pointers (the attention's tagged-word
// pointers from plain locals), and the finisher's token publish (its cancel / defer flags feed one expression).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/attention.cuh"
#include "kog/burst_sampling.cuh"
#include "kog/config.cuh"
#include "kog/consume_stage.cuh"
#include "kog/consumer_state.cuh"
#include "kog/layer_stages.cuh"
#include "kog/lm_head.cuh"
#include "kog/moe_stages.cuh"
#include "kog/philox.cuh"
#include "kog/schedule.cuh"
#include "kog/smem_header.cuh"
#include "kog/sync.cuh"
#include "kog/tagged.cuh"
#include "kog/token_select.cuh"
#include "kog/token_stages.cuh"
#include "kog/tp.cuh"

namespace kog {

// x_s and work: the work area (after the header); ring_base: the ring of weight slots; epoch0: the counters' epoch
// at the launch's start.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void run_consumers(const ModelArgs& m, const StepArgs& step, SmemHeader& hdr, bf16* x_s, float* work,
                              uint8_t* ring_base, uint32_t epoch0) {
  const Consumers<D, HP, kSampled, kTP, kFp8, kMoe> c(m, step, hdr, x_s, work, ring_base, epoch0);
  Ring ring{c.ring_base, c.num_slots, 0, 0u, 0, c.slot_bytes};
  int base = 0;
  constexpr bool tagged_qkv = tagged_attention_chain<kTP>();
  constexpr bool tagged_attn = tagged_attn_output<kTP>();
  const int I = c.I, nh = c.nh, nkv = c.nkv;  // (as locals: the tagged-word pointers below are built from them)
  int ntok = 0;
  for (int t = 0; t < step.num_tokens; ++t) {
    const TokenStep tk = begin_token(c, t);
    AttnTask task{};  // (a local of its own: attention_task takes it by reference)
    if (c.has_task) plan_attention_split(c, tk, task);

    for (int l = 0; l < c.L; ++l) {
      layer_table_to_smem(c, l);
      const LayerArgs& La = hdr.lay[l & 1];
      const LayerArgs* prev = l > 0 ? &hdr.lay[(l - 1) & 1] : nullptr;
      const bf16* rin = l == 0 ? tk.emb : prev->rin_next;
      uint32_t* const tagged_l = m.act_tagged + static_cast<int64_t>(l) * tagged_layer_words(I, nh, nkv, D);
      const LayerStep ly{l, La, prev, rin, tagged_l};

      int qkv_mine, gu_mine;  // chunks this block owns in the QKV / gate/up stage of this layer
      {  // QKV projection of rmsnorm(residual)
        const int c0 = first_chunk(c.b, base, c.G);
        qkv_mine = chunks_owned(c0, static_cast<int>(c.n_qkv), c.G);
        if (qkv_mine > 0) qkv_stage(c, ring, tk, ly, c0, qkv_mine);
        base = (base + static_cast<int>(c.n_qkv)) % c.G;
      }
      if (c.has_task) {  // attention split (+ combine by the last split of the KV head)
        const uint32_t* const qkv_t = tagged_qkv ? tagged_l + I : nullptr;
        uint32_t* const attn_t = tagged_attn ? tagged_l + I + (nh + 2 * nkv) * D : nullptr;
        attention_stage(c, tk, task, ly, qkv_t, attn_t);
      }
      {  // O projection + residual
        const int c0 = first_chunk(c.b, base, c.G);
        const int mine = chunks_owned(c0, static_cast<int>(c.n_o), c.G);
        if (mine > 0) o_stage(c, ring, tk, ly, c0, mine, qkv_mine);
        base = (base + static_cast<int>(c.n_o)) % c.G;
      }
      if constexpr (kMoe) {  // router and route, the routed experts' gate/up, their down projections and sum
        int router_mine;
        {
          const int c0 = first_chunk(c.b, base, c.G);
          const int n = hdr.moe.router.chunks;
          router_mine = chunks_owned(c0, n, c.G);
          if (router_mine > 0) router_stage(c, ring, tk, ly, c0, router_mine);
          base = (base + n) % c.G;
        }
        {
          const int c0 = first_chunk(c.b, base, c.G);
          gu_mine = chunks_owned(c0, static_cast<int>(c.n_gu), c.G);
          if (gu_mine > 0) expert_gu_stage(c, ring, tk, ly, c0, gu_mine, router_mine);
          base = (base + static_cast<int>(c.n_gu)) % c.G;
        }
        {
          const int c0 = first_chunk(c.b, base, c.G);
          const int mine = chunks_owned(c0, static_cast<int>(c.n_down), c.G);
          if (mine > 0) expert_down_stage(c, ring, tk, ly, c0, mine, router_mine + gu_mine);
          base = (base + static_cast<int>(c.n_down)) % c.G;
        }
      } else {
        {  // gate/up of rmsnorm(o + rin), SiLU(gate) * up
          const int c0 = first_chunk(c.b, base, c.G);
          gu_mine = chunks_owned(c0, static_cast<int>(c.n_gu), c.G);
          if (gu_mine > 0) gate_up_stage(c, ring, tk, ly, c0, gu_mine);
          base = (base + static_cast<int>(c.n_gu)) % c.G;
        }
        {  // down projection + residual
          const int c0 = first_chunk(c.b, base, c.G);
          const int mine = chunks_owned(c0, static_cast<int>(c.n_down), c.G);
          if (mine > 0) down_stage(c, ring, tk, ly, c0, mine, gu_mine);
          base = (base + static_cast<int>(c.n_down)) % c.G;
        }
      }
    }

    {  // LM head over the logical vocabulary, then the token
      const int c0 = first_chunk(c.b, base, c.G);
      const int mine = chunks_owned(c0, static_cast<int>(c.n_lm), c.G);
      bf16* logits = step.logits_out != nullptr ? step.logits_out + static_cast<int64_t>(t) * step.logits_stride
                                                : m.logits_scratch;
      // kSampled (a separate instantiation, so the greedy kernel carries none of it): vLLM's Gumbel-max on this
      // token's logits (sampling.cuh), keyed by (seed, position of the token whose logits these are) as vLLM's
      // sampler keys it; the row key is the same for every row.
      const uint32_t rkey = kSampled ? rng::row_key(__ldg(step.sample_seed), tk.pos) : 0u;
      uint64_t best = 0;
      if (mine > 0) best = lm_head_stage(c, ring, tk, c0, logits, rkey);
      base = (base + static_cast<int>(c.n_lm)) % c.G;
      if constexpr (kSampled && !kTP) {
        if (c.filtered.on) best = filtered_draw(c, tk, c0, mine, logits, rkey);
      }
      if (block_best_to_grid(c, tk, best) && c.tid < 32) {  // the finisher's warp 0
        uint64_t k = grid_best_key(c);
        if (c.tid == 0) {
          if constexpr (kTP) k = tp_best_key(m, k, tk.e, c.tp.W, c.tp.rank, c.delta);
          // The host's cancel word: one PCIe round trip (~1-2 us) per token, by the finisher only, which publishes
          // its decision with the token. (Read by every block at the LM head's start, 132 reads of one host word
          // per token, the run-ahead launches ran ~0.1 ms per token slower.)
          const bool cancelled = !kTP && step.cancel != nullptr && ld_relaxed_sys_s64(step.cancel) >= step.cancel_id;
          int64_t id = static_cast<int64_t>(argmax_row(k));
          bool deferred = false;
          if constexpr (kSampled && !kTP) {
            if (c.filtered.on) {  // a winner not tagged sure (or none): vLLM's sampler draws this token on the host
              id = static_cast<int64_t>(burst::winner_col(k));
              deferred = !burst::winner_sure(k);
              if (deferred) step.defer_out[0] = 1;
            }
          }
          if constexpr (kSampled && !kTP) {
            if (c.penalized.on && !cancelled && !deferred) {  // released with the token below; only this thread writes
              uint32_t* n = reinterpret_cast<uint32_t*>(step.burst_counts) + id;
              *reinterpret_cast<volatile uint32_t*>(n) = ld_cg_u32(n) + 1u;
            }
          }
          // every block reads it after the token-ready wait; a negative token ends the launch
          step.tokens_out[t] = (cancelled || deferred) ? -1 - id : id;
          if (step.num_out != nullptr) step.num_out[0] = deferred ? t : t + 1;
          st_release(counter(c.ctrs, kCtrTokenReady), tk.next);
        }
      }
    }

    ntok = t + 1;
    if (t + 1 < step.num_tokens && token_stops(c, tk)) break;
  }
  finish_launch(c, ntok);
}

}  // namespace kog
