// Launcher of the monokernel (device code: include/kog/monokernel.cuh). Checks the per-step inputs, launches
// one cooperative grid (co-residency of all blocks is what lets them wait on each other) on the current stream.
// The argument table (ModelArgs, LayerArgs[]) is built once by kog_backend/monokernel/ and passed as a device
// buffer; nothing is built on the host per call. What is fixed per model, and a sampled or run-ahead launch's
// settings, come as the op's typed arguments (monokernel_launch.h), checked once when they are built.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kog/args.cuh"
#include "kog/attention.cuh"
#include "kog/burst_sampling.cuh"
#include "kog/config.cuh"
#include "kog/fp8.cuh"
#include "kog/monokernel.cuh"
#include "kog/sync.cuh"
#include "kog/trace.cuh"
#include "monokernel_launch.h"
#include "ops.h"

namespace kog {

namespace {

template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe = false>
void launch(const StepArgs& step, int grid, int smem_bytes, cudaStream_t stream) {
  static bool attr_set[64] = {};
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && !attr_set[dev]) {
    const cudaError_t err = cudaFuncSetAttribute(monokernel_kernel<D, HP, kSampled, kTP, kFp8, kMoe>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, MonoConfig::kMaxSmemBytes);
    TORCH_CHECK(err == cudaSuccess, "kog monokernel: cannot raise the shared-memory limit to ",
                MonoConfig::kMaxSmemBytes, " bytes: ", cudaGetErrorString(err));
    attr_set[dev] = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(MonoConfig::kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, monokernel_kernel<D, HP, kSampled, kTP, kFp8, kMoe>, step);
  TORCH_CHECK(err == cudaSuccess, "kog monokernel launch failed (grid ", grid, ", ", MonoConfig::kThreads,
              " threads, ", smem_bytes, " B shared memory): ", cudaGetErrorString(err));
}

void check_cuda(const at::Tensor& t, const char* name, const at::Device& dev) {
  TORCH_CHECK(t.is_cuda() && t.device() == dev, "kog monokernel: ", name, " must be on ", dev, ", got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "kog monokernel: ", name, " must be contiguous");
}

// The first tensor of an object, whose device the others must then be on.
void check_any_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "kog monokernel: ", name, " must be on a CUDA device, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "kog monokernel: ", name, " must be contiguous");
}

// One template parameter per level: the pass width HP (the caller), the head dim, then the weight, TP and sampling
// flags. FP8 weights have no TP instantiation (MonokernelLaunch refuses the combination).
// The MoE kernel exists for head dim 128 and the kHeadsPerPass pass width only (Qwen3-MoE's GQA 8), with bf16 weights
// on one GPU (MonokernelLaunch and monokernel_max_grid refuse the rest).
constexpr bool has_moe_kernel(int64_t head_dim, int64_t heads_per_pass) {
  return head_dim == 128 && heads_per_pass == MonoConfig::kHeadsPerPass;
}

template <int D, int HP>
void dispatch_flags(const StepArgs& step, bool sampled, bool tp, bool fp8, bool moe, int grid, int smem_bytes,
                    cudaStream_t stream) {
  if (moe) {
    if constexpr (has_moe_kernel(D, HP)) {
      sampled ? launch<D, HP, true, false, false, true>(step, grid, smem_bytes, stream)
              : launch<D, HP, false, false, false, true>(step, grid, smem_bytes, stream);
    }
  } else if (fp8) {
    sampled ? launch<D, HP, true, false, true>(step, grid, smem_bytes, stream)
            : launch<D, HP, false, false, true>(step, grid, smem_bytes, stream);
  } else if (tp) {
    sampled ? launch<D, HP, true, true, false>(step, grid, smem_bytes, stream)
            : launch<D, HP, false, true, false>(step, grid, smem_bytes, stream);
  } else {
    sampled ? launch<D, HP, true, false, false>(step, grid, smem_bytes, stream)
            : launch<D, HP, false, false, false>(step, grid, smem_bytes, stream);
  }
}

template <int HP>
void dispatch(const StepArgs& step, int64_t head_dim, bool sampled, bool tp, bool fp8, bool moe, int grid,
              int smem_bytes, cudaStream_t stream) {
  if (head_dim == 64) {
    dispatch_flags<64, HP>(step, sampled, tp, fp8, moe, grid, smem_bytes, stream);
  } else {
    dispatch_flags<128, HP>(step, sampled, tp, fp8, moe, grid, smem_bytes, stream);
  }
}

}  // namespace

// --- the op's typed arguments (monokernel_launch.h): each checks its own values once, at construction ---
// Scalars first, then tensors: a wrong value is named even where no GPU is present.

MonokernelLaunch::MonokernelLaunch(at::Tensor model_args_, at::Tensor scratch_, int64_t head_dim_,
                                   int64_t heads_per_pass_, int64_t grid_, int64_t smem_bytes_, int64_t tp_size_,
                                   bool fp8_weights_, std::optional<at::Tensor> burst_counts_, bool moe_)
    : model_args(std::move(model_args_)),
      scratch(std::move(scratch_)),
      burst_counts(std::move(burst_counts_)),
      device(model_args.device()),
      head_dim(head_dim_),
      heads_per_pass(heads_per_pass_),
      grid(grid_),
      smem_bytes(smem_bytes_),
      tp_size(tp_size_),
      fp8_weights(fp8_weights_),
      moe(moe_) {
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "kog monokernel: head_dim ", head_dim, " (64 or 128 only)");
  TORCH_CHECK(heads_per_pass == 2 || heads_per_pass == MonoConfig::kHeadsPerPass, "kog monokernel: heads_per_pass ",
              heads_per_pass, " (2 or ", MonoConfig::kHeadsPerPass, " only; plan.heads_per_pass)");
  TORCH_CHECK(tp_size >= 1 && tp_size <= MonoConfig::kMaxTP, "kog monokernel: tp_size ", tp_size, " outside 1..",
              MonoConfig::kMaxTP);
  TORCH_CHECK(grid >= 1 && grid <= INT32_MAX && smem_bytes > 0 && smem_bytes <= MonoConfig::kMaxSmemBytes,
              "kog monokernel: bad launch shape grid=", grid, " smem=", smem_bytes, " (grid >= 1, smem 1..",
              MonoConfig::kMaxSmemBytes, " bytes)");
  TORCH_CHECK(!fp8_weights || tp_size == 1, "kog monokernel: FP8 weights need tp_size 1, got tp_size ", tp_size);
  TORCH_CHECK(!moe || (has_moe_kernel(head_dim, heads_per_pass) && tp_size == 1 && !fp8_weights),
              "kog monokernel: the MoE kernel needs head_dim 128, heads_per_pass ", MonoConfig::kHeadsPerPass,
              ", tp_size 1 and bf16 weights, got head_dim ", head_dim, ", heads_per_pass ", heads_per_pass,
              ", tp_size ", tp_size, ", fp8_weights ", fp8_weights);
  TORCH_CHECK(!burst_counts.has_value() || tp_size == 1,
              "kog monokernel: burst_counts (penalised launches) needs tp_size 1, got tp_size ", tp_size);
  check_any_cuda(model_args, "model_args");
  TORCH_CHECK(model_args.scalar_type() == at::kByte && model_args.numel() == sizeof(ModelArgs),
              "kog monokernel: model_args must be uint8 [", sizeof(ModelArgs), "], got ", model_args.scalar_type(),
              " ", model_args.sizes());
  check_cuda(scratch, "scratch", device);
  if (burst_counts.has_value()) {
    check_cuda(*burst_counts, "burst_counts", device);
    TORCH_CHECK(burst_counts->scalar_type() == at::kInt && burst_counts->numel() >= 1,
                "kog monokernel: burst_counts must be int32 [vocab]");
  }
}

