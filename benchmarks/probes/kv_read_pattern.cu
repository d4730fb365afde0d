// Read bandwidth of a decode attention's K / V access patterns over a paged cache (standalone; no torch): does the
// way the monokernel splits a layer's context over SMs (one KV head's position range per block) let HBM stream at
// the copy rate?
//
// A cache of `layers` layers in the V2 model runner's layout, K and V of a position and head side by side (a row of
// 2 D bf16): [blocks][16 positions][nkv heads][2 D] in memory (NHD, vLLM's default) or [blocks][nkv][16][2 D] (HND),
// identity block table; each rep reads one layer (rep r: layer r % layers, so the reps together exceed L2 and every
// read comes from HBM). Patterns, 128 blocks of 256 threads, each thread keeping `unroll` 16-byte loads in flight
// before it sums them (the tensor-core attention pass keeps 16 per lane):
//   head    block b = (head b / S, split b % S): positions [s P / S, (s + 1) P / S) of one KV head: per position one
//           4 D-byte row (256 B at D 64) out of the position's nkv rows (the monokernel's split)
//   pos     block b: positions [b P / 128, (b + 1) P / 128) of every head: contiguous bytes (the copy rate's pattern)
// Prints GB/s per pattern, layout, head dim, context and unroll.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/kv_probe benchmarks/probes/kv_read_pattern.cu && /tmp/kv_probe
#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "check.cuh"

constexpr int kThreads = 256;
constexpr int kGrid = 128;
constexpr int kBs = 16;

struct Cfg {
  const uint4* k;  // one layer's cache (16-byte units)
  int P, nkv, D, hnd;
  float* sink;
};

__device__ __forceinline__ uint4 ld_cg(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ float fold(uint4 a) {
  return __uint_as_float(a.x & 0x3f7fffffu) + __uint_as_float(a.w & 0x3f7fffffu);
}

// Element offset (16-byte units) of (position p, head h, vector j of the row).
__device__ __forceinline__ int64_t unit_of(const Cfg& c, int p, int h, int j) {
  const int vpr = c.D / 4;  // 16-byte vectors per row (K and V: 2 D bf16)
  const int64_t blk = p / kBs, off = p % kBs;
  const int64_t row = c.hnd ? (blk * c.nkv + h) * kBs + off : (blk * kBs + off) * c.nkv + h;
  return row * vpr + j;
}

template <int U>
__global__ void __launch_bounds__(kThreads) head_split(Cfg c) {
  const int S = kGrid / c.nkv, h = blockIdx.x / S, s = blockIdx.x % S;
  const int p0 = static_cast<int>(static_cast<int64_t>(s) * c.P / S), p1 = static_cast<int>(static_cast<int64_t>(s + 1) * c.P / S);
  const int vpr = c.D / 4, rows_per_pass = kThreads / vpr;
  const int r = threadIdx.x / vpr, j = threadIdx.x % vpr;
  float acc = 0.f;
  for (int base = p0; base < p1; base += U * rows_per_pass) {
    uint4 kk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = base + u * rows_per_pass + r;
      kk[u] = p < p1 ? ld_cg(c.k + unit_of(c, p, h, j)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc += fold(kk[u]);
  }
  if (acc == 1.2345f) c.sink[blockIdx.x] = acc;  // never true for the data written; keeps the loads
}

template <int U>
__global__ void __launch_bounds__(kThreads) pos_split(Cfg c) {
  const int64_t units = static_cast<int64_t>(c.P) * c.nkv * c.D / 4;
  const int64_t u0 = blockIdx.x * units / kGrid, u1 = (blockIdx.x + 1) * units / kGrid;
  float acc = 0.f;
  for (int64_t base = u0; base < u1; base += U * kThreads) {
    uint4 kk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      kk[u] = i < u1 ? ld_cg(c.k + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc += fold(kk[u]);
  }
  if (acc == 1.2345f) c.sink[blockIdx.x] = acc;
}

template <class K>
static double time_gbs(K kernel, Cfg c, const uint4* base, int64_t layer_units, int layers, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < layers; ++r) {  // warm-up
    c.k = base + r * layer_units;
    kernel<<<kGrid, kThreads>>>(c);
  }
  CK(cudaEventRecord(a));
  for (int r = 0; r < reps; ++r) {
    c.k = base + (r % layers) * layer_units;
    kernel<<<kGrid, kThreads>>>(c);
  }
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0.f;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  return layer_units * 16.0 * reps / (ms * 1e-3) / 1e9;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs; grid %d x %d threads; GB/s of K and V read (one layer per launch, layers rotating past L2)\n",
         prop.name, prop.multiProcessorCount, kGrid, kThreads);
  printf("%-6s %-4s %4s %4s %7s %6s %9s\n", "split", "lay", "nkv", "D", "ctx", "unroll", "GB/s");
  float* sink;
  CK(cudaMalloc(&sink, kGrid * sizeof(float)));
  const size_t budget = size_t(8) << 30;  // bytes of cache allocated per case (K + V, all layers)
  struct Shape { int nkv, D; };
  for (Shape sh : {Shape{8, 64}, Shape{8, 128}}) {
    for (int P : {16384, 65536}) {
      const int64_t layer_units = static_cast<int64_t>(P) * sh.nkv * sh.D / 4;
      const int layers = static_cast<int>(std::min<size_t>(32, budget / (layer_units * 16)));
      uint4* k;
      CK(cudaMalloc(&k, layer_units * 16 * layers));
      CK(cudaMemset(k, 0x11, layer_units * 16 * layers));
      const int reps = 4 * layers;
      for (int hnd = 0; hnd < 2; ++hnd) {
        Cfg c{k, P, sh.nkv, sh.D, hnd, sink};
        const char* lay = hnd ? "HND" : "NHD";
        printf("%-6s %-4s %4d %4d %7d %6d %9.0f\n", "head", lay, sh.nkv, sh.D, P, 4,
               time_gbs(head_split<4>, c, k, layer_units, layers, reps));
        printf("%-6s %-4s %4d %4d %7d %6d %9.0f\n", "head", lay, sh.nkv, sh.D, P, 8,
               time_gbs(head_split<8>, c, k, layer_units, layers, reps));
        printf("%-6s %-4s %4d %4d %7d %6d %9.0f\n", "head", lay, sh.nkv, sh.D, P, 16,
               time_gbs(head_split<16>, c, k, layer_units, layers, reps));
      }
      Cfg c{k, P, sh.nkv, sh.D, 0, sink};
      printf("%-6s %-4s %4d %4d %7d %6d %9.0f\n", "pos", "-", sh.nkv, sh.D, P, 4,
             time_gbs(pos_split<4>, c, k, layer_units, layers, reps));
      printf("%-6s %-4s %4d %4d %7d %6d %9.0f\n", "pos", "-", sh.nkv, sh.D, P, 8,
             time_gbs(pos_split<8>, c, k, layer_units, layers, reps));
      CK(cudaFree(k));
    }
  }
  return 0;
}
