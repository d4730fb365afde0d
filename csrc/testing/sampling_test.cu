// Test launchers of the sampling building blocks (device code: include/kog/sampling.cuh), compared bit for bit
// with kog_backend/reference/sampling.py and vLLM's Triton kernels by integration_tests/test_sampling_gpu.py. Each op runs
// the same device functions the monokernel's LM-head stage calls; none is on a serving path.
#include <cmath>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kog/philox.cuh"
#include "kog/sampling.cuh"
#include "test_ops.h"

namespace kog {
namespace {

using sampling::RowParams;
using sampling::ScoreKey64;

constexpr int kElemThreads = 256;    // elementwise kernels
constexpr int kRowThreads = 1024;    // one block per row statistic (max, radix select)
constexpr int kSliceThreads = 256;   // one block per vocabulary slice
constexpr int kParamsWords = 8;      // int32 words of the `params` output
static_assert(sizeof(RowParams) <= kParamsWords * sizeof(int32_t), "RowParams fits the params tensor");

void check_cuda(const at::Tensor& t, const char* name, at::ScalarType dtype, const at::Device& dev) {
  TORCH_CHECK(t.is_cuda() && t.device() == dev, "kog sampling test: ", name, " must be on ", dev, ", got ",
              t.device());
  TORCH_CHECK(t.is_contiguous(), "kog sampling test: ", name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == dtype, "kog sampling test: ", name, " must be ", dtype, ", got ", t.scalar_type());
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__global__ void philox_kernel(const int64_t* counters, int64_t n, uint64_t key, int64_t* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const rng::Words c = {static_cast<uint32_t>(counters[i]), static_cast<uint32_t>(counters[n + i]),
                        static_cast<uint32_t>(counters[2 * n + i]), static_cast<uint32_t>(counters[3 * n + i])};
  const rng::Words w = rng::philox4x32_10(c, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
  out[i] = w.w0;
  out[n + i] = w.w1;
  out[2 * n + i] = w.w2;
  out[3 * n + i] = w.w3;
}

__global__ void stream_kernel(int64_t seed, int64_t position, int64_t n, int64_t* key_out, int64_t* words,
                              float* uniform, float* noise, double* uniform64, double* noise64) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint32_t key = rng::row_key(seed, position);
  if (i == 0) key_out[0] = key;
  if (i >= n) return;
  const uint32_t col = static_cast<uint32_t>(i);
  const rng::Words w = rng::column_words(key, col);
  words[i] = w.w0;
  words[n + i] = w.w1;
  words[2 * n + i] = w.w2;
  words[3 * n + i] = w.w3;
  const float u = rng::uniform_f32(key, col);
  uniform[i] = u;
  noise[i] = sampling::gumbel_noise_f32(u);
  const double u64 = rng::uniform_f64(key, col);
  uniform64[i] = u64;
  noise64[i] = sampling::gumbel_noise_f64(u64);
}

// uniform/noise of the 32-bit words first_word + i (mod 2^32): lets a test cover every word.
__global__ void noise_words_kernel(uint32_t first_word, int64_t n, float* uniform, float* noise) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float u = fmaxf(rng::uint_to_uniform(first_word + static_cast<uint32_t>(i)),
                        __uint_as_float(rng::PhiloxConfig::kRand32ScaleBits));
  uniform[i] = u;
  noise[i] = sampling::gumbel_noise_f32(u);
}

struct BeforeCut {
  const __nv_bfloat16* row;
  RowParams p;
  __device__ __nv_bfloat16 operator()(uint32_t col) const { return sampling::before_cut(row[col], p); }
};

// One block: the row's RowParams (min_p threshold from the row max, top-k cut by radix select, or the given cut).
__global__ void __launch_bounds__(kRowThreads)
    row_params_kernel(const __nv_bfloat16* row, uint32_t vocab, float temperature, float min_p, uint32_t top_k,
                      int64_t cut_key, int64_t cut_col, int64_t seed, int64_t position, RowParams* out) {
  __shared__ float red[kRowThreads / 32];
  __shared__ uint32_t hist[sampling::SamplingConfig::kRadixBins];
  __shared__ uint32_t pick[2];
  RowParams p;
  p.temperature = temperature;
  p.min_p_threshold = -INFINITY;
  p.cut = {0u, 0u};
  p.has_cut = 0u;
  p.key = rng::row_key(seed, position);
  if (min_p != 0.f) {
    float m = -INFINITY;
    for (uint32_t c = threadIdx.x; c < vocab; c += kRowThreads) {
      m = fmaxf(m, __bfloat162float(sampling::tempered(row[c], temperature)));
    }
    p.min_p_threshold = sampling::min_p_threshold(sampling::block_max_f32<kRowThreads>(m, red), min_p);
  }
  if (cut_key >= 0) {
    p.cut = {static_cast<uint32_t>(cut_key), static_cast<uint32_t>(cut_col)};
    p.has_cut = 1u;
  } else if (top_k > 0) {
    const uint32_t key = sampling::block_kth_largest_key<kRowThreads>(vocab, top_k, BeforeCut{row, p}, hist, pick);
    p.cut = {key, 0u};
    p.has_cut = 1u;
  }
  if (threadIdx.x == 0) *out = p;
}

// Block s owns columns [V s / S, V (s + 1) / S): slice edges fall anywhere relative to vLLM's 1024-column blocks.
template <bool kF64>
__global__ void __launch_bounds__(kSliceThreads)
    slice_kernel(const __nv_bfloat16* row, uint32_t vocab, const RowParams* params, float* processed,
                 int64_t* slice_best) {
  __shared__ uint64_t red[kSliceThreads / 32];
  __shared__ ScoreKey64 red64[kSliceThreads / 32];
  const RowParams p = *params;
  const uint32_t s = blockIdx.x;
  const uint32_t begin = static_cast<uint32_t>(static_cast<uint64_t>(vocab) * s / gridDim.x);
  const uint32_t end = static_cast<uint32_t>(static_cast<uint64_t>(vocab) * (s + 1) / gridDim.x);
  for (uint32_t c = begin + threadIdx.x; c < end; c += kSliceThreads) processed[c] = sampling::processed(row[c], c, p);
  if constexpr (kF64) {
    const ScoreKey64 best = sampling::slice_best_f64<kSliceThreads>(row, begin, end, p, red64);
    if (threadIdx.x == 0) {
      slice_best[3 * s] = static_cast<int64_t>(best.v);
      slice_best[3 * s + 1] = best.col;
      slice_best[3 * s + 2] = 0;
    }
  } else {
    const uint64_t best = sampling::slice_best_f32<kSliceThreads>(row, begin, end, p, red);
    if (threadIdx.x == 0) {
      slice_best[3 * s] = static_cast<int64_t>(best);
      slice_best[3 * s + 1] = 0;
      slice_best[3 * s + 2] = 0;
    }
  }
}

// One warp combines the slices' keys in any order.
template <bool kF64>
__global__ void combine_kernel(int num_slices, const int64_t* slice_best, int64_t* token) {
  if constexpr (kF64) {
    ScoreKey64 best = sampling::no_score64();
    for (int s = threadIdx.x; s < num_slices; s += 32) {
      best = sampling::better(best, {static_cast<uint64_t>(slice_best[3 * s]), static_cast<uint32_t>(slice_best[3 * s + 1])});
    }
    best = sampling::warp_best(best);
    if (threadIdx.x == 0) token[0] = best.col;
  } else {
    uint64_t best = 0;
    for (int s = threadIdx.x; s < num_slices; s += 32) {
      const uint64_t k = static_cast<uint64_t>(slice_best[3 * s]);
      best = k > best ? k : best;
    }
    best = warp_max_u64(best);
    if (threadIdx.x == 0) token[0] = sampling::key_col(best);
  }
}

}  // namespace

void philox_test(const at::Tensor& counters, int64_t key, at::Tensor& out) {
  const at::Device dev = counters.device();
  check_cuda(counters, "counters", at::kLong, dev);
  check_cuda(out, "out", at::kLong, dev);
  TORCH_CHECK(counters.dim() == 2 && counters.size(0) == 4 && out.sizes() == counters.sizes(),
              "kog philox_test: counters and out must be int64 [4, n]");
  const int64_t n = counters.size(1);
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(dev);
  philox_kernel<<<blocks_for(n, kElemThreads), kElemThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      counters.data_ptr<int64_t>(), n, static_cast<uint64_t>(key), out.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void philox_uniform_test(int64_t seed, int64_t position, at::Tensor& key_out, at::Tensor& words, at::Tensor& uniform,
                         at::Tensor& noise, at::Tensor& uniform64, at::Tensor& noise64) {
  const at::Device dev = words.device();
  check_cuda(key_out, "key_out", at::kLong, dev);
  check_cuda(words, "words", at::kLong, dev);
  check_cuda(uniform, "uniform", at::kFloat, dev);
  check_cuda(noise, "noise", at::kFloat, dev);
  check_cuda(uniform64, "uniform64", at::kDouble, dev);
  check_cuda(noise64, "noise64", at::kDouble, dev);
  TORCH_CHECK(words.dim() == 2 && words.size(0) == 4, "kog philox_uniform_test: words must be int64 [4, n]");
  const int64_t n = words.size(1);
  TORCH_CHECK(n <= (int64_t{1} << 31), "kog philox_uniform_test: columns are int32 in vLLM, n <= 2^31");
  TORCH_CHECK(key_out.numel() == 1 && uniform.numel() == n && noise.numel() == n && uniform64.numel() == n &&
                  noise64.numel() == n,
              "kog philox_uniform_test: key_out [1]; uniform, noise, uniform64, noise64 [n]");
  const c10::cuda::CUDAGuard guard(dev);
  stream_kernel<<<blocks_for(n > 0 ? n : 1, kElemThreads), kElemThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      seed, position, n, key_out.data_ptr<int64_t>(), words.data_ptr<int64_t>(), uniform.data_ptr<float>(),
      noise.data_ptr<float>(), uniform64.data_ptr<double>(), noise64.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void gumbel_noise_words_test(int64_t first_word, at::Tensor& uniform, at::Tensor& noise) {
  const at::Device dev = noise.device();
  check_cuda(uniform, "uniform", at::kFloat, dev);
  check_cuda(noise, "noise", at::kFloat, dev);
  TORCH_CHECK(uniform.numel() == noise.numel(), "kog gumbel_noise_words_test: uniform and noise must match");
  TORCH_CHECK(first_word >= 0 && first_word < (int64_t{1} << 32), "kog gumbel_noise_words_test: word in [0, 2^32)");
  const int64_t n = noise.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(dev);
  noise_words_kernel<<<blocks_for(n, kElemThreads), kElemThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<uint32_t>(first_word), n, uniform.data_ptr<float>(), noise.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void gumbel_argmax_test(const at::Tensor& logits, double temperature, double min_p, int64_t top_k, int64_t cut_key,
                        int64_t cut_col, int64_t seed, int64_t position, bool use_fp64, int64_t num_slices,
                        at::Tensor& params, at::Tensor& processed, at::Tensor& slice_best, at::Tensor& token) {
  const at::Device dev = logits.device();
  check_cuda(logits, "logits", at::kBFloat16, dev);
  check_cuda(params, "params", at::kInt, dev);
  check_cuda(processed, "processed", at::kFloat, dev);
  check_cuda(slice_best, "slice_best", at::kLong, dev);
  check_cuda(token, "token", at::kLong, dev);
  TORCH_CHECK(logits.dim() == 1 && logits.numel() >= 1 && logits.numel() < (int64_t{1} << 31),
              "kog gumbel_argmax_test: logits must be bf16 [V], 1 <= V < 2^31");
  const int64_t vocab = logits.numel();
  TORCH_CHECK(params.numel() == kParamsWords, "kog gumbel_argmax_test: params must be int32 [", kParamsWords, "]");
  TORCH_CHECK(processed.numel() == vocab, "kog gumbel_argmax_test: processed must be float32 [V]");
  TORCH_CHECK(num_slices >= 1 && num_slices <= 65535, "kog gumbel_argmax_test: 1 <= num_slices <= 65535");
  TORCH_CHECK(slice_best.dim() == 2 && slice_best.size(0) == num_slices && slice_best.size(1) == 3,
              "kog gumbel_argmax_test: slice_best must be int64 [num_slices, 3]");
  TORCH_CHECK(token.numel() == 1, "kog gumbel_argmax_test: token must be int64 [1]");
  TORCH_CHECK(top_k >= 0 && top_k < vocab, "kog gumbel_argmax_test: top_k in [0, V) (0 = off, as V is)");
  TORCH_CHECK(cut_key < (1 << 16) && (cut_key < 0 || top_k == 0),
              "kog gumbel_argmax_test: cut_key is a 16-bit bf16 order key (-1 = none) and replaces top_k");
  TORCH_CHECK(cut_col >= 0 && cut_col < vocab, "kog gumbel_argmax_test: cut_col in [0, V)");
  const float t = static_cast<float>(temperature);
  const float mp = static_cast<float>(min_p);
  TORCH_CHECK(t >= 0.f && std::isfinite(t) && mp >= 0.f && mp <= 1.f,
              "kog gumbel_argmax_test: temperature >= 0, min_p in [0, 1]");
  const c10::cuda::CUDAGuard guard(dev);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto* row = reinterpret_cast<const __nv_bfloat16*>(logits.data_ptr());
  auto* p = reinterpret_cast<RowParams*>(params.data_ptr<int32_t>());
  row_params_kernel<<<1, kRowThreads, 0, stream>>>(row, static_cast<uint32_t>(vocab), t, mp,
                                                   static_cast<uint32_t>(top_k), cut_key, cut_col, seed, position, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const auto grid = static_cast<unsigned>(num_slices);
  if (use_fp64) {
    slice_kernel<true><<<grid, kSliceThreads, 0, stream>>>(row, static_cast<uint32_t>(vocab), p,
                                                           processed.data_ptr<float>(), slice_best.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    combine_kernel<true><<<1, 32, 0, stream>>>(static_cast<int>(num_slices), slice_best.data_ptr<int64_t>(),
                                               token.data_ptr<int64_t>());
  } else {
    slice_kernel<false><<<grid, kSliceThreads, 0, stream>>>(row, static_cast<uint32_t>(vocab), p,
                                                            processed.data_ptr<float>(), slice_best.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    combine_kernel<false><<<1, 32, 0, stream>>>(static_cast<int>(num_slices), slice_best.data_ptr<int64_t>(),
                                                token.data_ptr<int64_t>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kog
