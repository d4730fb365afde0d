// Launchers of the low-latency all-reduce (device code: csrc/include/kog/allreduce.cuh) and the CUDA IPC
// helpers that kog_backend/collective uses to share its buffers. Addresses cross the op boundary as int64
// (as in vLLM's custom all-reduce): they point into buffers whose lifetime the Python owner manages.
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "kog/allreduce.cuh"
#include "ops.h"

namespace kog {
namespace {

#define KOG_CUDA_CHECK(expr)                                                               \
  do {                                                                                     \
    const cudaError_t err_ = (expr);                                                       \
    TORCH_CHECK(err_ == cudaSuccess, #expr " failed: ", cudaGetErrorString(err_));         \
  } while (0)

// State behind an `allreduce_init` handle. The tensors are owned (kept alive) by the Python caller.
struct Comm {
  ar::Params base;  // everything but in/out/npacks
  const volatile int* err_host;  // the error record as the host sees it (base.err: the device's view)
  int world;
  int device;
  int64_t oneshot_cap;  // bytes
  int64_t twoshot_cap;  // bytes
};

Comm* as_comm(int64_t handle) {
  TORCH_CHECK(handle != 0, "kog all-reduce: null communicator handle (closed?)");
  return reinterpret_cast<Comm*>(handle);
}

template <typename T, int W>
void launch(const ar::Params& p, int64_t algo, cudaStream_t stream) {
  if (algo == ar::kAlgoOneShot) {
    ar::oneshot_kernel<T, W><<<ar::grid_for(p.npacks), ar::kThreads, 0, stream>>>(p);
  } else {
    ar::twoshot_kernel<T, W><<<ar::grid_for(p.npacks / W), ar::kThreads, 0, stream>>>(p);
  }
}

template <typename T>
void launch_world(const ar::Params& p, int world, int64_t algo, cudaStream_t stream) {
  switch (world) {
    case 2: return launch<T, 2>(p, algo, stream);
    case 4: return launch<T, 4>(p, algo, stream);
    case 6: return launch<T, 6>(p, algo, stream);
    case 8: return launch<T, 8>(p, algo, stream);
    default: TORCH_CHECK(false, "kog all-reduce: unsupported world size ", world);
  }
}

}  // namespace

std::vector<int64_t> allreduce_layout(int64_t world, int64_t oneshot_cap, int64_t twoshot_cap) {
  TORCH_CHECK(world >= 2 && world <= ar::kMaxWorld, "kog all-reduce: world size ", world, " out of [2, 8]");
  TORCH_CHECK(oneshot_cap >= 0 && oneshot_cap % ar::kPackBytes == 0, "one-shot capacity ", oneshot_cap,
              " must be a non-negative multiple of ", ar::kPackBytes);
  TORCH_CHECK(twoshot_cap >= 0 && twoshot_cap % (ar::kPackBytes * world) == 0, "two-shot capacity ",
              twoshot_cap, " must be a non-negative multiple of 16 * world = ", ar::kPackBytes * world);
  const ar::Layout L = ar::make_layout(static_cast<int>(world), oneshot_cap, twoshot_cap);
  return {L.oneshot_off, L.oneshot_slot, L.oneshot_set_stride, L.oneshot_cap_packs, L.rs_off,
          L.ag_off,      L.chunk_slot,   L.chunk_set_stride,   L.chunk_cap_packs,   L.total};
}

std::vector<int64_t> allreduce_constants() {
  return {ar::kMaxWorld,   ar::kThreads,     ar::kMaxBlocks, ar::kPackBytes,
          ar::kLLPackBytes, ar::kNumSets,    ar::kHeaderBytes, ar::kCheckSlotBytes,
          ar::kAlign,      ar::kErrWords,    ar::kDefaultRefreshLog2};
}

int64_t allreduce_init(std::vector<int64_t> peer_bases, int64_t rank, int64_t oneshot_cap, int64_t twoshot_cap,
                       int64_t buffer_bytes, const at::Tensor& epochs, const at::Tensor& error, int64_t timeout_ns,
                       int64_t refresh_log2, bool trap_on_timeout) {
  const int64_t world = static_cast<int64_t>(peer_bases.size());
  TORCH_CHECK(world == 2 || world == 4 || world == 6 || world == 8,
              "kog all-reduce: world size must be 2, 4, 6 or 8, got ", world);
  TORCH_CHECK(rank >= 0 && rank < world, "kog all-reduce: rank ", rank, " out of [0, ", world, ")");
  const std::vector<int64_t> lay = allreduce_layout(world, oneshot_cap, twoshot_cap);
  TORCH_CHECK(lay.back() <= buffer_bytes, "kog all-reduce: layout needs ", lay.back(), " bytes, buffer has ",
              buffer_bytes);
  for (int64_t b : peer_bases) {
    TORCH_CHECK(b != 0 && b % ar::kAlign == 0, "kog all-reduce: peer buffer address ", b, " is null or not ",
                ar::kAlign, "-byte aligned");
  }
  TORCH_CHECK(epochs.is_cuda() && epochs.scalar_type() == at::kInt && epochs.is_contiguous() &&
                  epochs.numel() >= ar::kMaxBlocks,
              "kog all-reduce: epochs must be a contiguous CUDA int32 tensor of >= ", ar::kMaxBlocks, " elements");
  TORCH_CHECK(error.device().is_cpu() && error.is_pinned() && error.scalar_type() == at::kInt &&
                  error.is_contiguous() && error.numel() >= ar::kErrWords,
              "kog all-reduce: error must be a pinned contiguous CPU int32 tensor of >= ", ar::kErrWords,
              " elements");
  TORCH_CHECK(timeout_ns > 0, "kog all-reduce: timeout must be positive");
  TORCH_CHECK(refresh_log2 >= 1 && refresh_log2 <= 30, "kog all-reduce: refresh_log2 ", refresh_log2,
              " out of [1, 30]");

  auto* c = new Comm{};
  for (int64_t i = 0; i < world; ++i) c->base.peers[i] = reinterpret_cast<char*>(peer_bases[i]);
  c->base.epochs = reinterpret_cast<uint32_t*>(const_cast<int*>(epochs.const_data_ptr<int>()));
  const c10::cuda::CUDAGuard guard(epochs.device());
  int* err_host = const_cast<int*>(error.const_data_ptr<int>());
  void* err_dev = nullptr;
  const cudaError_t mapped = cudaHostGetDevicePointer(&err_dev, err_host, 0);
  if (mapped != cudaSuccess) {
    delete c;
    TORCH_CHECK(false, "kog all-reduce: the error record is not device-mapped pinned memory: ",
                cudaGetErrorString(mapped));
  }
  c->base.err = static_cast<int*>(err_dev);
  c->err_host = err_host;
  c->base.layout = ar::make_layout(static_cast<int>(world), oneshot_cap, twoshot_cap);
  c->base.timeout_ns = static_cast<uint64_t>(timeout_ns);
  c->base.refresh_mask = (1u << refresh_log2) - 1u;
  c->base.rank = static_cast<int>(rank);
  c->base.trap_on_timeout = trap_on_timeout ? 1 : 0;
  c->world = static_cast<int>(world);
  c->device = epochs.get_device();
  c->oneshot_cap = oneshot_cap;
  c->twoshot_cap = twoshot_cap;
  return reinterpret_cast<int64_t>(c);
}

void allreduce_dispose(int64_t handle) {
  if (handle != 0) delete reinterpret_cast<Comm*>(handle);
}

void allreduce(int64_t handle, const at::Tensor& input, at::Tensor& output, int64_t algo) {
  Comm* c = as_comm(handle);
  const volatile int* err = c->err_host;
  TORCH_CHECK(err[ar::kErrStatus] == ar::kStatusOk, "kog all-reduce: an earlier call timed out (rank ",
              err[ar::kErrRank], " waited for rank ", err[ar::kErrMissing], "); the communicator is unusable");
  TORCH_CHECK(input.is_cuda() && input.get_device() == c->device, "kog all-reduce: input must be on cuda:", c->device);
  TORCH_CHECK(output.is_cuda() && output.get_device() == c->device, "kog all-reduce: output must be on cuda:",
              c->device);
  TORCH_CHECK(input.is_contiguous() && output.is_contiguous(), "kog all-reduce: tensors must be contiguous");
  TORCH_CHECK(input.scalar_type() == output.scalar_type() && input.numel() == output.numel(),
              "kog all-reduce: output must match input in dtype and size");
  const auto dtype = input.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat,
              "kog all-reduce: dtype must be bfloat16, float16 or float32, got ", dtype);
  const int64_t nbytes = input.numel() * input.element_size();
  TORCH_CHECK(nbytes > 0 && nbytes % ar::kPackBytes == 0, "kog all-reduce: size ", nbytes,
              " bytes must be a positive multiple of ", ar::kPackBytes);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(input.data_ptr()) % ar::kPackBytes == 0 &&
                  reinterpret_cast<uintptr_t>(output.data_ptr()) % ar::kPackBytes == 0,
              "kog all-reduce: tensors must be 16-byte aligned");
  {
    const auto* ib = static_cast<const char*>(input.data_ptr());
    const auto* ob = static_cast<const char*>(output.data_ptr());
    TORCH_CHECK(ib == ob || ib + nbytes <= ob || ob + nbytes <= ib,
                "kog all-reduce: output must be the input or not overlap it");
  }
  if (algo == ar::kAlgoOneShot) {
    TORCH_CHECK(nbytes <= c->oneshot_cap, "kog all-reduce: ", nbytes, " bytes exceed the one-shot capacity ",
                c->oneshot_cap);
  } else {
    TORCH_CHECK(algo == ar::kAlgoTwoShot, "kog all-reduce: algo must be 0 (one-shot) or 1 (two-shot)");
    TORCH_CHECK(nbytes <= c->twoshot_cap, "kog all-reduce: ", nbytes, " bytes exceed the two-shot capacity ",
                c->twoshot_cap);
    TORCH_CHECK(nbytes % (ar::kPackBytes * c->world) == 0, "kog all-reduce: two-shot size ", nbytes,
                " must be a multiple of 16 * world = ", ar::kPackBytes * c->world);
  }