SampledLaunch::SampledLaunch(at::Tensor sample_seed_, double temperature_, int64_t top_k_, double top_p_,
                             double min_p_, std::optional<at::Tensor> defer_out_,
                             std::optional<at::Tensor> prompt_mask_, std::optional<at::Tensor> output_counts_,
                             double repetition_penalty_, double frequency_penalty_, double presence_penalty_)
    : sample_seed(std::move(sample_seed_)),
      temperature(static_cast<float>(temperature_)),
      top_k(static_cast<int32_t>(top_k_)),
      top_p(static_cast<float>(top_p_)),
      min_p(static_cast<float>(min_p_)),
      filtered(top_k_ > 0 || top_p < 1.f || min_p > 0.f),
      defer_out(filtered ? std::move(defer_out_) : std::nullopt),
      repetition_penalty(static_cast<float>(repetition_penalty_)),
      frequency_penalty(static_cast<float>(frequency_penalty_)),
      presence_penalty(static_cast<float>(presence_penalty_)),
      penalized(repetition_penalty != 1.f || frequency_penalty != 0.f || presence_penalty != 0.f),
      prompt_mask(penalized ? std::move(prompt_mask_) : std::nullopt),
      output_counts(penalized ? std::move(output_counts_) : std::nullopt) {
  TORCH_CHECK(temperature_ >= 0.0, "kog monokernel: a sampled launch needs temperature >= 0, got ", temperature_);
  // vLLM's filters (SamplingStates' values, fp32 as vLLM holds them): burst_sampling.cuh.
  TORCH_CHECK(top_k_ >= 0 && top_k_ < (int64_t{1} << 31), "kog monokernel: top_k ", top_k_, " (0 = off)");
  TORCH_CHECK(top_p > 0.f && top_p <= 1.f, "kog monokernel: top_p ", top_p_, " outside (0, 1]");
  TORCH_CHECK(min_p >= 0.f && min_p <= 1.f, "kog monokernel: min_p ", min_p_, " outside [0, 1]");
  TORCH_CHECK(!filtered || defer_out.has_value(),
              "kog monokernel: a launch with top-k / top-p / min-p needs defer_out");
  // vLLM's penalties (penalties.cuh), fp32 as PenaltiesState holds them; all three at their neutral values = off.
  if (penalized) {
    TORCH_CHECK(repetition_penalty > 0.f, "kog monokernel: repetition_penalty ", repetition_penalty_, " must be > 0");
    TORCH_CHECK(prompt_mask.has_value() && output_counts.has_value(),
                "kog monokernel: a launch with penalties needs prompt_mask and output_counts");
  }
  check_any_cuda(sample_seed, "sample_seed");
  TORCH_CHECK(sample_seed.scalar_type() == at::kLong && sample_seed.numel() == 1,
              "kog monokernel: sample_seed must be int64 [1]");
  const at::Device dev = sample_seed.device();
  if (filtered) {
    check_cuda(*defer_out, "defer_out", dev);
    TORCH_CHECK(defer_out->scalar_type() == at::kInt && defer_out->numel() >= 1,
                "kog monokernel: defer_out must be int32 [1]");
  }
  if (penalized) {
    // Their lengths are checked per launch, against the plan's vocabulary (burst_counts).
    check_cuda(*prompt_mask, "prompt_mask", dev);
    TORCH_CHECK(prompt_mask->scalar_type() == at::kInt,
                "kog monokernel: prompt_mask must be int32 [ceil(vocab / 32)], got ", prompt_mask->scalar_type());
    check_cuda(*output_counts, "output_counts", dev);
    TORCH_CHECK(output_counts->scalar_type() == at::kInt,
                "kog monokernel: output_counts must be int32 [vocab], got ", output_counts->scalar_type());
  }
}

