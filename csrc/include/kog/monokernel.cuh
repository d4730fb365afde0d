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
//
// This header is the kernel's entry: the block's shared-memory header (smem_header.cuh) set up, then the loader warp
// (loader.cuh: run_loader) and the consumer warps (consumers.cuh: run_consumers, the step flow; its steps in
// layer_stages.cuh, token_select.cuh and token_stages.cuh, one stage's chunks in consume_stage.cuh).
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/config.cuh"
#include "kog/consumers.cuh"
#include "kog/diagnostics.cuh"
#include "kog/loader.cuh"
#include "kog/smem_header.cuh"
#include "kog/sync.cuh"

namespace kog {

// HP: the attention pass width (query heads per pass, plan.heads_per_pass): one kernel per width, so that a kernel
// carries only the attention code its shapes run. kFp8: the layer projections are FP8 rows with scales (fp8.cuh).
// kMoe: each layer's MLP is a routed mixture of experts (moe_stages.cuh).
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe>
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
  if (kMoe && threadIdx.x == 64) {  // (another warp than the tables' copies above and below)
    hdr.moe.router = StageGeom{static_cast<int>(m.hidden), static_cast<int>(m.moe_experts),
                               static_cast<int>(m.moe_router_nu), static_cast<int>(m.moe_router_chunks)};
    hdr.moe.top_k = static_cast<int>(m.moe_top_k);
    hdr.moe.log2_top_k = __ffs(static_cast<int>(m.moe_top_k)) - 1;
    hdr.moe.inter = static_cast<int>(m.moe_inter);
    hdr.moe.experts = static_cast<int>(m.moe_experts);
    hdr.moe.norm_topk = static_cast<int>(m.moe_norm_topk);
    hdr.moe.ctr_base = static_cast<int>(m.moe_ctr_base);
    hdr.moe.logits = m.moe_logits;
    hdr.moe.route = m.moe_route;
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
    hdr.abandoned = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  uint8_t* ring = smem + MonoConfig::kHeaderBytes + m.work_bytes;
  if (threadIdx.x >= MonoConfig::kConsumerThreads) {
    setmaxnreg_dec<MonoConfig::kLoaderRegs>();
    if (threadIdx.x == MonoConfig::kLoaderWarp * 32) run_loader<kTP, kFp8, kMoe>(m, step, hdr, ring);
    return;
  }
  setmaxnreg_inc<MonoConfig::kConsumerRegs>();
  const uint32_t epoch0 = ld_relaxed(counter(m.counters, kCtrEpoch));
  run_consumers<D, HP, kSampled, kTP, kFp8, kMoe>(m, step, hdr, reinterpret_cast<bf16*>(smem + MonoConfig::kHeaderBytes),
                   reinterpret_cast<float*>(smem + MonoConfig::kHeaderBytes), ring, epoch0);
}

}  // namespace kog