  ar::Params p = c->base;
  p.in = static_cast<const uint4*>(input.data_ptr());
  p.out = static_cast<uint4*>(output.data_ptr());
  p.npacks = nbytes / ar::kPackBytes;
  const c10::cuda::CUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (dtype == at::kBFloat16) launch_world<__nv_bfloat16>(p, c->world, algo, stream);
  else if (dtype == at::kHalf) launch_world<__half>(p, c->world, algo, stream);
  else launch_world<float>(p, c->world, algo, stream);
  KOG_CUDA_CHECK(cudaGetLastError());
}

// ---- CUDA IPC ----

int64_t ipc_alloc(int64_t nbytes, int64_t device) {
  TORCH_CHECK(nbytes > 0, "ipc_alloc: size must be positive");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  void* ptr = nullptr;
  KOG_CUDA_CHECK(cudaMalloc(&ptr, static_cast<size_t>(nbytes)));
  // Synchronous: the zeros (epoch 0 = "never written") are in place before the handle is exchanged.
  const cudaError_t st = cudaMemset(ptr, 0, static_cast<size_t>(nbytes));
  if (st != cudaSuccess) {
    cudaFree(ptr);
    TORCH_CHECK(false, "ipc_alloc: cudaMemset failed: ", cudaGetErrorString(st));
  }
  KOG_CUDA_CHECK(cudaDeviceSynchronize());
  return reinterpret_cast<int64_t>(ptr);
}