RunAheadLaunch::RunAheadLaunch(std::optional<at::Tensor> launch_gate_, int64_t gate_min_,
                               std::optional<at::Tensor> cancel_, int64_t cancel_id_)
    : launch_gate(std::move(launch_gate_)), gate_min(gate_min_), cancel(std::move(cancel_)), cancel_id(cancel_id_) {
  TORCH_CHECK(launch_gate.has_value() || cancel.has_value(),
              "kog monokernel: a run-ahead launch needs launch_gate or cancel");
  TORCH_CHECK(gate_min >= INT32_MIN && gate_min <= INT32_MAX, "kog monokernel: gate_min ", gate_min,
              " outside the int32 range");
  if (cancel.has_value()) {
    // Read by the kernel while it runs: pinned host memory, through its device mapping.
    TORCH_CHECK(cancel->device().is_cpu() && cancel->scalar_type() == at::kLong && cancel->numel() >= 1 &&
                    cancel->is_pinned(),
                "kog monokernel: cancel must be a pinned CPU int64 [1] tensor");
  }
  if (launch_gate.has_value()) {
    check_any_cuda(*launch_gate, "launch_gate");
    TORCH_CHECK(launch_gate->scalar_type() == at::kInt && launch_gate->numel() >= 1,
                "kog monokernel: launch_gate must be int32 [1]");
  }
}

