// The persistent decode kernel: one block per SM, one launch per step (or per K tokens), no grid barrier.
//
// Every block walks the same static schedule: per layer QKV -> attention split -> O -> gate/up -> down, then the
// LM head and greedy argmax. Chunk c of a stage belongs to block (base + c) % grid, where base is the number of
// chunks of all earlier stages of the step (mod grid), so every block streams the same number of bytes +-1 chunk.
// The loader warp streams this block's weight chunks into a ring of shared-memory slots, in schedule order and
// independently of any data dependency: it runs up to num_slots chunks ahead, across stage and layer boundaries,
// while the consumer warps wait for their inputs. A consumer stage waits only on the counter of the data it
// reads (docs/monokernel.md: epochs, acquire/release and why no counter is ever reset), or, on the attention chain
// (QKV -> attention -> O, by default), polls the data itself as tagged words (tagged.cuh).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/attention.cuh"
#include "kog/burst_sampling.cuh"
#include "kog/config.cuh"
#include "kog/consume_stage.cuh"
#include "kog/gemv.cuh"
#include "kog/handoff_hold.cuh"
#include "kog/lm_head.cuh"
#include "kog/loader.cuh"
#include "kog/numerics.cuh"
#include "kog/penalties.cuh"
#include "kog/rmsnorm.cuh"
#include "kog/sampling.cuh"
#include "kog/schedule.cuh"
#include "kog/smem_header.cuh"
#include "kog/sync.cuh"
#include "kog/tagged.cuh"
#include "kog/tp.cuh"
#include "kog/trace.cuh"

