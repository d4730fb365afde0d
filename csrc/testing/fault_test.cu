// Test launcher for the monokernel's fault handling (integration_tests/test_fault_gpu.py, test_fault_serve.py):
// a kernel that holds SMs, so that a monokernel launched behind it on another stream finds part of its grid not
// resident (sync.cuh, kSiteNotResident). Not on a serving path.
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "test_ops.h"

namespace kog {
namespace {

// Each block spins (one thread) until the host sets release[0] != 0 or timeout_ns of %globaltimer pass; the
// dynamic shared memory it asks for is what keeps other blocks off its SM.
__global__ void hold_sms_kernel(const volatile int32_t* release, unsigned long long timeout_ns) {
  extern __shared__ uint8_t smem[];
  if (threadIdx.x != 0) return;
  unsigned long long t0;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t0));
  for (;;) {
    if (*release != 0) break;
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    if (t - t0 > timeout_ns) break;
    __nanosleep(1000);
    smem[0] = 0;  // (keeps the allocation)
  }
}

}  // namespace

void hold_sms_test(const at::Tensor& release, int64_t blocks, int64_t smem_bytes, int64_t timeout_ms, int64_t device) {
  TORCH_CHECK(release.device().is_cpu() && release.is_pinned() && release.scalar_type() == at::kInt &&
                  release.numel() >= 1,
              "kog hold_sms_test: release must be a pinned CPU int32 [1] tensor");
  TORCH_CHECK(blocks >= 1 && blocks <= 65535, "kog hold_sms_test: blocks ", blocks, " outside 1..65535");
  TORCH_CHECK(smem_bytes >= 0 && timeout_ms >= 1, "kog hold_sms_test: smem_bytes >= 0, timeout_ms >= 1");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  void* mapped = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&mapped, release.data_ptr(), 0);
  if (err != cudaSuccess) (void)cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, "kog hold_sms_test: release is not mapped: ", cudaGetErrorString(err));
  C10_CUDA_CHECK(cudaFuncSetAttribute(hold_sms_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes)));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  hold_sms_kernel<<<static_cast<unsigned>(blocks), 32, static_cast<size_t>(smem_bytes), stream>>>(
      static_cast<const int32_t*>(mapped), static_cast<unsigned long long>(timeout_ms) * 1000000ull);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kog
