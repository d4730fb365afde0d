// The typed arguments of torch.ops.kog.monokernel_step: torch custom classes (torch.classes.kog.*), registered in
// torch_bindings.cpp, constructed in csrc/monokernel.cu. Each constructor checks its own values once (TORCH_CHECK);
// monokernel_step then checks only the per-call tensors and how these objects fit together (same device, TP = 1
// where a feature needs it, penalty rows against the plan's vocabulary).
//   MonokernelLaunch  what is fixed per kog_backend.monokernel.Monokernel: argument table, launch shape, buffers.
//   SampledLaunch     a sampled launch's draw: seed, temperature, vLLM's filters and penalties.
//   RunAheadLaunch    a run-ahead launch's gate and cancel word (kog_backend/path/run_ahead.py).
// Host-only: the device sees none of this, only the StepArgs (include/kog/args.cuh) the launcher fills from it.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

namespace kog {

// Fixed per Monokernel object. The kernel writes `scratch` (every layer's activations) and, in penalised launches,
// `burst_counts`, through the tensors held here (the op's schema cannot mark them `Tensor!`).
struct MonokernelLaunch : torch::CustomClassHolder {
  MonokernelLaunch(at::Tensor model_args, at::Tensor scratch, int64_t head_dim, int64_t heads_per_pass, int64_t grid,
                   int64_t smem_bytes, int64_t tp_size, bool fp8_weights, std::optional<at::Tensor> burst_counts,
                   bool moe);

  const at::Tensor model_args;  // uint8 [sizeof(ModelArgs)] on `device`: the argument table (layout.py packs it)
  const at::Tensor scratch;     // on `device`: the buffers model_args points into (the kernel writes them)
  const std::optional<at::Tensor> burst_counts;  // int32 [LM-head rows] on `device`, TP = 1 only: penalised draws'
                                                 // token counts, zero between launches (the kernel keeps it so)
  const at::Device device;      // model_args' device: every tensor of a launch must be on it
  const int64_t head_dim;       // 64 or 128: the kernel instantiation
  const int64_t heads_per_pass; // 2 or MonoConfig::kHeadsPerPass: the kernel instantiation (plan.heads_per_pass)
  const int64_t grid;           // blocks of the cooperative launch (plan.grid)
  const int64_t smem_bytes;     // dynamic shared memory per block, bytes (plan.smem_bytes)
  const int64_t tp_size;        // 1..MonoConfig::kMaxTP; > 1 launches the TP instantiation
  const bool fp8_weights;       // the FP8-weight instantiation (ModelArgs::fp8_scaling > 0; TP = 1 only)
  const bool moe;               // the mixture-of-experts instantiation (ModelArgs::moe_top_k > 0): head_dim 128,
                                // heads_per_pass kHeadsPerPass, TP = 1, bf16 weights only
};

// A sampled launch (the sampled kernel instantiation): vLLM's draw with this seed and temperature, after its filters
// (top_k 0 / top_p 1 / min_p 0: off) and its penalties (1 / 0 / 0: off). Values as the kernel gets them: fp32, as
// vLLM's SamplingStates and PenaltiesState hold them. The kernel writes `defer_out` (filtered launches).
struct SampledLaunch : torch::CustomClassHolder {
  SampledLaunch(at::Tensor sample_seed, double temperature, int64_t top_k, double top_p, double min_p,
                std::optional<at::Tensor> defer_out, std::optional<at::Tensor> prompt_mask,
                std::optional<at::Tensor> output_counts, double repetition_penalty, double frequency_penalty,
                double presence_penalty);

  const at::Tensor sample_seed;  // int64 [1] on the GPU: the request's vLLM sampling seed
  const float temperature;       // >= 0 (0: vLLM's argmax, after penalties)
  const int32_t top_k;           // 0 = off
  const float top_p;             // (0, 1], 1 = off
  const float min_p;             // [0, 1], 0 = off
  const bool filtered;           // any of top_k / top_p / min_p on (burst_sampling.cuh; TP = 1 only)
  const std::optional<at::Tensor> defer_out;      // int32 [1] on the GPU, filtered launches only (else unset)
  const float repetition_penalty;                 // > 0, 1 = off
  const float frequency_penalty;                  // 0 = off
  const float presence_penalty;                   // 0 = off
  const bool penalized;                           // any penalty on (penalties.cuh; TP = 1 only)
  const std::optional<at::Tensor> prompt_mask;    // int32 [>= ceil(V / 32)] on the GPU, penalised launches only
  const std::optional<at::Tensor> output_counts;  // int32 [>= V] on the GPU, penalised launches only
};

// A run-ahead launch (TP = 1 only): with launch_gate the launch does nothing unless launch_gate[0] >= gate_min; with
// cancel it ends after the token in hand once cancel[0] >= cancel_id (include/kog/args.cuh, StepArgs).
struct RunAheadLaunch : torch::CustomClassHolder {
  RunAheadLaunch(std::optional<at::Tensor> launch_gate, int64_t gate_min, std::optional<at::Tensor> cancel,
                 int64_t cancel_id);

  const std::optional<at::Tensor> launch_gate;  // int32 [1] on the GPU, written earlier on the stream
  const int64_t gate_min;                       // int32 range
  const std::optional<at::Tensor> cancel;       // int64 [1] pinned CPU memory, read by the kernel through its
                                                // device mapping (cudaHostGetDevicePointer, at each launch)
  const int64_t cancel_id;
};

}  // namespace kog
