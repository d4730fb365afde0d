// Latency of the monokernel's dependent accesses while the other SMs stream weights (standalone; no torch; the
// kernel's own primitives from csrc/include/kog/sync.cuh).
//
// Blocks 2..G-1 (and block 0 in the probeSM = 1 rows) run the monokernel's loader pattern: one lane keeps `slots`
// bulk copies of 32 KiB in flight into shared memory from a 4 GiB buffer (chunk c of block b: c = b + k G).
// Block 0 measures, after a 30 us warm-up, each as the mean of a dependent chain:
//   chase   ld.global.cg pointer chase over a 64 KiB L2-resident table
//   acq     ld.acquire.gpu of that table (same chase, acquire loads)
//   atom    atom.acq_rel.gpu.add chain on one word
//   flush   256 B of st.global then atom.acq_rel (the release waits for the stores)
//   pingpong  block 0 st.release / block 1 ld.acquire poll and answer: one round trip (two hand-offs)
// and the stream's bandwidth over block 0's measurement window (copies completed, published every 8 chunks).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc/include -o /tmp/latency_probe benchmarks/probes/latency_under_stream.cu
//   /tmp/latency_probe            (prints one row per ring depth, 0 = no stream)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"
#include "kog/sync.cuh"
#include "kog/trace.cuh"

using kog::atom_acq_rel_add;
using kog::ld_acquire;
using kog::ld_relaxed;
using kog::st_release;

constexpr int kSlot = 32 * 1024;
constexpr int kChase = 64 * 1024 / 4;  // words in the chase table
constexpr int kHops = 512;
constexpr uint64_t kSpinNs = 200000000;  // every spin gives up after 200 ms (a probe must not hang the device)

struct Args {
  const uint8_t* w;
  uint64_t w_chunks;
  uint32_t* table;    // kChase words: a random cycle
  uint32_t* flags;    // [0] stop, [8] ping, [16] pong, [24] atom word, [32..] flush area
  unsigned long long* bytes;  // bytes completed by the loaders (each adds its count every 8 chunks)
  double* out;        // results in ns
  int slots;
  int probe_streams;
};

__device__ __forceinline__ uint64_t gtime() { return kog::global_ns(); }

// Waits for the completion of slot s's phase with parity `par` (gives up after kSpinNs).
__device__ __forceinline__ void wait_slot(uint64_t* full, int s, uint32_t par) {
  for (const uint64_t ts = gtime(); gtime() - ts < kSpinNs;) {
    if (kog::mbar_try_wait(&full[s], par)) return;
  }
}

__device__ void stream(const Args& a, uint64_t* full, uint8_t* ring) {
  const int G = gridDim.x, b = blockIdx.x;
  const uint64_t policy = kog::l2_evict_first_policy();
  uint64_t c = b, done = 0;
  uint32_t phase_bits = 0;  // bit s: parity of slot s's next completion
  int issued = 0;
  for (int it = 0;; ++it) {
    const int s = it % a.slots;
    if (ld_relaxed(a.flags) != 0u) break;  // (before the wait: the drain below waits for every copy not yet waited)
    if (issued >= a.slots) {  // wait for this slot's previous copy
      wait_slot(full, s, (phase_bits >> s) & 1u);
      phase_bits ^= 1u << s;
      done += kSlot;
      if ((done & (8ull * kSlot - 1)) == 0) {  // publish progress every 8 chunks for the probe window's GB/s
        atomicAdd(a.bytes, 8ull * kSlot);
        done = 0;
      }
    }
    kog::mbar_arrive_expect_tx(&full[s], kSlot);
    kog::bulk_copy_g2s(ring + static_cast<size_t>(s) * kSlot, a.w + (c % a.w_chunks) * kSlot, kSlot, &full[s], policy);
    ++issued;
    c += G;
  }
  // Drain what is still in flight before the block exits: the last min(slots, issued) copies.
  for (int k = 0; k < a.slots && k < issued; ++k) {
    const int s = (issued - 1 - k) % a.slots;
    wait_slot(full, s, (phase_bits >> s) & 1u);
  }
}