namespace kog {

template <int D, int HP, bool kSampled, bool kTP>
__device__ void run_consumers(const ModelArgs& m, const StepArgs& step, SmemHeader& hdr, bf16* x_s, float* work,
                              uint8_t* ring_base, uint32_t epoch0) {
  using C = MonoConfig;
  const int G = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
  const int L = static_cast<int>(m.num_layers), H = static_cast<int>(m.hidden);
  const int nh = static_cast<int>(m.num_heads), nkv = static_cast<int>(m.num_kv_heads);
  const int I = static_cast<int>(m.inter), S = static_cast<int>(m.num_splits), bs = static_cast<int>(m.block_size);
  const float eps = static_cast<float>(m.rms_eps);
  uint32_t* ctrs = m.counters;
  // Fault injection (ModelArgs::inject_fault, tests only): one wait whose target is never reached.
  const uint32_t fault_bias = m.inject_fault == 1 ? (1u << 30) : 0u;
  const uint32_t n_qkv = static_cast<uint32_t>(hdr.geo[C::kStageQKV].chunks);
  const uint32_t n_o = static_cast<uint32_t>(hdr.geo[C::kStageO].chunks);
  const uint32_t n_gu = static_cast<uint32_t>(hdr.geo[C::kStageGU].chunks);
  const uint32_t n_down = static_cast<uint32_t>(hdr.geo[C::kStageDown].chunks);
  const uint32_t n_lm = static_cast<uint32_t>(hdr.geo[C::kStageLM].chunks);

  Ring ring{ring_base, static_cast<int>(m.num_slots), 0, 0u, 0, static_cast<uint32_t>(m.slot_bytes)};
  int base = 0;
  const int64_t pos0 = step.positions[0];
  const bool filtered = kSampled && !kTP && step.filtered != 0;  // top-k / top-p / min-p (burst_sampling.cuh)
  const bool penalized = kSampled && !kTP && step.penalized != 0;  // repetition / frequency / presence (penalties.cuh)
  const penalties::Penalty pen{step.prompt_mask, step.output_counts, step.burst_counts, step.repetition_penalty,
                               step.frequency_penalty, step.presence_penalty};
  const bool has_task = has_attn_task(nkv, S);
  // gate/up -> down through tagged words instead of the gate/up counter (tagged.cuh; TP=1 only).
  const bool tagged_gu = C::kTaggedBuild && !kTP && (m.tagged_handoffs & kTaggedGateUp) != 0;
  // QKV -> attention and attention -> O through tagged words (tagged.cuh; TP=1 only): no release, no counter wait.
  constexpr bool tagged_qkv = tagged_attention_chain<kTP>();
  // (A diagnostics build without attention work writes no attention output: its O stage waits on counters.)
  constexpr bool tagged_attn = tagged_qkv && !diag::kNoAttn;

  const Tracer tr(m);
  // After a hand-off's release: its schedule position for the loader's hold (handoff_hold.cuh), its timeline mark.
  auto handed_off = [&](int t, int l, int st, int ev) {
    if (tid == 0) {
      hdr.released = hand_off_seq(t, l, st, L);
      tr.mark(t, l, ev);
    }
  };
  // Tensor parallelism (tp.cuh; a separate instantiation, so the TP=1 kernel carries none of it): W ranks; the
  // o / down counters then count every rank's chunks.
  constexpr bool tp = kTP;
  const int W = kTP ? static_cast<int>(m.tp_size) : 1, rank = kTP ? static_cast<int>(m.tp_rank) : 0;
  const uint32_t nw = static_cast<uint32_t>(W);
  const int64_t* const delta = hdr.tp_delta;
  int ntok = 0;
  for (int t = 0; t < step.num_tokens; ++t) {
    const uint32_t e = epoch0 + static_cast<uint32_t>(t);
    const uint32_t next = e + 1u;
    const int pos = static_cast<int>(pos0) + t;
    int64_t token;
    if (t == 0) {
      token = step.ids_int64 ? static_cast<const int64_t*>(step.input_ids)[0]
                             : static_cast<int64_t>(static_cast<const int32_t*>(step.input_ids)[0]);
    } else {
      token = static_cast<int64_t>(ld_cg_u64(step.tokens_out + t - 1));
    }
    int64_t slot;
    if (t == 0) {
      slot = step.slot_mapping[0];
    } else {
      slot = static_cast<int64_t>(__ldg(step.block_table + pos / bs)) * bs + pos % bs;
    }
    const bf16* emb = m.embed + token * H;

    AttnTask task{};
    if (has_task) {
      const int ctx = pos + 1;
      // Short contexts (ctx <= attn_single_ctx, a benchmark variant; 0: off): split 0 covers the whole context and
      // writes the final output, no partials and no combine (attention.cuh).
      task.single = ctx <= static_cast<int>(m.attn_single_ctx);
      const int s_eff = task.single ? 1 : S;
      const int len = (ctx + s_eff - 1) / s_eff;
      task.kvh = b / S;
      task.split = b - task.kvh * S;
      task.start = task.split * len;
      task.end = min(task.start + len, ctx);
      if (task.end < task.start) task.end = task.start;
      task.owner = task.start <= pos && pos < task.end;
      task.bt_count = -1;
      if (task.end > task.start) {
        const int first = task.start / bs, last = (task.end - 1) / bs;
        if (last - first + 1 <= C::kBtCacheEntries && last < step.block_table_len) {
          task.bt_first = first;
          task.bt_count = last - first + 1;
          for (int i = tid; i < task.bt_count; i += C::kConsumerThreads) hdr.bt[i] = __ldg(step.block_table + first + i);
        }
      }
      consumer_sync();
    }

    for (int l = 0; l < L; ++l) {
      // This layer's table into shared memory (the previous layer's stays in the other slot): the stage prologues
      // read its pointers right after their waits, whose acquire invalidates L1, so from the global table each
      // read would be an L2 round trip before the hand-off's data loads could even be issued. The barrier first:
      // every thread is past its reads of layer l - 2's copy. Warp 1 copies while thread 0 already spins on the
      // QKV stage's wait; that wait's barrier (or the one below at l == 0, which has no wait) publishes the copy.
      consumer_sync();
      if (tid >= 32 && tid < 32 + kLayerArgsWords) {
        reinterpret_cast<uint64_t*>(&hdr.lay[l & 1])[tid - 32] =
            __ldg(reinterpret_cast<const uint64_t*>(hdr.hot.layers + l) + (tid - 32));
      }
      if (l == 0) consumer_sync();
      const LayerArgs& La = hdr.lay[l & 1];
      const LayerArgs* prev = l > 0 ? &hdr.lay[(l - 1) & 1] : nullptr;
      const bf16* rin = l == 0 ? emb : prev->rin_next;
      // This layer's tagged words (tagged.cuh): act at +0, qkv_out at +I, attn_out at +I + (nh + 2 nkv) D.
      uint32_t* const tagged_l = m.act_tagged + static_cast<int64_t>(l) * tagged_layer_words(I, nh, nkv, D);

      int qkv_mine = 0, gu_mine = 0;  // chunks this block owns in the QKV / gate/up stage of this layer
      {  // QKV projection of rmsnorm(residual)
        const int c0 = first_chunk(b, base, G);
        const int mine = chunks_owned(c0, static_cast<int>(n_qkv), G);
        qkv_mine = mine;
        if (mine > 0) {
          if (l == 0) {
            rmsnorm_to_smem(x_s, nullptr, emb, La.input_norm, H, eps, hdr.red_norm);
          } else {
            consumer_wait(ctrs, layer_counter_index(l - 1, nkv, C::kStageDown), next * n_down * nw, tp);
            rmsnorm_to_smem(x_s, tp ? layer_parts(m, l - 1, kPartDown, W, H) : prev->down_out, prev->rmid,
                            La.input_norm, H, eps, hdr.red_norm, W, H);
          }
          if (tid == 0) tr.mark(t, l, kEvQkvReady);
          bf16* const qkv_out = La.qkv_out;
          // Qwen2's bias joins the fp32 sum before the one bf16 rounding (as cuBLAS's bias epilogue in stock);
          // null for Llama / Qwen3 / Mistral.
          const bf16* const qkv_bias = La.qkv_bias;
          if constexpr (tagged_qkv) {
            uint32_t* const qkv_t = tagged_l + I;
            const uint32_t tag = handoff_tag(e);
            consume_stage<false>(m, hdr, ring, x_s, C::kStageQKV, c0, [=](int r, int, float v, float) {
              if (qkv_bias != nullptr) v += bf2f(reinterpret_cast<const uint16_t*>(qkv_bias)[r]);
              st_bf16(qkv_out, r, v);
              st_relaxed_u32(qkv_t + r, tagged_word(tag, v));
            }, tr, t, l, kEvQkvLanded);
            // The attention splits poll the words: no release.
            consumer_signal_relaxed(ctrs, layer_counter_index(l, nkv, C::kStageQKV), static_cast<uint32_t>(mine));
          } else {
            consume_stage<false>(m, hdr, ring, x_s, C::kStageQKV, c0, [=](int r, int, float v, float) {
              if (qkv_bias != nullptr) v += bf2f(reinterpret_cast<const uint16_t*>(qkv_bias)[r]);
              st_bf16(qkv_out, r, v);
            }, tr, t, l, kEvQkvLanded);
            consumer_signal<kRelaxQKV>(ctrs, layer_counter_index(l, nkv, C::kStageQKV), static_cast<uint32_t>(mine));
          }
          handed_off(t, l, C::kStageQKV, kEvQkvDone);
        }
        base = (base + static_cast<int>(n_qkv)) % G;
      }

      if (has_task) {  // attention split (+ combine by the last split of the KV head)
        if (!tagged_qkv) consumer_wait(ctrs, layer_counter_index(l, nkv, C::kStageQKV), next * n_qkv);
        if (tid == 0) tr.mark(t, l, kEvAttnReady);
        const uint32_t* const qkv_t = tagged_qkv ? tagged_l + I : nullptr;
        uint32_t* const attn_t = tagged_attn ? tagged_l + I + (nh + 2 * nkv) * D : nullptr;
        attention_task<D, HP, tagged_attn>(hdr.hot, La, task, pos, slot, step.block_table, step.block_table_len,
                                           hdr.bt, work, hdr.bcast, ctrs,
                                           layer_counter_index(l, nkv, kCtrAttnKV + task.kvh),
                                           layer_counter_index(l, nkv, kCtrAttnDone), e, qkv_t, attn_t, tr, t, l);
        handed_off(t, l, kHandoffAttn, kEvAttnDone);
      }

      {  // O projection + residual
        const int c0 = first_chunk(b, base, G);
        const int mine = chunks_owned(c0, static_cast<int>(n_o), G);
        if (mine > 0) {
          // The residual rows first: they are ready before attention is (layer input), so their round trip
          // leaves the critical path. rin is complete once the previous layer's down stage is (this block waited
          // for it in its QKV stage, or waits here: then already satisfied in practice).
          if (l > 0 && qkv_mine == 0) {
            consumer_wait(ctrs, layer_counter_index(l - 1, nkv, C::kStageDown), next * n_down * nw, tp);
          }
          if (!tp) {
            gather_rows(hdr.resid, rin, c0, mine, hdr.geo[C::kStageO].nu, H);
          } else if (l > 0) {  // this rank's copy of rin = bf16(allreduce(down partials) + rmid), for GU and down
            sum_rows_to(prev->rin_next, layer_parts(m, l - 1, kPartDown, W, H), W, prev->rmid, c0, mine,
                        hdr.geo[C::kStageO].nu, H);
          }
          if constexpr (tagged_attn) {
            tagged_to_smem(x_s, tagged_l + I + (nh + 2 * nkv) * D, nh * D, handoff_tag(e), ctrs);
          } else {
            consumer_wait(ctrs, layer_counter_index(l, nkv, kCtrAttnDone), next * static_cast<uint32_t>(nkv));
            copy_to_smem(x_s, La.attn_out, nh * D);
          }
          if (tid == 0) tr.mark(t, l, kEvOReady);
          bf16* const o_out = La.o_out;
          bf16* const rmid = La.rmid;
          const float* const resid = hdr.resid;
          bf16* const part = layer_parts(m, l, kPartO, W, H) + static_cast<size_t>(rank) * H;
          consume_stage<false>(m, hdr, ring, x_s, C::kStageO, c0, [=](int r, int k, float v, float) {
            const float o = round_bf16(v);
            if constexpr (tp) {
              push_partial(part, r, o, W, delta);
            } else {
              st_bf16(o_out, r, o);
              st_bf16(rmid, r, o + resid[k]);
            }
          }, tr, t, l, kEvOLanded);
          if (tp) {
            consumer_signal_ranks(ctrs, layer_counter_index(l, nkv, C::kStageO), static_cast<uint32_t>(mine), W, delta);
          } else {
            consumer_signal<kRelaxO>(ctrs, layer_counter_index(l, nkv, C::kStageO), static_cast<uint32_t>(mine));
          }
          handed_off(t, l, C::kStageO, kEvODone);
        }
        base = (base + static_cast<int>(n_o)) % G;
      }

      {  // gate/up of rmsnorm(o + rin), SiLU(gate) * up
        const int c0 = first_chunk(b, base, G);
        const int mine = chunks_owned(c0, static_cast<int>(n_gu), G);
        gu_mine = mine;
        if (mine > 0) {
          consumer_wait(ctrs, layer_counter_index(l, nkv, C::kStageO), next * n_o * nw, tp);
          rmsnorm_to_smem(x_s, tp ? layer_parts(m, l, kPartO, W, H) : La.o_out, rin, La.post_norm, H, eps,
                          hdr.red_norm, W, H);
          if (tid == 0) tr.mark(t, l, kEvGuReady);
          bf16* const act = La.act;
          auto silu_mul = [](float vg, float vu) {
            const float gt = round_bf16(vg), up = round_bf16(vu);
            return __fmul_rn(__fdiv_rn(gt, 1.f + expf(-gt)), up);
          };
          if (tagged_gu) {  // (a loop of its own: the default loop keeps its register budget)
            uint32_t* const act_t = tagged_l;
            const uint32_t tag = handoff_tag(e);
            consume_stage<true>(m, hdr, ring, x_s, C::kStageGU, c0, [=](int r, int, float vg, float vu) {
              const float a = silu_mul(vg, vu);
              st_bf16(act, r, a);
              st_relaxed_u32(act_t + r, tagged_word(tag, a));
            }, tr, t, l, kEvGuLanded);
            // No release: the down stage reads the tagged words, not this counter.
            consumer_signal_relaxed(ctrs, layer_counter_index(l, nkv, C::kStageGU), static_cast<uint32_t>(mine));
          } else {
            consume_stage<true>(m, hdr, ring, x_s, C::kStageGU, c0, [=](int r, int, float vg, float vu) {
              st_bf16(act, r, silu_mul(vg, vu));
            }, tr, t, l, kEvGuLanded);
            consumer_signal<kRelaxGU>(ctrs, layer_counter_index(l, nkv, C::kStageGU), static_cast<uint32_t>(mine));
          }
          handed_off(t, l, C::kStageGU, kEvGuDone);
        }
        base = (base + static_cast<int>(n_gu)) % G;
      }

      {  // down projection + residual
        const int c0 = first_chunk(b, base, G);
        const int mine = chunks_owned(c0, static_cast<int>(n_down), G);
        if (mine > 0) {
          // rmid is complete with the O stage (this block waited for it in its gate/up stage, or waits here).
          if (gu_mine == 0) consumer_wait(ctrs, layer_counter_index(l, nkv, C::kStageO), next * n_o * nw, tp);
          if (tp) {  // this rank's copy of rmid = bf16(allreduce(O partials) + rin), for the next QKV / O
            sum_rows_to(La.rmid, layer_parts(m, l, kPartO, W, H), W, rin, c0, mine, hdr.geo[C::kStageDown].nu, H);
          } else {
            gather_rows(hdr.resid, La.rmid, c0, mine, hdr.geo[C::kStageDown].nu, H);
          }
          if (tagged_gu) {
            tagged_to_smem(x_s, tagged_l, I, handoff_tag(e), ctrs);
          } else {
            consumer_wait(ctrs, layer_counter_index(l, nkv, C::kStageGU), next * n_gu);
            copy_to_smem(x_s, La.act, I);
          }
          if (tid == 0) tr.mark(t, l, kEvDownReady);
          bf16* const down_out = La.down_out;
          bf16* const rin_next = La.rin_next;
          const float* const resid = hdr.resid;
          bf16* const part = layer_parts(m, l, kPartDown, W, H) + static_cast<size_t>(rank) * H;
          consume_stage<false>(m, hdr, ring, x_s, C::kStageDown, c0, [=](int r, int k, float v, float) {
            const float d = round_bf16(v);
            if constexpr (tp) {
              push_partial(part, r, d, W, delta);
            } else {
              st_bf16(down_out, r, d);
              st_bf16(rin_next, r, d + resid[k]);
            }
          }, tr, t, l, kEvDownLanded);
          if (tp) {
            consumer_signal_ranks(ctrs, layer_counter_index(l, nkv, C::kStageDown), static_cast<uint32_t>(mine), W,
                                  delta);
          } else {
            consumer_signal<kRelaxDown>(ctrs, layer_counter_index(l, nkv, C::kStageDown), static_cast<uint32_t>(mine));
          }
          handed_off(t, l, C::kStageDown, kEvDownDone);
        }
        base = (base + static_cast<int>(n_down)) % G;
      }
    }

    {  // LM head over the logical vocabulary, greedy argmax
      const LayerArgs& last = hdr.lay[(L - 1) & 1];
      const int c0 = first_chunk(b, base, G);
      const int mine = chunks_owned(c0, static_cast<int>(n_lm), G);
      bf16* logits = step.logits_out != nullptr ? step.logits_out + static_cast<int64_t>(t) * step.logits_stride
                                                : m.logits_scratch;
      // kSampled (a separate instantiation, so the greedy kernel carries none of it): vLLM's Gumbel-max on this
      // token's logits (sampling.cuh), keyed by (seed, position of the token whose logits these are) as vLLM's
      // sampler keys it; the row key is the same for every row.
      const uint32_t rkey = kSampled ? rng::row_key(__ldg(step.sample_seed), pos) : 0u;
      uint64_t best = 0;
      if (mine > 0) {
        consumer_wait(ctrs, layer_counter_index(L - 1, nkv, C::kStageDown), next * n_down * nw + fault_bias, tp);
        rmsnorm_to_smem(x_s, tp ? layer_parts(m, L - 1, kPartDown, W, H) : last.down_out, last.rmid,
                        hdr.hot.final_norm, H, eps, hdr.red_norm, W, H);
        if (tid == 0) tr.mark(t, L, kEvLmReady);
        const uint32_t row0 = static_cast<uint32_t>(m.vocab_start);  // keys carry global vocabulary ids
        consume_stage<false>(m, hdr, ring, x_s, C::kStageLM, c0, [&](int r, int, float v, float) {
          float lv = round_bf16(v);
          if constexpr (kSampled && !kTP) {
            // vLLM's penalties write the bf16 logits in place: the logits this launch keeps are the penalised ones
            if (penalized) lv = penalties::penalized(lv, static_cast<uint32_t>(r), pen);
          }
          st_bf16(logits, r, lv);
          uint64_t k;
          if constexpr (kSampled) {
            // (a filtered draw reads the row back once the grid's cut is known: below)
            k = filtered ? 0 : sampling::sampled_key(lv, row0 + static_cast<uint32_t>(r), step.temperature, rkey);
          } else {
            k = argmax_key(lv, row0 + static_cast<uint32_t>(r));
          }
          best = k > best ? k : best;
        }, tr, t, L, -1);
      }
      base = (base + static_cast<int>(n_lm)) % G;
      if constexpr (kSampled && !kTP) {
        if (filtered) {  // top-k / top-p / min-p: burst_sampling.cuh's three steps
          const int nu_lm = hdr.geo[C::kStageLM].nu, rows = mine > 0 ? mine * nu_lm : 0;
          const int n_rows = hdr.geo[C::kStageLM].n;
          const auto row_of = [=](int k) { return owned_row(c0, k, nu_lm); };
          const burst::Filters f{step.temperature, step.top_p, step.min_p, step.top_k};
          const burst::BlockView sv = burst::BlockView::carve(reinterpret_cast<uint8_t*>(work), rows);
          const burst::GridView gv = burst::GridView::of(m.sample_work);
          burst::add_rows(logits, rows, n_rows, row_of, static_cast<uint32_t>(m.vocab_start), f, rkey, sv, gv);
          consumer_sync();  // every thread's adds before thread 0's release (cumulative)
          if (tid == 0) {
            const uint32_t old = atom_acq_rel_add(counter(ctrs, kCtrSampleArrive), 1u);
            hdr.bcast[2] = (old + 1u == static_cast<uint32_t>(t + 1) * static_cast<uint32_t>(G)) ? 1 : 0;
          }
          consumer_sync();
          burst::Cut cut;
          if (hdr.bcast[2] != 0) {  // the cutter: every block's adds are visible (its acquire, then the barrier)
            cut = burst::find_cut(f, sv, gv);
            if (tid == 0) gv.publish(cut);
            consumer_sync();  // the cutter's reads of the histogram and its stores before the release
            if (tid == 0) st_release(counter(ctrs, kCtrSampleReady), static_cast<uint32_t>(t + 1));
          } else {
            consumer_wait(ctrs, kCtrSampleReady, static_cast<uint32_t>(t + 1));
            cut = gv.published();
          }
          burst::zero_hist_share(gv);
          best = burst::thread_best(sv, rows, row_of, static_cast<uint32_t>(m.vocab_start), cut, gv);
        }
      }
      best = consumer_max_key(best, hdr.keys);
      if (tid == 0) {
        hdr.hot.argmax_slots[b] = best;
        const uint32_t old = atom_acq_rel_add(counter(ctrs, kCtrLM), 1u);
        hdr.released = hand_off_seq(t, L, C::kStageLM, L);  // (also when this block owned no LM chunk: harmless)
        hdr.bcast[1] = (old + 1u == next * static_cast<uint32_t>(G)) ? 1 : 0;
        tr.mark(t, L, kEvLmDone);
      }
      consumer_sync();
      if (hdr.bcast[1] != 0 && tid < 32) {
        uint64_t k = grid_max_key(hdr.hot.argmax_slots, G);
        if constexpr (kSampled && !kTP) {
          if (filtered) {  // the split level's rows, ranked by column (burst_sampling.cuh), gathered into the work
                           // area: this block's rows there are done with (its best is in)
            const burst::GridView gv = burst::GridView::of(m.sample_work);
            k = burst::resolve_split(k, gv.published(), gv, reinterpret_cast<uint64_t*>(work));
          }
        }
        if (tid == 0) {
          if constexpr (tp) k = tp_best_key(m, k, e, W, rank, delta);
          // The host's cancel word: one PCIe round trip (~1-2 us) per token, by the finisher only, which publishes
          // its decision with the token. (Read by every block at the LM head's start, 132 reads of one host word
          // per token, the run-ahead launches ran ~0.1 ms per token slower.)
          const bool cancelled = !kTP && step.cancel != nullptr && ld_relaxed_sys_s64(step.cancel) >= step.cancel_id;
          int64_t id = static_cast<int64_t>(argmax_row(k));
          bool deferred = false;
          if constexpr (kSampled && !kTP) {
            if (filtered) {  // a winner not tagged sure (or none): vLLM's sampler draws this token on the host
              id = static_cast<int64_t>(burst::winner_col(k));
              deferred = !burst::winner_sure(k);
              if (deferred) step.defer_out[0] = 1;
            }
          }
          if constexpr (kSampled && !kTP) {
            if (penalized && !cancelled && !deferred) {  // released with the token below; only this thread writes
              uint32_t* c = reinterpret_cast<uint32_t*>(step.burst_counts) + id;
              *reinterpret_cast<volatile uint32_t*>(c) = ld_cg_u32(c) + 1u;
            }
          }
          // every block reads it after the token-ready wait; a negative token ends the launch
          step.tokens_out[t] = (cancelled || deferred) ? -1 - id : id;
          if (step.num_out != nullptr) step.num_out[0] = deferred ? t : t + 1;
          st_release(counter(ctrs, kCtrTokenReady), next);
        }
      }
    }

    ntok = t + 1;
    if (t + 1 < step.num_tokens) {
      consumer_wait(ctrs, kCtrTokenReady, next);
      if (tid == 0) tr.mark(t, L, kEvTokenSeen);
      const int64_t tok = static_cast<int64_t>(ld_cg_u64(step.tokens_out + t));
      bool stop = tok < 0;  // cancelled (the run-ahead launch was abandoned by the host)
      for (int i = 0; i < step.num_stop; ++i) stop |= __ldg(step.stop_ids + i) == tok;
      if (tid == 0) {
        hdr.tok_stop = stop ? 1 : 0;
        __threadfence_block();
        hdr.tok_go = t + 1;
      }
      if (stop) break;
    }
  }
  // The last block to finish advances the epoch by the tokens produced; every block has read the old one (at its
  // start) by then, and the next launch reads the new one after this kernel completes (stream order).
  consumer_sync();
  if (tid == 0) {
    const uint32_t old = atom_acq_rel_add(counter(ctrs, kCtrFinish), 1u);
    if (old + 1u == static_cast<uint32_t>(G)) {
      *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrFinish)) = 0u;
      if constexpr (kSampled && !kTP) {
        if (filtered) {  // (their targets count this launch's tokens from 0)
          *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrSampleArrive)) = 0u;
          *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrSampleReady)) = 0u;
        }
        if (penalized) {  // every block is past its last LM head: the counts of this launch's tokens go back to 0
          const int64_t rows = hdr.geo[C::kStageLM].n;
          for (int i = 0; i < ntok; ++i) {
            const int64_t id = static_cast<int64_t>(ld_cg_u64(step.tokens_out + i));
            if (id >= 0 && id < rows) *reinterpret_cast<volatile int32_t*>(step.burst_counts + id) = 0;
          }
        }
      }
      *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrStarted)) = 0u;
      *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrEpoch)) = epoch0 + static_cast<uint32_t>(ntok);
      // Every block's abort record precedes its finish add (acquired above). After an abort nothing this launch
      // wrote is trusted: it reports no token, and the host reads why from status_out with the tokens.
      const uint32_t site = ld_relaxed(counter(ctrs, kCtrAbort));
      if (site != 0u) {
        if (step.num_out != nullptr) *reinterpret_cast<volatile int32_t*>(step.num_out) = 0;
        if (step.defer_out != nullptr) *reinterpret_cast<volatile int32_t*>(step.defer_out) = 0;
      }
      if (m.status_out != nullptr) *reinterpret_cast<volatile uint32_t*>(m.status_out) = site;
    }
  }
}

