// The consumer warps' steps around a token's layers: the token's input (id, KV-cache slot, embedding row) and this
// block's attention split of it, the token feedback between tokens of one launch (the finisher's token read back,
// stop checks, the loader let on to the next token's weights), and the end of the launch (the epoch advanced by
// the launch's last block).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/attention.cuh"
#include "kog/config.cuh"
#include "kog/consumer_state.cuh"
#include "kog/sync.cuh"
#include "kog/trace.cuh"

namespace kog {

// Token t's input: its id (the launch's input for token 0, else the token this launch made before it, which
// every block has read after its token-ready wait), its position, KV-cache slot and embedding row. After an abort
// the token-ready wait gave up (sync.cuh) and tokens_out[t - 1] may never have been written: this block then saw
// the abort word (its own record, or the one that made its wait give up) and takes the launch's input id instead,
// so that no garbage id addresses the embedding (the launch reports no token either way).
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ TokenStep begin_token(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, int t) {
  const StepArgs& step = c.step;
  const int bs = c.bs;
  const uint32_t e = c.epoch0 + static_cast<uint32_t>(t);
  const uint32_t next = e + 1u;
  const int pos = static_cast<int>(c.pos0) + t;
  int64_t token;
  if (t == 0 || aborted(c.ctrs)) {
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
  const bf16* emb = c.m.embed + token * c.H;
  return TokenStep{t, e, next, pos, slot, emb};
}

// This block's attention split of the token (kv head b / S, split b % S, Consumers::has_task): its range of the
// context, whether it holds the token's position (and appends its K and V), and the block-table entries of its
// range, cached in shared memory (SmemHeader::bt) when they fit.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void plan_attention_split(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, const TokenStep& tk,
                                                     AttnTask& task) {
  using C = MonoConfig;
  const StepArgs& step = c.step;
  const int S = c.S, bs = c.bs, b = c.b, pos = tk.pos;
  const int ctx = pos + 1;
  // Short contexts (ctx <= attn_single_ctx, a benchmark variant; 0: off): split 0 covers the whole context and
  // writes the final output, no partials and no combine (attention.cuh).
  task.single = ctx <= static_cast<int>(c.m.attn_single_ctx);
  const int s_eff = task.single ? 1 : S;
  // A split longer than kAttnShortLen (the tensor-core pass's) starts on a kAttnTileLen boundary: block sizes are
  // powers of two >= kAttnTileLen (the gate's TESTED_BLOCK_SIZES, host.py checks), so no 16-position tile crosses a
  // KV block and a tile's rows take one block-table entry (attention_mma.cuh). Later splits may then be empty.
  int len = (ctx + s_eff - 1) / s_eff;
  if (len > C::kAttnShortLen) len = (len + C::kAttnTileLen - 1) / C::kAttnTileLen * C::kAttnTileLen;
  task.kvh = b / S;
  task.split = b - task.kvh * S;
  task.start = task.split * len;
  task.end = min(task.start + len, ctx);
  if (task.end < task.start) task.end = task.start;
  task.owner = task.start <= pos && pos < task.end;
  task.mode = static_cast<int>(c.m.attn_mode);
  // (A variant table may hold any value: kept to the rounds the L2 budget allows, so that no offset overflows.)
  task.prefetch = static_cast<int>(min(max(c.m.attn_prefetch, int64_t{0}), int64_t{MonoConfig::kAttnMaxPrefetchRounds}));
  task.bt_count = -1;
  if (task.end > task.start) {
    const int first = task.start / bs, last = (task.end - 1) / bs;
    if (last - first + 1 <= C::kBtCacheEntries && last < step.block_table_len) {
      task.bt_first = first;
      task.bt_count = last - first + 1;
      for (int i = c.tid; i < task.bt_count; i += C::kConsumerThreads) {
        c.hdr.bt[i] = __ldg(step.block_table + first + i);
      }
    }
  }
  consumer_sync();
}

// Between two tokens of the launch: token t as the finisher published it, read back by every block after the
// token-ready wait; true when the launch stops after it (a stop id, or the host cancelled the launch). Either way
// the loader learns it through tok_stop / tok_go.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ bool token_stops(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, const TokenStep& tk) {
  const StepArgs& step = c.step;
  const int t = tk.t;
  consumer_wait(c.ctrs, kCtrTokenReady, tk.next);
  if (c.tid == 0) c.tr.mark(t, c.L, kEvTokenSeen);
  const int64_t tok = static_cast<int64_t>(ld_cg_u64(step.tokens_out + t));
  bool stop = tok < 0;  // cancelled (the run-ahead launch was abandoned by the host)
  for (int i = 0; i < step.num_stop; ++i) stop |= __ldg(step.stop_ids + i) == tok;
  if (c.tid == 0) {
    c.hdr.tok_stop = stop ? 1 : 0;
    __threadfence_block();
    c.hdr.tok_go = t + 1;
  }
  return stop;
}

// The end of the launch, after its ntok tokens: the last block to finish advances the epoch and resets what
// counts from 0 within a launch.
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
__device__ __forceinline__ void finish_launch(const Consumers<D, HP, kSampled, kTP, kFp8, kMoe>& c, int ntok) {
  using C = MonoConfig;
  const ModelArgs& m = c.m;
  const StepArgs& step = c.step;
  uint32_t* const ctrs = c.ctrs;
  // The last block to finish advances the epoch by the tokens produced; every block has read the old one (at its
  // start) by then, and the next launch reads the new one after this kernel completes (stream order).
  consumer_sync();
  if (c.tid == 0) {
    const uint32_t old = atom_acq_rel_add(counter(ctrs, kCtrFinish), 1u);
    if (old + 1u == static_cast<uint32_t>(c.G)) {
      *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrFinish)) = 0u;
      if constexpr (kSampled && !kTP) {
        if (c.filtered.on) {  // (their targets count this launch's tokens from 0)
          *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrSampleArrive)) = 0u;
          *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrSampleReady)) = 0u;
        }
        if (c.penalized.on) {  // every block is past its last LM head: the counts of this launch's tokens go back to 0
          const int64_t rows = c.hdr.geo[C::kStageLM].n;
          for (int i = 0; i < ntok; ++i) {
            const int64_t id = static_cast<int64_t>(ld_cg_u64(step.tokens_out + i));
            if (id >= 0 && id < rows) *reinterpret_cast<volatile int32_t*>(step.burst_counts + id) = 0;
          }
        }
      }
      *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrStarted)) = 0u;
      *reinterpret_cast<volatile uint32_t*>(counter(ctrs, kCtrEpoch)) = c.epoch0 + static_cast<uint32_t>(ntok);
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

}  // namespace kog