__global__ void __launch_bounds__(64, 1) probe(Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint8_t* ring = smem + 1024;
  const int b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 6; ++i) kog::mbar_init(&full[i], 1u);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const bool streams = a.slots > 0 && (b >= 2 || (b == 0 && a.probe_streams));
  if (warp == 1) {
    if (lane == 0 && streams) stream(a, full, ring);
    return;
  }
  if (lane != 0) return;
  uint32_t* ping = a.flags + 8;
  uint32_t* pong = a.flags + 16;
  if (b == 1) {  // answers pings until stopped
    for (uint32_t i = 1;; ++i) {
      uint32_t v;
      const uint64_t t0 = gtime();
      while ((v = ld_acquire(ping)) < i && ld_relaxed(a.flags) == 0u && gtime() - t0 < kSpinNs) {
      }
      if (v < i) return;
      st_release(pong, i);
    }
  }
  if (b != 0) return;
  const uint64_t t_start = gtime();
  while (gtime() - t_start < 30000) {
  }
  // chase (cg)
  const unsigned long long bytes0 = *reinterpret_cast<volatile unsigned long long*>(a.bytes);
  const uint64_t w0 = gtime();
  uint32_t j = 0;
  for (int i = 0; i < kChase / 64; ++i) j = __ldcg(a.table + j);  // warm the table into L2
  uint64_t t0 = gtime();
  for (int i = 0; i < kHops; ++i) j = __ldcg(a.table + j);
  uint64_t t1 = gtime();
  a.out[0] = double(t1 - t0) / kHops;
  t0 = gtime();
  for (int i = 0; i < kHops; ++i) j = ld_acquire(a.table + j);
  t1 = gtime();
  a.out[1] = double(t1 - t0) / kHops;
  uint32_t* aw = a.flags + 24;
  uint32_t acc = j;
  t0 = gtime();
  for (int i = 0; i < kHops; ++i) acc += atom_acq_rel_add(aw, acc & 1u);
  t1 = gtime();
  a.out[2] = double(t1 - t0) / kHops;
  uint32_t* fl = a.flags + 32;
  t0 = gtime();
  for (int i = 0; i < kHops / 4; ++i) {
    for (int k = 0; k < 64; ++k) fl[k * 8] = acc + k;  // 64 stores, one per 32 B sector
    acc += atom_acq_rel_add(aw, 1u);
  }
  t1 = gtime();
  a.out[3] = double(t1 - t0) / (kHops / 4);
  t0 = gtime();
  for (uint32_t i = 1; i <= 256; ++i) {
    st_release(ping, i);
    const uint64_t ts = gtime();
    while (ld_acquire(pong) < i && gtime() - ts < kSpinNs) {
    }
  }
  t1 = gtime();
  a.out[4] = double(t1 - t0) / 256;
  a.out[5] = double(*reinterpret_cast<volatile unsigned long long*>(a.bytes) - bytes0) / double(t1 - w0);  // GB/s
  a.out[6] = acc;
  st_release(a.flags, 1u);
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  int dev = 0, nsm = 0;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
  const size_t wbytes = size_t(4) << 30;
  uint8_t* w;
  CK(cudaMalloc(&w, wbytes));
  CK(cudaMemset(w, 1, wbytes));
  std::vector<uint32_t> perm(kChase);
  for (int i = 0; i < kChase; ++i) perm[i] = i;
  srand(7);
  for (int i = kChase - 1; i > 0; --i) std::swap(perm[i], perm[rand() % (i + 1)]);
  std::vector<uint32_t> table(kChase);
  for (int i = 0; i < kChase; ++i) table[perm[i]] = perm[(i + 1) % kChase];
  uint32_t *dt, *flags;
  unsigned long long* bytes;
  double* out;
  CK(cudaMalloc(&dt, kChase * 4));
  CK(cudaMemcpy(dt, table.data(), kChase * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&flags, 4096));
  CK(cudaMalloc(&bytes, 8));
  CK(cudaMallocManaged(&out, 8 * sizeof(double)));
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024 + 6 * kSlot));
  printf("SMs %d; ns per dependent access from block 0 (mean of %d), stream GB/s over the probe window\n", nsm, kHops);
  printf("%-6s %-7s %8s %8s %8s %8s %10s %9s\n", "slots", "probeSM", "chase", "acquire", "atom", "flush", "pingpong",
         "GB/s");
  const int cfg[][2] = {{0, 0}, {1, 0}, {2, 0}, {4, 0}, {6, 0}, {2, 1}, {6, 1}};
  for (auto& c : cfg) {
    for (int rep = 0; rep < 2; ++rep) {
      CK(cudaMemset(flags, 0, 4096));
      CK(cudaMemset(bytes, 0, 8));
      Args a{w, wbytes / kSlot, dt, flags, bytes, out, c[0], c[1]};
      probe<<<nsm, 64, 1024 + (c[0] > 0 ? c[0] : 1) * kSlot>>>(a);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      if (rep == 1)
        printf("%-6d %-7d %8.0f %8.0f %8.0f %8.0f %10.0f %9.0f\n", c[0], c[1], out[0], out[1], out[2], out[3], out[4],
               out[5]);
    }
  }
  return 0;
}
