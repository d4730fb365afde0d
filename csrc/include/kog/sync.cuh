// Synchronisation primitives of the monokernel: epoch-tagged counters between blocks (acquire/release at GPU
// scope), the consumer-warp named barrier, and the mbarrier/bulk-copy pipeline that streams weights into shared
// memory. docs/monokernel.md gives the ordering argument these implement.
#pragma once

#include <cstdint>

#include "kog/config.cuh"
#include "kog/diagnostics.cuh"

namespace kog {

// ---- counters ---------------------------------------------------------------------------------------------------
// Layout of ModelArgs::counters, in units of MonoConfig::kCounterStride words:
//   0 epoch (steps completed, written by the last block to finish a launch)   1 finish (blocks done this launch)
//   2 lm (blocks done with the LM head)   3 token-ready (epoch + 1 once the sampled token is in tokens_out)
//   4 abort (0, or the site of the first wait that timed out)   5..8 that wait's block, what, target, seen
//   9 tp-lm (tensor parallelism: ranks whose best LM-head key of the token arrived here)
//   10 sample-arrive (blocks whose rows a filtered draw counted, burst_sampling.cuh)   11 sample-ready (cuts
//      published); both count from 0 within a launch and are zeroed by the launch's last block
//   12 started (blocks of this launch that have begun; counts from 0 within a launch, zeroed by its last block):
//      a wait that sees fewer than gridDim.x after kResidencyTimeoutNs knows the grid is not all resident
//   13 + l * (5 + nkv) + {0 qkv, 1 o, 2 gate/up, 3 down}: chunks of that stage completed (cumulative over steps)
//                      + 4 attn_done: KV heads whose attention output is combined
//                      + 5 + h: splits of KV head h finished
// Counters only grow (mod 2^32); a wait for step e compares against (e + 1) * count with wrap-aware arithmetic, so
// no pass resets them between launches.
// Tensor parallelism (W ranks): every rank's O and down blocks add to the o / down counters of all W ranks (system
// scope), so those count W x chunks per step; tp-lm counts W per step.
constexpr int kCtrEpoch = 0, kCtrFinish = 1, kCtrLM = 2, kCtrTokenReady = 3, kCtrAbort = 4, kCtrDiag = 5;
constexpr int kCtrTpLM = 9;
constexpr int kCtrSampleArrive = 10, kCtrSampleReady = 11;
constexpr int kCtrStarted = 12;
constexpr int kCtrLayerBase = 13;
static_assert(kCtrSampleReady < kCtrStarted && kCtrStarted < kCtrLayerBase, "global counters precede the layers' blocks");
constexpr int kCtrAttnDone = 4, kCtrAttnKV = 5;  // within a layer's block, after the four GEMV stages

// Abort sites (the value of counter kCtrAbort).
constexpr uint32_t kSiteCounter = 1, kSiteFull = 2, kSiteEmpty = 3, kSiteTokenGo = 4, kSiteHandoff = 5,
                   kSiteTagged = 6, kSiteNotResident = 7;
// A wait that spins this long (cycles, ~1.1 s at 1.98 GHz) records itself and gives up, and every other wait then
// gives up too: the launch finishes with garbage instead of hanging, and the host reads what hung. The launch's
// last block then reports no token (num_out 0, defer_out 0) and writes the abort word to ModelArgs::status_out.
constexpr long long kWaitTimeoutCycles = 1ll << 31;
// A counter wait that has spun this long (ns of %globaltimer) while fewer than gridDim.x blocks of the launch have
// started gives up with kSiteNotResident: the blocks it waits for may never run while it spins (another process or
// stream holds SMs). Every block starts within a few us of the launch when the grid is resident.
constexpr unsigned long long kResidencyTimeoutNs = 1000000ull;
// An mbarrier wait reads the abort word at most this often (cycles, ~8 us at 1.98 GHz): by time, not by polls,
// because one mbarrier.try_wait may suspend the thread for a system-dependent limit: counting 1,024 polls is the
// likely reason a 32-token burst aborted inside vllm serve ran 36.9 s, about kWaitTimeoutCycles per token.
constexpr long long kAbortPollCycles = 1ll << 14;

__host__ __device__ constexpr int layer_counter_count(int num_kv_heads) { return 5 + num_kv_heads; }
__host__ __device__ constexpr int num_counters(int num_layers, int num_kv_heads) {
  return kCtrLayerBase + num_layers * layer_counter_count(num_kv_heads);
}
__host__ __device__ constexpr int layer_counter_index(int layer, int nkv, int which) {
  return kCtrLayerBase + layer * layer_counter_count(nkv) + which;
}

__device__ __forceinline__ uint32_t* counter(uint32_t* base, int index) {
  return base + index * MonoConfig::kCounterStride;
}

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_relaxed_add(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// System scope: counters other GPUs (tensor-parallel peers, through CUDA IPC) add to or wait on.
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add_sys(uint32_t* p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// A word the host writes into pinned, mapped memory while the kernel runs (StepArgs::cancel). Relaxed: the value
// only chooses when a launch ends, it orders nothing.
__device__ __forceinline__ int64_t ld_relaxed_sys_s64(const int64_t* p) {
  int64_t v;
  asm volatile("ld.relaxed.sys.global.s64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t atom_relaxed_add(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ uint32_t atom_acq_rel_add(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
// a >= b for counters that wrap mod 2^32 (they never drift more than 2^31 apart).
__device__ __forceinline__ bool reached(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool aborted(uint32_t* ctrs) { return ld_relaxed(counter(ctrs, kCtrAbort)) != 0u; }

__device__ __noinline__ void record_abort(uint32_t* ctrs, uint32_t site, uint32_t what, uint32_t target,
                                          uint32_t seen) {
  // (After an abort every waiting lane of the grid gives up and comes here: a read first, not a CAS on one word.)
  if (!aborted(ctrs) && atomicCAS(counter(ctrs, kCtrAbort), 0u, site) == 0u) {
    *counter(ctrs, kCtrDiag) = blockIdx.x;
    *counter(ctrs, kCtrDiag + 1) = what;
    *counter(ctrs, kCtrDiag + 2) = target;
    *counter(ctrs, kCtrDiag + 3) = seen;
  }
}

// Slow path of a wait whose producers are other blocks (every 1024 polls): once it has seen fewer than gridDim.x
// blocks started for kResidencyTimeoutNs (g0: 0 until it first sees that, then when), records kSiteNotResident
// (what: the counter index, or kWhatTagged for a tagged-word wait) and returns true.
constexpr uint32_t kWhatTagged = 0xffffffffu;
__device__ __forceinline__ bool abort_if_not_resident(uint32_t* ctrs, unsigned long long& g0, uint32_t what) {
  const uint32_t started = ld_relaxed(counter(ctrs, kCtrStarted));
  if (started >= gridDim.x) return false;
  const unsigned long long now = globaltimer_ns();
  if (g0 == 0) {
    g0 = now;
    return false;
  }
  if (now - g0 <= kResidencyTimeoutNs) return false;
  record_abort(ctrs, kSiteNotResident, what, gridDim.x, started);
  return true;
}

// ---- register reallocation between warpgroups (sm_90; every thread of the warpgroup executes it) ------------------
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- consumer-warp barriers (the loader warp never joins) ------------------------------------------------------
// Hardware barrier ids: 0 __syncthreads, 1 all consumer warps.
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(MonoConfig::kConsumerThreads) : "memory");
}

// The calling thread polls counter `index` (acquire) until it reaches target, or records a timeout / sees an abort.
// sys: the counter is also added to by other GPUs (tensor parallelism), so the acquire is at system scope.
__device__ __forceinline__ void spin_until(uint32_t* ctrs, int index, uint32_t target, bool sys) {
  const uint32_t* p = counter(ctrs, index);
  uint32_t v = sys ? ld_acquire_sys(p) : ld_acquire(p);
  if (!reached(v, target)) {
    const long long t0 = clock64();
    unsigned long long g0 = 0;
    for (uint32_t n = 1;; ++n) {
      __nanosleep(32);
      v = sys ? ld_acquire_sys(p) : ld_acquire(p);
      if (reached(v, target)) break;
      if ((n & 1023u) == 0) {
        if (aborted(ctrs) || clock64() - t0 > kWaitTimeoutCycles) {
          record_abort(ctrs, kSiteCounter, static_cast<uint32_t>(index), target, v);
          break;
        }
        if (abort_if_not_resident(ctrs, g0, static_cast<uint32_t>(index))) break;
      }
    }
  }
}
// One consumer thread spins until counter `index` reaches target, then the barrier extends that acquire to every
// consumer thread: their later loads are ordered after the producers' releases (causality order is transitive
// through bar.sync).
__device__ __forceinline__ void consumer_wait(uint32_t* ctrs, int index, uint32_t target, bool sys = false) {
  if (threadIdx.x == 0) spin_until(ctrs, index, target, sys);
  consumer_sync();
}

// Every consumer thread's prior global writes, then one release-add by thread 0: the barrier orders the other
// threads' writes before thread 0's release (release is cumulative over causality order). kRelaxBit names the
// hand-off for a diagnostics build that signals it without the release (diagnostics.cuh, kRelax*).
template <int kRelaxBit = 0>
__device__ __forceinline__ void consumer_signal(uint32_t* ctrs, int index, uint32_t amount) {
  consumer_sync();
  if (threadIdx.x == 0) {
    if constexpr (diag::relaxed(kRelaxBit)) {
      red_relaxed_add(counter(ctrs, index), amount);
    } else {
      red_release_add(counter(ctrs, index), amount);
    }
  }
}
// The count without the release, for a hand-off whose readers poll tagged words (tagged.cuh) instead of this
// counter: no fence; the count only keeps the counter where a later counter-based launch expects it. The barrier
// keeps the stage's input buffer until every consumer warp is done with it.
__device__ __forceinline__ void consumer_signal_relaxed(uint32_t* ctrs, int index, uint32_t amount) {
  consumer_sync();
  if (threadIdx.x == 0) red_relaxed_add(counter(ctrs, index), amount);
}
// The same, to counter `index` of each of W ranks (rank q's copy at + delta[q] bytes), at system scope: the block's
// stores into the peers' buffers (through IPC mappings) are ordered before each release the same way.
__device__ __forceinline__ void consumer_signal_ranks(uint32_t* ctrs, int index, uint32_t amount, int W,
                                                      const int64_t* delta) {
  consumer_sync();
  if (threadIdx.x == 0) {
    uint8_t* p = reinterpret_cast<uint8_t*>(counter(ctrs, index));
    for (int q = 0; q < W; ++q) red_release_add_sys(reinterpret_cast<uint32_t*>(p + delta[q]), amount);
  }
}

// ---- loads of data other blocks wrote in this launch: L2 only, never a stale L1 line ---------------------------
// (__ldcg is an ordinary load to the compiler: it stays after the "memory"-clobbering acquire/barrier asm, and
// independent loads can be issued together.)
__device__ __forceinline__ uint4 ld_cg_v4(const void* p) { return __ldcg(static_cast<const uint4*>(p)); }
__device__ __forceinline__ float ld_cg_f32(const float* p) { return __ldcg(p); }
__device__ __forceinline__ uint16_t ld_cg_u16(const void* p) { return __ldcg(static_cast<const unsigned short*>(p)); }
__device__ __forceinline__ uint32_t ld_cg_u32(const uint32_t* p) { return __ldcg(p); }
__device__ __forceinline__ double ld_cg_f64(const double* p) { return __ldcg(p); }
__device__ __forceinline__ uint64_t ld_cg_u64(const void* p) {
  return __ldcg(static_cast<const unsigned long long*>(p));
}

// ---- mbarrier + bulk copy (weights only: read-only for the whole launch, so the async proxy needs no fence
// against generic-proxy writes) ----------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Non-blocking probe of the same phase (try_wait may suspend the thread for a while; test_wait returns at once).
__device__ __forceinline__ bool mbar_test_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Waits for the phase of `bar` with this parity to complete: true when it did; false when it gave up, after
// kWaitTimeoutCycles (see above) or, if may_abandon, within kAbortPollCycles of another wait's abort. A wait on a
// bulk copy this block has issued passes may_abandon false (an issued copy lands within microseconds; only a broken
// device keeps it past the timeout): a block must not exit, nor re-arm the slot, while a copy into it is in flight.
__device__ __forceinline__ bool mbar_wait(uint64_t* bar, uint32_t parity, uint32_t* ctrs, uint32_t site,
                                          bool may_abandon = true) {
  if (mbar_try_wait(bar, parity)) return true;
  const long long t0 = clock64();
  long long poll = t0 + kAbortPollCycles;
  for (;;) {
    if (mbar_try_wait(bar, parity)) return true;
    const long long now = clock64();
    if (now >= poll) {
      if ((may_abandon && aborted(ctrs)) || now - t0 > kWaitTimeoutCycles) {
        record_abort(ctrs, site, smem_addr(bar), parity, 0u);
        return false;
      }
      poll = now + kAbortPollCycles;
    }
  }
}
// 16 bytes global -> shared without registers (cp.async, L2 only); visible to the issuing thread after
// cp_async_wait_all(). For read-only data (weights, norms) only.
__device__ __forceinline__ void cp_async_16(void* dst_smem, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst_smem)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Hint: bring [src, src + bytes) into L2 (no completion, no shared memory written).
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// Global -> shared bulk copy of `bytes` (multiple of 16, both addresses 16-byte aligned), completing on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                              uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

}  // namespace kog
