// Can a few SMs that only prefetch weights into L2 keep HBM busy while the others wait on a dependency chain?
// (standalone; no torch; the monokernel's own primitives from csrc/include/kog/sync.cuh)
//
// The monokernel's loader can run at most one ring (6 x 32 KiB) ahead of its consumers, so a hand-off chain
// longer than ~6 us leaves that SM's share of HBM idle. This probe emulates a step: W = G - P worker blocks, each a
// loader lane (the kernel's ring: `slots` slots, at most `inflight` bulk copies in flight) and one consumer lane
// that takes each chunk, spins `work` ns (a chunk's math and sums, ~0.6 us measured) and frees the slot; every
// `period` chunks it makes a hand-off (64 stores then a release add, timed) and spins `bubble` ns (the rest of
// the chain). Worker b streams chunks n = k W + b of a 4 GiB buffer, so all workers together walk it in address
// order. The P feeder blocks issue cp.async.bulk.prefetch.L2 for chunks n = f, f + P, ... while n is less than
// `lead` chunks past the chunks consumed so far (a relaxed counter the consumers add to every 8 chunks).
// The total chunk count is fixed (448 per SM = 14 MiB per SM, about one Llama-3.2-1B step), so fewer workers
// each take more. Printed: the step (slowest worker), its bytes over that time, and the mean release.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc/include -o /tmp/l2_feeder benchmarks/probes/l2_feeder.cu
//   /tmp/l2_feeder
// (group: chunks per prefetch instruction; feeders wait while the first chunk of the next group is `lead` or more
// chunks past the consumed count.)
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "check.cuh"
#include "kog/sync.cuh"
#include "kog/trace.cuh"

constexpr int kSlot = 32 * 1024;
constexpr int kMaxSlots = 6;
constexpr uint64_t kSpinNs = 200000000;  // every wait gives up after 200 ms (a probe must not hang the device)

struct Args {
  const uint8_t* w;
  uint64_t w_chunks;
  uint32_t* flags;  // [0] chunks consumed (all workers), [32..] hand-off counter and store area
  double* out;      // [b] ns from start to this worker's last chunk; [G + b] mean release ns
  int feeders, lead, chunks, period, bubble_ns, work_ns, inflight, slots;
  int group;        // chunks per prefetch instruction
};

__device__ __forceinline__ uint64_t gtime() { return kog::global_ns(); }

__device__ __forceinline__ void spin_ns(uint32_t ns) {
  for (const uint64_t t = gtime(); gtime() - t < ns;) {
  }
}

__device__ __forceinline__ void wait_bar(uint64_t* bar, uint32_t parity) {
  for (const uint64_t t = gtime(); gtime() - t < kSpinNs;) {
    if (kog::mbar_try_wait(bar, parity)) return;
  }
}

