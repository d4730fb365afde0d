// Low-latency all-reduce between the ranks of one node: device code (no torch headers).
//
// Every rank owns one buffer shared with its peers through CUDA IPC; `Params::peers[r]` is rank r's
// buffer as mapped in this process. Data carries its own readiness (NCCL's "LL" idea): every 8-byte word
// written to a peer is {payload u32 (low half), epoch u32 (high half)} and is stored and loaded as one
// naturally aligned 64-bit relaxed.sys access, so a reader that sees the current epoch in a word also sees
// the payload that was stored with it. There is no barrier and no flag separate from the data.
//
//   one-shot : every rank pushes its whole input to every peer's slot [src=rank]; every rank polls the
//              W-1 slots it receives and sums the W contributions in rank order 0..W-1.
//   two-shot : the input is cut into W chunks; chunk j is pushed to rank j's reduce-scatter slot [src];
//              rank j sums its chunk in rank order, rounds it once, and pushes the result to every
//              peer's all-gather slot [owner=j].
//
// Both sum in fp32 in rank order and round once, so every rank gets the same bits, and the one-shot and
// two-shot variants give the same bits as each other.
//
// Buffer reuse without a reset pass: slots come in kNumSets=2 sets, call epoch e uses set e & 1. Rank A
// writes set s of rank B at call e+2 only after A's kernel e+1 finished; every block of that kernel waited
// for data that B pushed in its kernel e+1, which started after B's kernel e (the last reader of set s)
// finished. Kernel boundaries on both sides order the read before the overwrite. docs/collective.md gives
// the full argument, the epoch wrap and the periodic refresh that keeps a stale word from ever carrying a
// current epoch.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kog::ar {

// ---- Protocol constants. kog_backend/collective/layout.py mirrors every `constexpr int k...` below and
// tests/test_collective_cpu.py checks the two agree. ----
constexpr int kMaxWorld = 8;         // ranks per communicator (kernels are instantiated for 2, 4, 6, 8)
constexpr int kThreads = 128;        // threads per block; initial choice, not tuned (issue 6 tunes it)
constexpr int kMaxBlocks = 64;       // grid cap; also the length of the per-rank epoch array
constexpr int kPackBytes = 16;       // input bytes one thread moves per step (one uint4)
constexpr int kLLPackBytes = 32;     // shared-buffer bytes per pack: 2 lines of {u32 data, u32 epoch} x 2
constexpr int kNumSets = 2;          // slot sets rotated by epoch parity
constexpr int kHeaderBytes = 4096;   // start-up check area at offset 0 of every buffer
constexpr int kCheckSlotBytes = 256; // bytes of the check area written by each source rank
constexpr int kAlign = 256;          // alignment of every slot, bytes
constexpr int kErrWords = 8;         // int32 words of the host-mapped error record
constexpr int kSpinsPerTimerRead = 256;  // polls between two reads of %globaltimer
constexpr int kDefaultRefreshLog2 = 20;  // full-slot refresh every 2^20 calls (see is_refresh_epoch)

constexpr int kAlgoOneShot = 0;
constexpr int kAlgoTwoShot = 1;

// Error record (int32 words, pinned host memory mapped into the device address space).
constexpr int kErrStatus = 0;   // kStatusOk / kStatusTimeout; written last
constexpr int kErrRank = 1;     // rank that timed out
constexpr int kErrMissing = 2;  // peer rank whose data never arrived
constexpr int kErrEpoch = 3;    // epoch of the call (as int32 bits)
constexpr int kErrPhase = 4;    // kPhaseOneShot / kPhaseReduceScatter / kPhaseAllGather
constexpr int kStatusOk = 0;
constexpr int kStatusTimeout = 1;
constexpr int kPhaseOneShot = 0;
constexpr int kPhaseReduceScatter = 1;
constexpr int kPhaseAllGather = 2;

static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
static_assert(kLLPackBytes == 2 * kPackBytes, "an LL word carries 4 payload bytes in 8");
static_assert(kNumSets == 2, "set_of() and the reuse argument assume two sets");
static_assert(kHeaderBytes >= kMaxWorld * kCheckSlotBytes && kHeaderBytes % kAlign == 0, "check area");
static_assert(kAlign % kLLPackBytes == 0, "slots hold whole packs");
static_assert(kErrPhase < kErrWords, "error record");