// --- the op: the per-call tensors, and how the plan, sampling and run-ahead settings fit together ---

void monokernel_step(const c10::intrusive_ptr<MonokernelLaunch>& plan_ptr, const at::Tensor& input_ids,
                     const at::Tensor& positions, const at::Tensor& block_table, const at::Tensor& slot_mapping,
                     at::Tensor& tokens_out, const std::optional<at::Tensor>& logits_out,
                     const std::optional<at::Tensor>& num_out, const std::optional<at::Tensor>& stop_ids,
                     int64_t num_tokens, const std::optional<c10::intrusive_ptr<SampledLaunch>>& sampling,
                     const std::optional<c10::intrusive_ptr<RunAheadLaunch>>& run_ahead,
                     const std::optional<at::Tensor>& model_args) {
  const MonokernelLaunch& plan = *plan_ptr;
  const at::Device dev = plan.device;
  if (model_args.has_value()) {
    check_cuda(*model_args, "model_args", dev);
    TORCH_CHECK(model_args->scalar_type() == at::kByte && model_args->numel() == sizeof(ModelArgs),
                "kog monokernel: model_args must be uint8 [", sizeof(ModelArgs), "], got ", model_args->scalar_type(),
                " ", model_args->sizes());
  }
  check_cuda(input_ids, "input_ids", dev);
  TORCH_CHECK((input_ids.scalar_type() == at::kInt || input_ids.scalar_type() == at::kLong) && input_ids.numel() >= 1,
              "kog monokernel: input_ids must be int32/int64 with >= 1 element");
  check_cuda(positions, "positions", dev);
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() >= 1, "kog monokernel: positions must be int64 [>=1]");
  check_cuda(block_table, "block_table", dev);
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 1 && block_table.numel() >= 1,
              "kog monokernel: block_table must be int32 [max_blocks]");
  check_cuda(slot_mapping, "slot_mapping", dev);
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() >= 1,
              "kog monokernel: slot_mapping must be int64 [>=1]");
  check_cuda(tokens_out, "tokens_out", dev);
  TORCH_CHECK(num_tokens >= 1, "kog monokernel: num_tokens must be >= 1");
  TORCH_CHECK(tokens_out.scalar_type() == at::kLong && tokens_out.numel() >= num_tokens,
              "kog monokernel: tokens_out must be int64 [>= num_tokens]");

  StepArgs step{};
  step.model = reinterpret_cast<const ModelArgs*>((model_args.has_value() ? *model_args : plan.model_args).data_ptr());
  step.input_ids = input_ids.data_ptr();
  step.ids_int64 = input_ids.scalar_type() == at::kLong ? 1 : 0;
  step.positions = positions.data_ptr<int64_t>();
  step.block_table = block_table.data_ptr<int32_t>();
  step.block_table_len = static_cast<int32_t>(block_table.numel());
  step.slot_mapping = slot_mapping.data_ptr<int64_t>();
  step.tokens_out = tokens_out.data_ptr<int64_t>();
  step.num_tokens = static_cast<int32_t>(num_tokens);
  if (logits_out.has_value()) {
    const at::Tensor& lo = *logits_out;
    check_cuda(lo, "logits_out", dev);
    TORCH_CHECK(lo.scalar_type() == at::kBFloat16 && lo.dim() >= 1, "kog monokernel: logits_out must be bf16");
    const int64_t rows = lo.dim() == 1 ? 1 : lo.size(0);
    TORCH_CHECK(rows >= num_tokens, "kog monokernel: logits_out has ", rows, " rows for ", num_tokens, " tokens");
    step.logits_out = reinterpret_cast<bf16*>(lo.data_ptr());
    step.logits_stride = lo.size(-1);
  }
  if (num_out.has_value()) {
    check_cuda(*num_out, "num_out", dev);
    TORCH_CHECK(num_out->scalar_type() == at::kInt && num_out->numel() >= 1, "kog monokernel: num_out must be int32 [1]");
    step.num_out = num_out->data_ptr<int32_t>();
  }
  // Greedy launches keep the filters and penalties at their neutral values.
  step.top_p = 1.f;
  step.repetition_penalty = 1.f;
  if (sampling.has_value()) {
    const SampledLaunch& s = **sampling;
    check_cuda(s.sample_seed, "sample_seed", dev);
    step.sample_seed = s.sample_seed.data_ptr<int64_t>();
    step.temperature = s.temperature;
    if (s.filtered) {
      TORCH_CHECK(plan.tp_size == 1, "kog monokernel: top-k / top-p / min-p bursts need tp_size 1");
      check_cuda(*s.defer_out, "defer_out", dev);
      step.top_k = s.top_k;
      step.top_p = s.top_p;
      step.min_p = s.min_p;
      step.filtered = 1;
      step.defer_out = s.defer_out->data_ptr<int32_t>();
    }
    if (s.penalized) {
      TORCH_CHECK(plan.tp_size == 1, "kog monokernel: penalties in a launch need tp_size 1");
      // burst_counts has one entry per LM-head row of the model (Monokernel allocates it with the table); vLLM's
      // rows must cover as many.
      TORCH_CHECK(plan.burst_counts.has_value(),
                  "kog monokernel: a launch with penalties needs the plan's burst_counts (MonokernelLaunch built "
                  "without one)");
      const int64_t vocab = plan.burst_counts->numel();
      check_cuda(*s.prompt_mask, "prompt_mask", dev);
      TORCH_CHECK(s.prompt_mask->numel() >= (vocab + 31) / 32, "kog monokernel: prompt_mask must be int32 [>= ",
                  (vocab + 31) / 32, "], got ", s.prompt_mask->sizes());
      check_cuda(*s.output_counts, "output_counts", dev);
      TORCH_CHECK(s.output_counts->numel() >= vocab, "kog monokernel: output_counts must be int32 [>= ", vocab,
                  "], got ", s.output_counts->sizes());
      step.prompt_mask = reinterpret_cast<const uint32_t*>(s.prompt_mask->data_ptr<int32_t>());
      step.output_counts = s.output_counts->data_ptr<int32_t>();
      step.burst_counts = plan.burst_counts->data_ptr<int32_t>();
      step.repetition_penalty = s.repetition_penalty;
      step.frequency_penalty = s.frequency_penalty;
      step.presence_penalty = s.presence_penalty;
      step.penalized = 1;
    }
  }
  if (stop_ids.has_value() && stop_ids->numel() > 0) {
    check_cuda(*stop_ids, "stop_ids", dev);
    TORCH_CHECK(stop_ids->scalar_type() == at::kLong, "kog monokernel: stop_ids must be int64");
    step.stop_ids = stop_ids->data_ptr<int64_t>();
    step.num_stop = static_cast<int32_t>(stop_ids->numel());
  }
  const RunAheadLaunch* ahead = run_ahead.has_value() ? run_ahead->get() : nullptr;
  if (ahead != nullptr && ahead->launch_gate.has_value()) {
    check_cuda(*ahead->launch_gate, "launch_gate", dev);
    TORCH_CHECK(plan.tp_size == 1, "kog monokernel: launch_gate needs tp_size 1");
    step.launch_gate = ahead->launch_gate->data_ptr<int32_t>();
    step.gate_min = static_cast<int32_t>(ahead->gate_min);
  }
  // Before any runtime call: cudaHostGetDevicePointer below answers for the current device.
  const c10::cuda::CUDAGuard guard(dev);
  if (ahead != nullptr && ahead->cancel.has_value()) {
    TORCH_CHECK(plan.tp_size == 1, "kog monokernel: cancel needs tp_size 1 (the ranks would decide apart)");
    void* mapped = nullptr;
    const cudaError_t err = cudaHostGetDevicePointer(&mapped, ahead->cancel->data_ptr(), 0);
    if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it before the check reports it
    TORCH_CHECK(err == cudaSuccess, "kog monokernel: cancel is not mapped into the device's address space: ",
                cudaGetErrorString(err));
    step.cancel = static_cast<const int64_t*>(mapped);
    step.cancel_id = ahead->cancel_id;
  }

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  const int g = static_cast<int>(plan.grid), sm = static_cast<int>(plan.smem_bytes);
  const bool sampled = step.sample_seed != nullptr;
  // A TP launch is its own instantiation. A table with tp_size > 1 needs tp_size > 1 here (Monokernel passes both);
  // the reverse, a tp_size = 1 table in a TP launch, is benchmarks/bench_tp_monokernel.py's no-exchange variant.
  // Every pass width computes every GQA ratio (a KV head's query heads in passes of HP); the plan picks the one that
  // computes no empty heads in the fewest passes.
  if (plan.heads_per_pass == 2) {
    dispatch<2>(step, plan.head_dim, sampled, plan.tp_size > 1, plan.fp8_weights, plan.moe, g, sm, stream);
  } else {
    dispatch<MonoConfig::kHeadsPerPass>(step, plan.head_dim, sampled, plan.tp_size > 1, plan.fp8_weights, plan.moe, g,
                                        sm, stream);
  }
}