// HP: the attention pass width (query heads per pass, plan.heads_per_pass): one kernel per width, so that a kernel
// carries only the attention code its shapes run.
template <int D, int HP, bool kSampled, bool kTP>
__global__ void __launch_bounds__(MonoConfig::kThreads, 1) monokernel_kernel(const __grid_constant__ StepArgs step) {
  extern __shared__ __align__(128) uint8_t smem[];
  SmemHeader& hdr = *reinterpret_cast<SmemHeader*>(smem);
  // A run-ahead launch whose gate is closed (the burst before it ended early) does nothing at all: every block
  // returns before touching shared memory, counters, caches or outputs, so the epoch stays where it was.
  if (step.launch_gate != nullptr && *step.launch_gate < step.gate_min) return;
  const ModelArgs& m = *step.model;
  // This block runs: waits of the other blocks tell a grid that is not all resident by this count (sync.cuh).
  if (threadIdx.x == 0) red_relaxed_add(counter(m.counters, kCtrStarted), 1u);
  if constexpr (diag::kSalt > 0) diag::salt();  // (diagnostics.cuh)
  const int ns = static_cast<int>(m.num_slots);
  if (threadIdx.x >= 32 && threadIdx.x < 32 + MonoConfig::kMaxTP) {
    hdr.tp_delta[threadIdx.x - 32] = m.tp_delta[threadIdx.x - 32];
  }
  if (threadIdx.x < MonoConfig::kNumStages) {
    const int st = threadIdx.x;
    hdr.geo[st] = StageGeom{static_cast<int>(m.stage_k[st]), static_cast<int>(m.stage_n[st]),
                            static_cast<int>(m.stage_nu[st]), static_cast<int>(m.stage_chunks[st])};
  }
  if (threadIdx.x == 0) {
    hdr.hot = HotArgs{m.cos_sin, m.final_norm, m.lm_head, m.layers, m.argmax_slots,
                      m.kv_stride_block, m.kv_stride_pos, m.kv_stride_head,
                      static_cast<float>(m.rms_eps), static_cast<float>(m.attn_scale_log2),
                      static_cast<int>(m.num_layers), static_cast<int>(m.num_heads),
                      static_cast<int>(m.num_kv_heads), static_cast<int>(m.num_splits), static_cast<int>(m.block_size),
                      static_cast<int>(m.qk_norm)};
    for (int i = 0; i < ns; ++i) {
      mbar_init(&hdr.full[i], 1u);
      mbar_init(&hdr.empty[i], static_cast<uint32_t>(MonoConfig::kConsumerWarps));
    }
    hdr.tok_go = 0;
    hdr.tok_stop = 0;
    hdr.released = -1;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  uint8_t* ring = smem + MonoConfig::kHeaderBytes + m.work_bytes;
  if (threadIdx.x >= MonoConfig::kConsumerThreads) {
    setmaxnreg_dec<MonoConfig::kLoaderRegs>();
    if (threadIdx.x == MonoConfig::kLoaderWarp * 32) run_loader<kTP>(m, step, hdr, ring);
    return;
  }
  setmaxnreg_inc<MonoConfig::kConsumerRegs>();
  const uint32_t epoch0 = ld_relaxed(counter(m.counters, kCtrEpoch));
  run_consumers<D, HP, kSampled, kTP>(m, step, hdr, reinterpret_cast<bf16*>(smem + MonoConfig::kHeaderBytes),
                   reinterpret_cast<float*>(smem + MonoConfig::kHeaderBytes), ring, epoch0);
}

}  // namespace kog