// ---- Epochs (u32). 0 and 1 never occur after the first wrap; 0 never occurs at all, so the zeroed
// buffer (epoch 0 in every word) never looks written. The sequence is 1, 2, ..., 0xFFFFFFFF, 2, 3, ...:
// parity alternates across the wrap (0xFFFFFFFF is odd, 2 is even), so set_of() alternates every call. ----
__host__ __device__ constexpr uint32_t next_epoch(uint32_t e) { return e == 0xFFFFFFFFu ? 2u : e + 1u; }
__host__ __device__ constexpr int set_of(uint32_t e) { return static_cast<int>(e & 1u); }
// Refresh epochs: e & mask in {0, 1}, i.e. one call of each parity every mask+1 calls. On a refresh
// epoch every slot of the set that the call does not fill with data is rewritten with the current epoch,
// so no word of a set is older than ~2(mask+1) calls; a word can only carry epoch e if it was written
// 2^32 - 2 calls ago or in this call, hence never a stale match (docs/collective.md).
__host__ __device__ constexpr bool is_refresh_epoch(uint32_t e, uint32_t mask) { return (e & mask) <= 1u; }

// ---- Buffer layout (bytes from the start of each rank's buffer). Capacities are payload bytes. ----
struct Layout {
  int64_t oneshot_off;         // start of the one-shot region
  int64_t oneshot_slot;        // bytes of one (set, src) slot
  int64_t oneshot_set_stride;  // world * oneshot_slot
  int64_t oneshot_cap_packs;   // largest one-shot message, packs
  int64_t rs_off;              // start of the two-shot reduce-scatter region
  int64_t ag_off;              // start of the two-shot all-gather region
  int64_t chunk_slot;          // bytes of one (set, src|owner) chunk slot, both regions
  int64_t chunk_set_stride;    // world * chunk_slot
  int64_t chunk_cap_packs;     // largest two-shot chunk, packs (= two-shot capacity / world)
  int64_t total;               // bytes of the whole buffer
};

__host__ __device__ constexpr int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// oneshot_cap: multiple of kPackBytes; twoshot_cap: multiple of kPackBytes * world (both may be 0).
__host__ __device__ inline Layout make_layout(int world, int64_t oneshot_cap, int64_t twoshot_cap) {
  Layout L{};
  L.oneshot_off = kHeaderBytes;
  L.oneshot_cap_packs = oneshot_cap / kPackBytes;
  L.oneshot_slot = round_up(L.oneshot_cap_packs * kLLPackBytes, kAlign);
  L.oneshot_set_stride = world * L.oneshot_slot;
  L.chunk_cap_packs = twoshot_cap / (int64_t{kPackBytes} * world);
  L.chunk_slot = round_up(L.chunk_cap_packs * kLLPackBytes, kAlign);
  L.chunk_set_stride = world * L.chunk_slot;
  L.rs_off = L.oneshot_off + kNumSets * L.oneshot_set_stride;
  L.ag_off = L.rs_off + kNumSets * L.chunk_set_stride;
  L.total = L.ag_off + kNumSets * L.chunk_set_stride;
  return L;
}

// Blocks for a kernel whose threads each own `work_packs / grid` packs: every block gets at least one
// pack, which the reuse argument needs (every block of a call waits on every peer).
__host__ __device__ constexpr int grid_for(int64_t work_packs) {
  return work_packs <= 0 ? 1
                         : static_cast<int>((work_packs + kThreads - 1) / kThreads < kMaxBlocks
                                                ? (work_packs + kThreads - 1) / kThreads
                                                : kMaxBlocks);
}

struct Params {
  char* peers[kMaxWorld];  // every rank's shared buffer, mapped here (peers[rank] is ours)
  const uint4* in;         // npacks packs
  uint4* out;              // npacks packs; may equal `in`
  uint32_t* epochs;        // kMaxBlocks copies of this rank's last epoch (all equal between calls)
  int* err;                // kErrWords, host-mapped
  Layout layout;
  int64_t npacks;
  uint64_t timeout_ns;
  uint32_t refresh_mask;   // 2^k - 1
  int rank;
  int trap_on_timeout;     // after recording a timeout: 1 = __trap() (sticky context error), 0 = return
};