namespace {
template <int D, int HP, bool kSampled, bool kTP, bool kFp8, bool kMoe = false>
int blocks_per_sm(int smem_bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(monokernel_kernel<D, HP, kSampled, kTP, kFp8, kMoe>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, MonoConfig::kMaxSmemBytes));
  int n = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, monokernel_kernel<D, HP, kSampled, kTP, kFp8, kMoe>,
                                                               MonoConfig::kThreads, static_cast<size_t>(smem_bytes)));
  return n;
}
template <int D, int HP>
int blocks_per_sm_flags(bool sampled, bool tp, bool fp8, bool moe, int smem_bytes) {
  if (moe) {
    if constexpr (has_moe_kernel(D, HP)) {
      return sampled ? blocks_per_sm<D, HP, true, false, false, true>(smem_bytes)
                     : blocks_per_sm<D, HP, false, false, false, true>(smem_bytes);
    }
    return 0;
  }
  if (fp8) {
    return sampled ? blocks_per_sm<D, HP, true, false, true>(smem_bytes)
                   : blocks_per_sm<D, HP, false, false, true>(smem_bytes);
  }
  if (tp) {
    return sampled ? blocks_per_sm<D, HP, true, true, false>(smem_bytes)
                   : blocks_per_sm<D, HP, false, true, false>(smem_bytes);
  }
  return sampled ? blocks_per_sm<D, HP, true, false, false>(smem_bytes)
                 : blocks_per_sm<D, HP, false, false, false>(smem_bytes);
}
template <int HP>
int blocks_per_sm_dim(int64_t head_dim, bool sampled, bool tp, bool fp8, bool moe, int smem_bytes) {
  return head_dim == 64 ? blocks_per_sm_flags<64, HP>(sampled, tp, fp8, moe, smem_bytes)
                        : blocks_per_sm_flags<128, HP>(sampled, tp, fp8, moe, smem_bytes);
}
}  // namespace

