// The one TORCH_LIBRARY registration of kog_backend._C. Launchers live in csrc/<family>.cu; device code
// lives in csrc/include/kog/*.cuh and includes no torch header. Mutated arguments are marked `Tensor!`.
// Test-only launchers are not here: they build into kog_backend._C_test (csrc/testing/, torch.ops.kog_test).
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(kog, m) {
  m.def("version() -> int");
  m.impl("version", &kog::version);

  // --- monokernel (csrc/monokernel.cu) ---
  // KOG-MONOKERNEL-DEFS
  // One decode step (or up to num_tokens tokens: greedy, or sampled as vLLM's sampler with its filters and penalties) of the whole model. The kernel also writes every layer's
  // KV cache and the scratch buffers through pointers in model_args (built once by kog_backend.monokernel).
  m.def(
      "monokernel_step(Tensor model_args, Tensor input_ids, Tensor positions, Tensor block_table, "
      "Tensor slot_mapping, Tensor(a!) tokens_out, Tensor(b!)? logits_out, Tensor(c!)? num_out, Tensor? stop_ids, "
      "Tensor(d!) scratch, int num_tokens, int head_dim, int heads_per_pass, int grid, int smem_bytes, "
      "Tensor? sample_seed=None, float temperature=0.0, int tp_size=1, Tensor? launch_gate=None, int gate_min=0, "
      "Tensor? cancel=None, int cancel_id=0, int top_k=0, float top_p=1.0, float min_p=0.0, "
      "Tensor(e!)? defer_out=None, Tensor? prompt_mask=None, Tensor? output_counts=None, "
      "Tensor(f!)? burst_counts=None, float repetition_penalty=1.0, float frequency_penalty=0.0, "
      "float presence_penalty=0.0) -> ()");
  // Blocks of the monokernel (this head dim, pass width, sampling and TP flags, shared memory per block) the
  // device holds at once: a launch with a larger grid could not have all its blocks resident.
  m.def("monokernel_max_grid(int head_dim, int heads_per_pass, bool sampled, bool tp, int smem_bytes, int device) -> int",
        &kog::monokernel_max_grid);
  m.def("monokernel_layout() -> int[]");
  m.impl("monokernel_layout", &kog::monokernel_layout);
  m.def("monokernel_config() -> int[]");
  m.impl("monokernel_config", &kog::monokernel_config);

  // --- collective (csrc/allreduce.cu) ---
  // KOG-ALLREDUCE-DEFS
  // Host-only ops (no tensor, or CPU + CUDA tensors): registered for every dispatch key.
  m.def("allreduce_layout(int world, int oneshot_cap, int twoshot_cap) -> int[]", &kog::allreduce_layout);
  m.def("allreduce_constants() -> int[]", &kog::allreduce_constants);
  // Returns a handle to the communicator state; the kernels launched through it mutate `epochs`, `error`
  // and the shared buffers.
  m.def("allreduce_init(int[] peer_bases, int rank, int oneshot_cap, int twoshot_cap, int buffer_bytes, "
        "Tensor epochs, Tensor error, int timeout_ns, int refresh_log2, bool trap_on_timeout) -> int",
        &kog::allreduce_init);
  m.def("allreduce_dispose(int handle) -> ()", &kog::allreduce_dispose);
  m.def("ipc_alloc(int nbytes, int device) -> int", &kog::ipc_alloc);
  m.def("ipc_free(int ptr, int device) -> ()", &kog::ipc_free);
  m.def("ipc_get_handle(int ptr, int device) -> int[]", &kog::ipc_get_handle);
  m.def("ipc_open(int[] handle, int device) -> int", &kog::ipc_open);
  m.def("ipc_close(int ptr, int device) -> ()", &kog::ipc_close);
  m.def("ipc_copy(int dst, int src, int nbytes, int device) -> ()", &kog::ipc_copy);
  // Sums `input` over the communicator's ranks into `output` (which may be `input`); algo 0 = one-shot,
  // 1 = two-shot. Also advances the communicator's epoch state.
  m.def("allreduce(int handle, Tensor input, Tensor! output, int algo) -> ()");
}

TORCH_LIBRARY_IMPL(kog, CUDA, m) {
  // KOG-MONOKERNEL-CUDA-IMPLS
  m.impl("monokernel_step", &kog::monokernel_step);
  // KOG-ALLREDUCE-CUDA-IMPLS
  m.impl("allreduce", &kog::allreduce);
}