void ipc_free(int64_t ptr, int64_t device) {
  if (ptr == 0) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  KOG_CUDA_CHECK(cudaFree(reinterpret_cast<void*>(ptr)));
}

std::vector<int64_t> ipc_get_handle(int64_t ptr, int64_t device) {
  TORCH_CHECK(ptr != 0, "ipc_get_handle: null pointer");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaIpcMemHandle_t h;
  KOG_CUDA_CHECK(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(ptr)));
  std::vector<int64_t> out(sizeof(h));
  const auto* bytes = reinterpret_cast<const unsigned char*>(&h);
  for (size_t i = 0; i < sizeof(h); ++i) out[i] = bytes[i];
  return out;
}

int64_t ipc_open(std::vector<int64_t> handle, int64_t device) {
  cudaIpcMemHandle_t h;
  TORCH_CHECK(handle.size() == sizeof(h), "ipc_open: handle must have ", sizeof(h), " bytes, got ", handle.size());
  auto* bytes = reinterpret_cast<unsigned char*>(&h);
  for (size_t i = 0; i < sizeof(h); ++i) {
    TORCH_CHECK(handle[i] >= 0 && handle[i] < 256, "ipc_open: handle byte out of range");
    bytes[i] = static_cast<unsigned char>(handle[i]);
  }
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  void* ptr = nullptr;
  KOG_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess));
  return reinterpret_cast<int64_t>(ptr);
}

void ipc_close(int64_t ptr, int64_t device) {
  if (ptr == 0) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  KOG_CUDA_CHECK(cudaIpcCloseMemHandle(reinterpret_cast<void*>(ptr)));
}

// Stream-ordered copy between raw device addresses (either may be a peer's IPC mapping) on the current
// stream of `device`; used by the start-up P2P check.
void ipc_copy(int64_t dst, int64_t src, int64_t nbytes, int64_t device) {
  TORCH_CHECK(dst != 0 && src != 0 && nbytes >= 0, "ipc_copy: bad arguments");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  KOG_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src),
                                 static_cast<size_t>(nbytes), cudaMemcpyDefault,
                                 c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device))));
}

}  // namespace kog