// ---- Memory access primitives ----

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One 16-byte line {d0, e, d1, e} as two 64-bit relaxed.sys elements; each element is single-copy atomic.
__device__ __forceinline__ void st_ll_line(char* addr, uint32_t d0, uint32_t d1, uint32_t e) {
  const uint64_t x = (uint64_t{e} << 32) | d0;
  const uint64_t y = (uint64_t{e} << 32) | d1;
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(addr), "l"(x), "l"(y) : "memory");
}

__device__ __forceinline__ void st_ll_pack(char* addr, const uint4& v, uint32_t e) {
  st_ll_line(addr, v.x, v.y, e);
  st_ll_line(addr + 16, v.z, v.w, e);
}

// True when all four words of the pack carry epoch e; `v` then holds the payload stored with them.
__device__ __forceinline__ bool ld_ll_pack(const char* addr, uint32_t e, uint4& v) {
  uint64_t a, b, c, d;
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(addr) : "memory");
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(c), "=l"(d) : "l"(addr + 16) : "memory");
  v = make_uint4(static_cast<uint32_t>(a), static_cast<uint32_t>(b), static_cast<uint32_t>(c),
                 static_cast<uint32_t>(d));
  return static_cast<uint32_t>(a >> 32) == e && static_cast<uint32_t>(b >> 32) == e &&
         static_cast<uint32_t>(c >> 32) == e && static_cast<uint32_t>(d >> 32) == e;
}

enum WaitStatus : int { kReady = 0, kTimedOut = 1, kAborted = 2 };

// Bounded spin: kTimedOut after timeout_ns of wall time (%globaltimer keeps counting while the context is
// time-sliced out), kAborted as soon as another thread of the block timed out.
__device__ __forceinline__ int wait_ll_pack(const char* addr, uint32_t e, uint4& v, uint64_t timeout_ns,
                                            volatile int* abort_flag) {
  if (ld_ll_pack(addr, e, v)) return kReady;
  const uint64_t t0 = globaltimer_ns();
  for (uint32_t spin = 1;; ++spin) {
    if (ld_ll_pack(addr, e, v)) return kReady;
    if (spin % kSpinsPerTimerRead == 0) {
      if (*abort_flag) return kAborted;
      if (globaltimer_ns() - t0 > timeout_ns) return kTimedOut;
    }
  }
}

// Fields first, status last, each flushed to the host before the next.
__device__ inline void report_timeout(const Params& p, int missing, uint32_t e, int phase,
                                      volatile int* abort_flag) {
  *abort_flag = 1;
  volatile int* err = p.err;
  err[kErrRank] = p.rank;
  err[kErrMissing] = missing;
  err[kErrEpoch] = static_cast<int>(e);
  err[kErrPhase] = phase;
  __threadfence_system();
  err[kErrStatus] = kStatusTimeout;
  __threadfence_system();
}

// ---- fp32 accumulation of one pack (16 bytes of T) ----

template <typename T>
struct PackMath;

template <>
struct PackMath<float> {
  static constexpr int kElems = 4;
  __device__ static void init(float (&acc)[kElems], const uint4& v) {
    acc[0] = __uint_as_float(v.x), acc[1] = __uint_as_float(v.y);
    acc[2] = __uint_as_float(v.z), acc[3] = __uint_as_float(v.w);
  }
  __device__ static void add(float (&acc)[kElems], const uint4& v) {
    acc[0] += __uint_as_float(v.x), acc[1] += __uint_as_float(v.y);
    acc[2] += __uint_as_float(v.z), acc[3] += __uint_as_float(v.w);
  }
  __device__ static uint4 round(const float (&acc)[kElems]) {
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]),
                      __float_as_uint(acc[3]));
  }
};

template <typename Half2Bits>
struct PackMath16 {
  static constexpr int kElems = 8;
  __device__ static void init(float (&acc)[kElems], const uint4& v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[2 * i] = Half2Bits::lo(w[i]), acc[2 * i + 1] = Half2Bits::hi(w[i]);
  }
  __device__ static void add(float (&acc)[kElems], const uint4& v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[2 * i] += Half2Bits::lo(w[i]), acc[2 * i + 1] += Half2Bits::hi(w[i]);
  }
  __device__ static uint4 round(const float (&acc)[kElems]) {
    return make_uint4(Half2Bits::pack(acc[0], acc[1]), Half2Bits::pack(acc[2], acc[3]),
                      Half2Bits::pack(acc[4], acc[5]), Half2Bits::pack(acc[6], acc[7]));
  }
};