// Blocks of this monokernel instantiation the device holds at once: blocks per SM at this shared-memory size
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor) x the SMs this context may use (multiProcessorCount, which
// reflects an MPS active-thread percentage or a green context's SMs).
int64_t monokernel_max_grid(int64_t head_dim, int64_t heads_per_pass, bool sampled, bool tp, int64_t smem_bytes,
                            int64_t device, bool fp8_weights, bool moe) {
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "kog monokernel_max_grid: head_dim ", head_dim, " is not 64 or 128");
  TORCH_CHECK(!(fp8_weights && tp), "kog monokernel_max_grid: FP8 weights have no TP kernel");
  TORCH_CHECK(!moe || (has_moe_kernel(head_dim, heads_per_pass) && !tp && !fp8_weights),
              "kog monokernel_max_grid: the MoE kernel exists for head_dim 128, heads_per_pass ",
              MonoConfig::kHeadsPerPass, ", bf16 weights and no TP only");
  TORCH_CHECK(smem_bytes > 0 && smem_bytes <= MonoConfig::kMaxSmemBytes, "kog monokernel_max_grid: smem_bytes ",
              smem_bytes, " outside 1..", MonoConfig::kMaxSmemBytes);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const int sm = static_cast<int>(smem_bytes);
  const int per_sm = heads_per_pass == 2
                         ? blocks_per_sm_dim<2>(head_dim, sampled, tp, fp8_weights, moe, sm)
                         : blocks_per_sm_dim<MonoConfig::kHeadsPerPass>(head_dim, sampled, tp, fp8_weights, moe, sm);
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, static_cast<int>(device)));
  return static_cast<int64_t>(per_sm) * sms;
}

