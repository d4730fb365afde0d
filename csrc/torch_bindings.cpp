// The one TORCH_LIBRARY registration of kog_backend._C. Launchers live in csrc/<family>.cu; device code
// lives in csrc/include/kog/*.cuh and includes no torch header. Mutated arguments are marked `Tensor!` (tensors held
// by the monokernel's argument classes cannot be: their comment below says which the kernel writes).
// Test-only launchers are not here: they build into kog_backend._C_test (csrc/testing/, torch.ops.kog_test).
#include <type_traits>

#include <torch/custom_class.h>
#include <torch/library.h>

#include "ops.h"

namespace {

template <class T>
struct member_of;
template <class C, class F>
struct member_of<F C::*> {
  using cls = C;
  using type = std::remove_cv_t<F>;
};

// The read-only accessor of the argument classes' field M, returned as R (a type the schema knows).
template <auto M, class R = typename member_of<decltype(M)>::type>
R field(const c10::intrusive_ptr<typename member_of<decltype(M)>::cls>& self) {
  return R(self.get()->*M);
}

}  // namespace

TORCH_LIBRARY(kog, m) {
  m.def("version() -> int");
  m.impl("version", &kog::version);

  // --- monokernel (csrc/monokernel.cu) ---
  // KOG-MONOKERNEL-DEFS
  // The op's typed arguments (monokernel_launch.h); each constructor checks its values once. One read-only accessor
  // per field (filters and penalties as the kernel gets them: fp32, top_k int32; tensors of a feature the launch
  // leaves off: None). Tensors inside them that the kernel writes, which the op's schema cannot mark `Tensor!`:
  // MonokernelLaunch.scratch (every launch) and .burst_counts (penalised launches), SampledLaunch.defer_out
  // (filtered launches).
  // What is fixed per kog_backend.monokernel.Monokernel: the argument table (uint8 [sizeof(ModelArgs)]), the
  // scratch it points into, the kernel instantiation (head_dim, heads_per_pass, tp_size, fp8_weights, moe), the launch shape (grid
  // blocks of smem_bytes dynamic shared memory) and, at TP = 1, burst_counts (int32 [LM-head rows]).
  m.class_<kog::MonokernelLaunch>("MonokernelLaunch")
      .def(torch::init<at::Tensor, at::Tensor, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                       std::optional<at::Tensor>, bool>(),
           "", {torch::arg("model_args"), torch::arg("scratch"), torch::arg("head_dim"), torch::arg("heads_per_pass"),
                torch::arg("grid"), torch::arg("smem_bytes"), torch::arg("tp_size") = 1,
                torch::arg("fp8_weights") = false, torch::arg("burst_counts") = torch::arg::none(),
                torch::arg("moe") = false})
      .def("model_args", &field<&kog::MonokernelLaunch::model_args>)
      .def("scratch", &field<&kog::MonokernelLaunch::scratch>)
      .def("burst_counts", &field<&kog::MonokernelLaunch::burst_counts>)
      .def("head_dim", &field<&kog::MonokernelLaunch::head_dim>)
      .def("heads_per_pass", &field<&kog::MonokernelLaunch::heads_per_pass>)
      .def("grid", &field<&kog::MonokernelLaunch::grid>)
      .def("smem_bytes", &field<&kog::MonokernelLaunch::smem_bytes>)
      .def("tp_size", &field<&kog::MonokernelLaunch::tp_size>)
      .def("fp8_weights", &field<&kog::MonokernelLaunch::fp8_weights>)
      .def("moe", &field<&kog::MonokernelLaunch::moe>)
      .def("device", &field<&kog::MonokernelLaunch::device>);
  // A sampled launch: vLLM's draw with sample_seed (int64 [1] GPU) and temperature, after its filters (top_k 0 /
  // top_p 1 / min_p 0: off; any on needs defer_out, int32 [1] GPU, zero before the launch) and penalties (1 / 0 / 0:
  // off; any on needs prompt_mask int32 [ceil(V / 32)] and output_counts int32 [V], vLLM's PenaltiesState rows).
  m.class_<kog::SampledLaunch>("SampledLaunch")
      .def(torch::init<at::Tensor, double, int64_t, double, double, std::optional<at::Tensor>,
                       std::optional<at::Tensor>, std::optional<at::Tensor>, double, double, double>(),
           "", {torch::arg("sample_seed"), torch::arg("temperature"), torch::arg("top_k") = 0,
                torch::arg("top_p") = 1.0, torch::arg("min_p") = 0.0, torch::arg("defer_out") = torch::arg::none(),
                torch::arg("prompt_mask") = torch::arg::none(), torch::arg("output_counts") = torch::arg::none(),
                torch::arg("repetition_penalty") = 1.0, torch::arg("frequency_penalty") = 0.0,
                torch::arg("presence_penalty") = 0.0})
      .def("sample_seed", &field<&kog::SampledLaunch::sample_seed>)
      .def("temperature", &field<&kog::SampledLaunch::temperature, double>)
      .def("top_k", &field<&kog::SampledLaunch::top_k, int64_t>)
      .def("top_p", &field<&kog::SampledLaunch::top_p, double>)
      .def("min_p", &field<&kog::SampledLaunch::min_p, double>)
      .def("filtered", &field<&kog::SampledLaunch::filtered>)
      .def("defer_out", &field<&kog::SampledLaunch::defer_out>)
      .def("repetition_penalty", &field<&kog::SampledLaunch::repetition_penalty, double>)
      .def("frequency_penalty", &field<&kog::SampledLaunch::frequency_penalty, double>)
      .def("presence_penalty", &field<&kog::SampledLaunch::presence_penalty, double>)
      .def("penalized", &field<&kog::SampledLaunch::penalized>)
      .def("prompt_mask", &field<&kog::SampledLaunch::prompt_mask>)
      .def("output_counts", &field<&kog::SampledLaunch::output_counts>);
  // A run-ahead launch (TP = 1): launch_gate (int32 [1] GPU) with gate_min, cancel (pinned CPU int64 [1]) with
  // cancel_id; at least one of the two.
  m.class_<kog::RunAheadLaunch>("RunAheadLaunch")
      .def(torch::init<std::optional<at::Tensor>, int64_t, std::optional<at::Tensor>, int64_t>(),
           "", {torch::arg("launch_gate") = torch::arg::none(), torch::arg("gate_min") = 0,
                torch::arg("cancel") = torch::arg::none(), torch::arg("cancel_id") = 0})
      .def("launch_gate", &field<&kog::RunAheadLaunch::launch_gate>)
      .def("gate_min", &field<&kog::RunAheadLaunch::gate_min>)
      .def("cancel", &field<&kog::RunAheadLaunch::cancel>)
      .def("cancel_id", &field<&kog::RunAheadLaunch::cancel_id>);
  // One decode step (or up to num_tokens tokens: greedy, or sampled as vLLM's sampler with its filters and
  // penalties) of the whole model. The kernel also writes every layer's KV cache and the scratch buffers through
  // pointers in the argument table (plan's, or model_args: another table of the same model for this launch).
  m.def(
      "monokernel_step(__torch__.torch.classes.kog.MonokernelLaunch plan, Tensor input_ids, Tensor positions, "
      "Tensor block_table, Tensor slot_mapping, Tensor(a!) tokens_out, Tensor(b!)? logits_out, "
      "Tensor(c!)? num_out, Tensor? stop_ids, int num_tokens, "
      "__torch__.torch.classes.kog.SampledLaunch? sampling=None, "
      "__torch__.torch.classes.kog.RunAheadLaunch? run_ahead=None, Tensor? model_args=None) -> ()");
  // Blocks of the monokernel (this head dim, pass width, sampling and TP flags, shared memory per block) the
  // device holds at once: a launch with a larger grid could not have all its blocks resident.
  m.def("monokernel_max_grid(int head_dim, int heads_per_pass, bool sampled, bool tp, int smem_bytes, int device, "
        "bool fp8_weights=False, bool moe=False) -> int",
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