struct Bf16Bits {
  __device__ static float lo(uint32_t w) { return __uint_as_float(w << 16); }
  __device__ static float hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }
  __device__ static uint32_t pack(float lo, float hi) {
    return uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(lo))} |
           (uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(hi))} << 16);
  }
};

struct F16Bits {
  __device__ static float lo(uint32_t w) { return __half2float(__ushort_as_half(static_cast<unsigned short>(w))); }
  __device__ static float hi(uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  __device__ static uint32_t pack(float lo, float hi) {
    return uint32_t{__half_as_ushort(__float2half_rn(lo))} | (uint32_t{__half_as_ushort(__float2half_rn(hi))} << 16);
  }
};

template <>
struct PackMath<__nv_bfloat16> : PackMath16<Bf16Bits> {};
template <>
struct PackMath<__half> : PackMath16<F16Bits> {};

// ---- Kernel pieces ----

template <int W>
__device__ __forceinline__ int peer_at(int rank, int step) {  // (rank + step) % W, step in [1, W)
  const int d = rank + step;
  return d >= W ? d - W : d;
}

// Epoch of this call. Every block keeps its own copy (index blockIdx.x), so no block reads a word that
// another block of the same kernel writes (finish() writes indices = blockIdx.x mod gridDim.x).
__device__ __forceinline__ uint32_t begin_call(const Params& p, volatile int* abort_flag) {
  if (threadIdx.x == 0) *abort_flag = 0;
  __syncthreads();
  return next_epoch(p.epochs[blockIdx.x]);
}

__device__ __forceinline__ void finish_call(const Params& p, uint32_t e, volatile int* abort_flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (*abort_flag && p.trap_on_timeout) __trap();
    for (int i = blockIdx.x; i < kMaxBlocks; i += gridDim.x) p.epochs[i] = e;
  }
}

// Writes epoch-e zero packs [from, to) of this rank's slot (at byte offset slot_off of every peer buffer).
template <int W>
__device__ void refresh_slots(const Params& p, int64_t slot_off, int64_t from, int64_t to, uint32_t e) {
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = from + int64_t{blockIdx.x} * kThreads + threadIdx.x; i < to; i += stride) {
#pragma unroll
    for (int k = 1; k < W; ++k) st_ll_pack(p.peers[peer_at<W>(p.rank, k)] + slot_off + i * kLLPackBytes, zero, e);
  }
}

// On a refresh epoch: every slot of set s that this rank writes, except the packs that carry data in
// this call ([0, oneshot_used) of the one-shot slot, [0, chunk_used) of both chunk slots).
template <int W>
__device__ void refresh_set(const Params& p, uint32_t e, int64_t oneshot_used, int64_t chunk_used) {
  const Layout& L = p.layout;
  const int s = set_of(e);
  refresh_slots<W>(p, L.oneshot_off + s * L.oneshot_set_stride + p.rank * L.oneshot_slot, oneshot_used,
                   L.oneshot_cap_packs, e);
  refresh_slots<W>(p, L.rs_off + s * L.chunk_set_stride + p.rank * L.chunk_slot, chunk_used, L.chunk_cap_packs, e);
  refresh_slots<W>(p, L.ag_off + s * L.chunk_set_stride + p.rank * L.chunk_slot, chunk_used, L.chunk_cap_packs, e);
}

