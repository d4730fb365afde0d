// Latency of the monokernel's dependent accesses while the other SMs stream weights (standalone; no torch).
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
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/latency_probe benchmarks/probes/latency_under_stream.cu
//   /tmp/latency_probe            (prints one row per ring depth, 0 = no stream)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

constexpr int kSlot = 32 * 1024;
constexpr int kChase = 64 * 1024 / 4;  // words in the chase table
constexpr int kHops = 512;
constexpr uint64_t kSpinNs = 200000000;  // every spin gives up after 200 ms (a probe must not hang the device)

struct Args {
  const uint8_t* w;
  uint64_t w_chunks;
  uint32_t* table;    // kChase words: a random cycle
  uint32_t* flags;    // [0] stop, [8] ping, [16] pong, [24] atom word, [32..] flush area
  unsigned long long* bytes;  // bytes completed by the loaders (one atomic per block at the end)
  double* out;        // results in ns
  int slots;
  int probe_streams;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t ld_acq(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_rlx(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_rel(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t atom_ar(uint32_t* p, uint32_t v) {
  uint32_t o;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(o) : "l"(p), "r"(v) : "memory");
  return o;
}

__device__ void stream(const Args& a, uint64_t* full, uint8_t* ring) {
  const int G = gridDim.x, b = blockIdx.x;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  uint64_t c = b, done = 0;
  uint32_t phase_bits = 0;  // bit s: parity of slot s's next completion
  int issued = 0;
  for (int it = 0;; ++it) {
    const int s = it % a.slots;
    if (ld_rlx(a.flags) != 0u) break;  // (before the wait: the drain below waits for every copy not yet waited)
    if (issued >= a.slots) {  // wait for this slot's previous copy
      const uint32_t par = (phase_bits >> s) & 1u;
      for (const uint64_t ts = gtime(); gtime() - ts < kSpinNs;) {
        uint32_t ok;
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0,1,0,p; }"
                     : "=r"(ok) : "r"(smem_u32(&full[s])), "r"(par) : "memory");
        if (ok) break;
      }
      phase_bits ^= 1u << s;
      done += kSlot;
      if ((done & (8ull * kSlot - 1)) == 0) {  // publish progress every 8 chunks for the probe window's GB/s
        atomicAdd(a.bytes, 8ull * kSlot);
        done = 0;
      }
    }
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&full[s])), "r"(kSlot) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            smem_u32(ring + static_cast<size_t>(s) * kSlot)),
        "l"(a.w + (c % a.w_chunks) * kSlot), "r"(kSlot), "r"(smem_u32(&full[s])), "l"(policy)
        : "memory");
    ++issued;
    c += G;
  }
  // Drain what is still in flight before the block exits: the last min(slots, issued) copies.
  for (int k = 0; k < a.slots && k < issued; ++k) {
    const int s = (issued - 1 - k) % a.slots;
    const uint32_t par = (phase_bits >> s) & 1u;
    for (const uint64_t ts = gtime(); gtime() - ts < kSpinNs;) {
      uint32_t ok;
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0,1,0,p; }"
                   : "=r"(ok) : "r"(smem_u32(&full[s])), "r"(par) : "memory");
      if (ok) break;
    }
  }
}

__global__ void __launch_bounds__(64, 1) probe(Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint8_t* ring = smem + 1024;
  const int b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 6; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[i])) : "memory");
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
      while ((v = ld_acq(ping)) < i && ld_rlx(a.flags) == 0u && gtime() - t0 < kSpinNs) {
      }
      if (v < i) return;
      st_rel(pong, i);
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
  for (int i = 0; i < kHops; ++i) j = ld_acq(a.table + j);
  t1 = gtime();
  a.out[1] = double(t1 - t0) / kHops;
  uint32_t* aw = a.flags + 24;
  uint32_t acc = j;
  t0 = gtime();
  for (int i = 0; i < kHops; ++i) acc += atom_ar(aw, acc & 1u);
  t1 = gtime();
  a.out[2] = double(t1 - t0) / kHops;
  uint32_t* fl = a.flags + 32;
  t0 = gtime();
  for (int i = 0; i < kHops / 4; ++i) {
    for (int k = 0; k < 64; ++k) fl[k * 8] = acc + k;  // 64 stores, one per 32 B sector
    acc += atom_ar(aw, 1u);
  }
  t1 = gtime();
  a.out[3] = double(t1 - t0) / (kHops / 4);
  t0 = gtime();
  for (uint32_t i = 1; i <= 256; ++i) {
    st_rel(ping, i);
    const uint64_t ts = gtime();
    while (ld_acq(pong) < i && gtime() - ts < kSpinNs) {
    }
  }
  t1 = gtime();
  a.out[4] = double(t1 - t0) / 256;
  a.out[5] = double(*reinterpret_cast<volatile unsigned long long*>(a.bytes) - bytes0) / double(t1 - w0);  // GB/s
  a.out[6] = acc;
  st_rel(a.flags, 1u);
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