// Byte offsets of every ModelArgs / LayerArgs field, in declaration order, after the two struct sizes; the Python
// packer (kog_backend/monokernel/layout.py) is checked against this list.
std::vector<int64_t> monokernel_layout() {
  std::vector<int64_t> v;
  v.push_back(sizeof(ModelArgs));
  v.push_back(sizeof(LayerArgs));
#define KOG_OFF(S, f) v.push_back(static_cast<int64_t>(offsetof(S, f)))
  KOG_OFF(ModelArgs, num_layers); KOG_OFF(ModelArgs, hidden); KOG_OFF(ModelArgs, num_heads);
  KOG_OFF(ModelArgs, num_kv_heads); KOG_OFF(ModelArgs, head_dim); KOG_OFF(ModelArgs, inter);
  KOG_OFF(ModelArgs, block_size); KOG_OFF(ModelArgs, num_splits); KOG_OFF(ModelArgs, grid);
  KOG_OFF(ModelArgs, num_slots); KOG_OFF(ModelArgs, qk_norm); KOG_OFF(ModelArgs, max_position);
  KOG_OFF(ModelArgs, work_bytes); KOG_OFF(ModelArgs, prefetch_chunks); KOG_OFF(ModelArgs, stage_end_copies); KOG_OFF(ModelArgs, attn_end_copies); KOG_OFF(ModelArgs, attn_single_ctx);
  KOG_OFF(ModelArgs, stall_prefetch_chunks); KOG_OFF(ModelArgs, max_inflight); KOG_OFF(ModelArgs, tagged_handoffs); KOG_OFF(ModelArgs, stage_k); KOG_OFF(ModelArgs, stage_n);
  KOG_OFF(ModelArgs, stage_nu); KOG_OFF(ModelArgs, stage_chunks); KOG_OFF(ModelArgs, kv_stride_block);
  KOG_OFF(ModelArgs, kv_stride_pos); KOG_OFF(ModelArgs, kv_stride_head); KOG_OFF(ModelArgs, rms_eps);
  KOG_OFF(ModelArgs, attn_scale_log2); KOG_OFF(ModelArgs, embed); KOG_OFF(ModelArgs, final_norm);
  KOG_OFF(ModelArgs, lm_head); KOG_OFF(ModelArgs, cos_sin); KOG_OFF(ModelArgs, layers);
  KOG_OFF(ModelArgs, counters); KOG_OFF(ModelArgs, argmax_slots); KOG_OFF(ModelArgs, logits_scratch);
  KOG_OFF(ModelArgs, act_tagged);
  KOG_OFF(ModelArgs, trace); KOG_OFF(ModelArgs, tp_size); KOG_OFF(ModelArgs, tp_rank); KOG_OFF(ModelArgs, vocab_start);
  KOG_OFF(ModelArgs, tp_parts); KOG_OFF(ModelArgs, tp_keys); KOG_OFF(ModelArgs, tp_delta);
  KOG_OFF(ModelArgs, sample_work); KOG_OFF(ModelArgs, status_out); KOG_OFF(ModelArgs, inject_fault);
  KOG_OFF(ModelArgs, slot_bytes); KOG_OFF(ModelArgs, fp8_scaling); KOG_OFF(ModelArgs, fp8_scales); KOG_OFF(ModelArgs, attn_mode); KOG_OFF(ModelArgs, attn_prefetch);
  KOG_OFF(ModelArgs, moe_top_k); KOG_OFF(ModelArgs, moe_experts); KOG_OFF(ModelArgs, moe_norm_topk);
  KOG_OFF(ModelArgs, moe_inter); KOG_OFF(ModelArgs, moe_router_nu); KOG_OFF(ModelArgs, moe_router_chunks);
  KOG_OFF(ModelArgs, moe_ctr_base); KOG_OFF(ModelArgs, moe_routers); KOG_OFF(ModelArgs, moe_logits);
  KOG_OFF(ModelArgs, moe_route);
  KOG_OFF(LayerArgs, input_norm); KOG_OFF(LayerArgs, qkv); KOG_OFF(LayerArgs, q_norm); KOG_OFF(LayerArgs, k_norm);
  KOG_OFF(LayerArgs, o_proj); KOG_OFF(LayerArgs, post_norm); KOG_OFF(LayerArgs, gate_up); KOG_OFF(LayerArgs, down);
  KOG_OFF(LayerArgs, k_cache); KOG_OFF(LayerArgs, v_cache); KOG_OFF(LayerArgs, qkv_out); KOG_OFF(LayerArgs, q_out);
  KOG_OFF(LayerArgs, attn_ml); KOG_OFF(LayerArgs, attn_acc); KOG_OFF(LayerArgs, attn_out); KOG_OFF(LayerArgs, o_out);
  KOG_OFF(LayerArgs, rmid); KOG_OFF(LayerArgs, act); KOG_OFF(LayerArgs, down_out); KOG_OFF(LayerArgs, rin_next);
  KOG_OFF(LayerArgs, qkv_bias);
#undef KOG_OFF
  return v;
}