__global__ void __launch_bounds__(64, 1) probe(Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxSlots;
  uint8_t* ring = smem + 1024;
  const int G = gridDim.x, b = blockIdx.x, W = G - a.feeders;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kMaxSlots; ++i) {
      kog::mbar_init(&full[i], 1u);
      kog::mbar_init(&empty[i], 1u);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (lane != 0) return;
  uint32_t* consumed = a.flags;
  const uint64_t t0 = gtime();
  if (b >= W) {  // feeder
    if (warp != 0) return;
    const uint64_t total = uint64_t(W) * a.chunks;  // < w_chunks: no wrap
    for (uint64_t n = uint64_t(b - W) * a.group; n < total; n += uint64_t(a.feeders) * a.group) {
      for (const uint64_t ts = gtime(); n >= uint64_t(kog::ld_relaxed(consumed)) + a.lead && gtime() - ts < kSpinNs;) {
      }
      kog::bulk_prefetch_l2(a.w + n * kSlot, uint32_t(kSlot) * uint32_t(min(uint64_t(a.group), total - n)));
    }
    return;
  }
  if (warp == 1) {  // loader
    const uint64_t policy = kog::l2_evict_first_policy();
    for (int k = 0; k < a.chunks; ++k) {
      const int s = k % a.slots;
      if (k >= a.slots) wait_bar(&empty[s], ((k / a.slots) - 1) & 1);
      if (a.inflight > 0 && k >= a.inflight) {
        const int j = k - a.inflight;
        wait_bar(&full[j % a.slots], (j / a.slots) & 1);
      }
      const uint64_t n = uint64_t(k) * W + b;
      kog::mbar_arrive_expect_tx(&full[s], kSlot);
      kog::bulk_copy_g2s(ring + size_t(s) * kSlot, a.w + (n % a.w_chunks) * kSlot, kSlot, &full[s], policy);
    }
    return;
  }
  // consumer
  uint32_t* handoff = a.flags + 32;
  uint32_t* store_area = a.flags + 64 + 64 * 8 * (b % 64);
  double rel_ns = 0;
  int rels = 0;
  for (int k = 0; k < a.chunks; ++k) {
    const int s = k % a.slots;
    wait_bar(&full[s], (k / a.slots) & 1);
    if (a.work_ns > 0) spin_ns(a.work_ns);
    kog::mbar_arrive(&empty[s]);
    if ((k & 7) == 7 || k == a.chunks - 1) kog::red_relaxed_add(consumed, (k & 7) + 1u);
    if (a.period > 0 && k % a.period == a.period - 1) {
      const uint64_t r0 = gtime();
      for (int i = 0; i < 64; ++i) store_area[i * 8] = k + i;
      kog::red_release_add(handoff, 1u);
      const uint64_t r1 = gtime();
      rel_ns += double(r1 - r0);
      ++rels;
      if (a.bubble_ns > 0) spin_ns(a.bubble_ns);
    }
  }
  a.out[b] = double(gtime() - t0);
  a.out[G + b] = rels ? rel_ns / rels : 0.0;
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  int nsm = 0;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  const size_t wbytes = size_t(4) << 30;
  uint8_t* w;
  CK(cudaMalloc(&w, wbytes));
  CK(cudaMemset(w, 1, wbytes));
  uint32_t* flags;
  double* out;
  CK(cudaMalloc(&flags, 1 << 20));
  CK(cudaMallocManaged(&out, 2 * nsm * sizeof(double)));
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024 + kMaxSlots * kSlot));
  const int total = 448 * nsm;  // chunks per step
  printf("SMs %d; %d chunks of 32 KiB per step (%.1f MiB); consumer work per chunk / bubble every 28 chunks in ns\n",
         nsm, total, total / 32.0);
  printf("%-5s %-6s %-6s %-5s %-7s %-8s %9s %8s %9s\n", "P", "lead", "group", "work", "bubble", "inflight",
         "step us", "GB/s", "release");
  struct Cfg {
    int P, lead, group, work, bubble, inflight;
  };
  const Cfg cfgs[] = {
      {0, 0, 1, 0, 0, 2},          {0, 0, 1, 600, 0, 2},        {8, 512, 1, 600, 0, 2},
      {0, 0, 1, 600, 6000, 2},     {0, 0, 1, 600, 6000, 0},     {8, 512, 1, 600, 6000, 2},
      {16, 512, 1, 600, 6000, 2},  {16, 1024, 1, 600, 6000, 2}, {16, 1024, 4, 600, 6000, 2},
      {0, 0, 1, 600, 11000, 2},    {4, 1024, 4, 600, 11000, 2}, {8, 512, 1, 600, 11000, 2},
      {8, 1024, 4, 600, 11000, 2}, {16, 512, 1, 600, 11000, 2}, {16, 1024, 1, 600, 11000, 2},
      {16, 1024, 4, 600, 11000, 2}, {24, 1024, 4, 600, 11000, 2}, {32, 1024, 4, 600, 11000, 2},
      {16, 1024, 4, 600, 11000, 0}, {16, 1024, 4, 300, 11000, 2}, {0, 0, 1, 300, 11000, 2},
  };
  for (const Cfg& c : cfgs) {
    const int W = nsm - c.P;
    const int chunks = (total + W - 1) / W;
    double best = 1e30, rel = 0;
    for (int rep = 0; rep < 3; ++rep) {
      CK(cudaMemset(flags, 0, 1 << 20));
      Args a{w, wbytes / kSlot, flags, out, c.P, c.lead, chunks, 28, c.bubble, c.work, c.inflight, kMaxSlots, c.group};
      probe<<<nsm, 64, 1024 + kMaxSlots * kSlot>>>(a);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      double step = 0, r = 0;
      for (int i = 0; i < W; ++i) {
        step = out[i] > step ? out[i] : step;
        r += out[nsm + i];
      }
      if (step < best) {
        best = step;
        rel = r / W;
      }
    }
    printf("%-5d %-6d %-6d %-5d %-7d %-8d %9.1f %8.0f %9.0f\n", c.P, c.lead, c.group, c.work, c.bubble, c.inflight,
           best / 1e3, double(total) * kSlot / best, rel);
  }
  return 0;
}