// ---- One-shot: grid_for(npacks) blocks of kThreads ----
template <typename T, int W>
__global__ void __launch_bounds__(kThreads) oneshot_kernel(const Params p) {
  using M = PackMath<T>;
  __shared__ int abort_storage;
  volatile int* abort_flag = &abort_storage;
  const uint32_t e = begin_call(p, abort_flag);
  const int s = set_of(e);
  const Layout& L = p.layout;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x;

  // 1. Push: my input -> slot [src = rank] of set s of every peer.
  const int64_t my_slot = L.oneshot_off + s * L.oneshot_set_stride + p.rank * L.oneshot_slot;
  for (int64_t i = first; i < p.npacks; i += stride) {
    const uint4 v = p.in[i];
#pragma unroll
    for (int k = 1; k < W; ++k) st_ll_pack(p.peers[peer_at<W>(p.rank, k)] + my_slot + i * kLLPackBytes, v, e);
  }
  if (is_refresh_epoch(e, p.refresh_mask)) refresh_set<W>(p, e, p.npacks, 0);

  // 2. Poll the W-1 slots of set s in my buffer and sum in rank order.
  const char* recv = p.peers[p.rank] + L.oneshot_off + s * L.oneshot_set_stride;
  for (int64_t i = first; i < p.npacks; i += stride) {
    float acc[M::kElems];
    bool ok = true;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      uint4 v;
      if (j == p.rank) {
        v = p.in[i];
      } else {
        const int st = wait_ll_pack(recv + j * L.oneshot_slot + i * kLLPackBytes, e, v, p.timeout_ns, abort_flag);
        if (st != kReady) {
          if (st == kTimedOut) report_timeout(p, j, e, kPhaseOneShot, abort_flag);
          ok = false;
          break;
        }
      }
      if (j == 0) M::init(acc, v);
      else M::add(acc, v);
    }
    if (!ok) break;
    p.out[i] = M::round(acc);
  }
  finish_call(p, e, abort_flag);
}

// ---- Two-shot: npacks % W == 0, chunk C = npacks / W; grid_for(C) blocks of kThreads ----
template <typename T, int W>
__global__ void __launch_bounds__(kThreads) twoshot_kernel(const Params p) {
  using M = PackMath<T>;
  __shared__ int abort_storage;
  volatile int* abort_flag = &abort_storage;
  const uint32_t e = begin_call(p, abort_flag);
  const int s = set_of(e);
  const Layout& L = p.layout;
  const int64_t C = p.npacks / W;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  const int64_t my_rs = L.rs_off + s * L.chunk_set_stride + p.rank * L.chunk_slot;
  const int64_t my_ag = L.ag_off + s * L.chunk_set_stride + p.rank * L.chunk_slot;

  // 1. Reduce-scatter push: my chunk `dst` -> slot [src = rank] of rank dst's reduce-scatter set s.
  for (int64_t k = first; k < C; k += stride) {
#pragma unroll
    for (int step = 1; step < W; ++step) {
      const int dst = peer_at<W>(p.rank, step);
      st_ll_pack(p.peers[dst] + my_rs + k * kLLPackBytes, p.in[dst * C + k], e);
    }
  }
  if (is_refresh_epoch(e, p.refresh_mask)) refresh_set<W>(p, e, 0, C);

  // 2. Reduce my chunk in rank order, write it, push it to slot [owner = rank] of every all-gather set s.
  const char* own = p.peers[p.rank];
  bool ok = true;
  for (int64_t k = first; k < C && ok; k += stride) {
    float acc[M::kElems];
#pragma unroll
    for (int j = 0; j < W; ++j) {
      uint4 v;
      if (j == p.rank) {
        v = p.in[p.rank * C + k];
      } else {
        const int st = wait_ll_pack(own + L.rs_off + s * L.chunk_set_stride + j * L.chunk_slot + k * kLLPackBytes,
                                    e, v, p.timeout_ns, abort_flag);
        if (st != kReady) {
          if (st == kTimedOut) report_timeout(p, j, e, kPhaseReduceScatter, abort_flag);
          ok = false;
          break;
        }
      }
      if (j == 0) M::init(acc, v);
      else M::add(acc, v);
    }
    if (!ok) break;
    const uint4 r = M::round(acc);
    p.out[p.rank * C + k] = r;
#pragma unroll
    for (int step = 1; step < W; ++step) st_ll_pack(p.peers[peer_at<W>(p.rank, step)] + my_ag + k * kLLPackBytes, r, e);
  }

  // 3. All-gather: the other owners' reduced chunks.
  for (int64_t k = first; k < C && ok; k += stride) {
#pragma unroll
    for (int step = 1; step < W; ++step) {
      const int j = peer_at<W>(p.rank, step);
      uint4 v;
      const int st = wait_ll_pack(own + L.ag_off + s * L.chunk_set_stride + j * L.chunk_slot + k * kLLPackBytes,
                                  e, v, p.timeout_ns, abort_flag);
      if (st != kReady) {
        if (st == kTimedOut) report_timeout(p, j, e, kPhaseAllGather, abort_flag);
        ok = false;
        break;
      }
      p.out[j * C + k] = v;
    }
  }
  finish_call(p, e, abort_flag);
}

}  // namespace kog::ar