// MonoConfig's constants, in the order of kog_backend/monokernel/layout.py CONFIG_NAMES.
std::vector<int64_t> monokernel_config() {
  using C = MonoConfig;
  return {C::kConsumerWarps, C::kThreads,        C::kSlotBytes,       C::kMaxSlots,    C::kMinSlots,
          C::kMaxSmemBytes,  C::kHeaderBytes,    C::kBtCacheEntries,  C::kMaxResidRows, C::kPrefetchChunks,
          C::kWarpStride,    C::kMaxHidden,
          C::kHeadsPerPass,  C::kAttnUnroll,     C::kCombineBatch,    C::kNumStages,
          C::kCounterStride, C::kVersion,
          attn_work_floats(64), attn_work_floats(128), kCtrLayerBase, layer_counter_count(0),
          kTraceEvents,      C::kMaxTP,         kCtrTpLM,         C::kStageEndCopies, C::kAttnEndCopies,
          C::kHandoffQueue,  C::kAttnSingleCtx,  C::kStallPrefetchChunks,
          C::kTaggedHandoffs, C::kTaggedBatch,     C::kTaggedBuild,  C::kMaxInflight,
          C::kAttnShortLen,
          tagged_layer_words(8192, 32, 8, 64), tagged_layer_words(6144, 16, 8, 128),
          burst::BurstSamplingConfig::kGridBytes, burst::smem_bytes(0), kCtrSampleArrive,
          C::kSlotAlign,
          fp8_span_bytes(2048), fp8_span_bytes(14336), kFp8PerTensor, kFp8PerRow, kFp8Block128,
          C::kAttnMode, kAttnModeRounds, kAttnModeMma, kAttnModeMmaWide, C::kAttnTileLen,
          C::kAttnPrefetchRounds, C::kAttnMaxPrefetchRounds};
}

}  // namespace kog
