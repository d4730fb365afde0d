// Test launcher of the MoE route (device code: include/kog/moe_route.cuh), compared with
// kog_backend.reference.moe_step.route and vLLM's topk_softmax by integration_tests/test_moe_route_gpu.py. One warp per
// row of logits runs the device function the MoE schedule's router stage will call; not on a serving path.
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kog/moe_route.cuh"
#include "test_ops.h"

namespace kog {
namespace {

__global__ void moe_route_kernel(const uint16_t* logits, int E, int k, bool norm, int32_t* ids, float* weights) {
  __shared__ float probs[kMoeMaxExperts];
  __shared__ float chosen[kMoeMaxTopK];
  const int row = blockIdx.x;
  moe_route_warp(logits + static_cast<int64_t>(row) * E, E, k, norm, ids + row * k, weights + row * k, probs, chosen);
}

}  // namespace

void moe_route_test(const at::Tensor& logits, int64_t top_k, bool norm_topk_prob, at::Tensor& ids,
                    at::Tensor& weights) {
  TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous() &&
                  logits.scalar_type() == at::kBFloat16,
              "kog moe_route_test: logits must be a contiguous CUDA bf16 [rows, E] tensor");
  const int64_t rows = logits.size(0), E = logits.size(1);
  TORCH_CHECK(E >= 1 && E <= kMoeMaxExperts, "kog moe_route_test: E ", E, " outside 1..", kMoeMaxExperts);
  TORCH_CHECK(top_k >= 1 && top_k <= kMoeMaxTopK && top_k <= E, "kog moe_route_test: top_k ", top_k, " outside 1..",
              kMoeMaxTopK, " or above E");
  TORCH_CHECK(rows >= 1 && rows <= 65535, "kog moe_route_test: rows ", rows, " outside 1..65535");
  for (const at::Tensor* t : {&ids, &weights}) {
    TORCH_CHECK(t->device() == logits.device() && t->is_contiguous() && t->dim() == 2 && t->size(0) == rows &&
                    t->size(1) == top_k,
                "kog moe_route_test: ids / weights must be contiguous [rows, top_k] on the logits' device");
  }
  TORCH_CHECK(ids.scalar_type() == at::kInt && weights.scalar_type() == at::kFloat,
              "kog moe_route_test: ids int32, weights fp32");
  const c10::cuda::CUDAGuard guard(logits.device());
  moe_route_kernel<<<static_cast<unsigned>(rows), 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const uint16_t*>(logits.data_ptr()), static_cast<int>(E), static_cast<int>(top_k),
      norm_topk_prob, ids.data_ptr<int32_t>(), weights.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kog
