// Launcher of the monokernel (device code: include/kog/monokernel.cuh). Checks the per-step inputs, launches
// one cooperative grid (co-residency of all blocks is what lets them wait on each other) on the current stream.
// The argument table (ModelArgs, LayerArgs[]) is built once by kog_backend/monokernel/ and passed as a device
// buffer; nothing is built on the host per call.
#include <cstddef>
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
#include "kog/monokernel.cuh"
#include "kog/sync.cuh"
#include "kog/trace.cuh"
#include "ops.h"

namespace kog {

namespace {

template <int D, int HP, bool kSampled, bool kTP>
void launch(const StepArgs& step, int grid, int smem_bytes, cudaStream_t stream) {
  static bool attr_set[64] = {};
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && !attr_set[dev]) {
    const cudaError_t err = cudaFuncSetAttribute(monokernel_kernel<D, HP, kSampled, kTP>,
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
  const cudaError_t err = cudaLaunchKernelEx(&cfg, monokernel_kernel<D, HP, kSampled, kTP>, step);
  TORCH_CHECK(err == cudaSuccess, "kog monokernel launch failed (grid ", grid, ", ", MonoConfig::kThreads,
              " threads, ", smem_bytes, " B shared memory): ", cudaGetErrorString(err));
}

void check_cuda(const at::Tensor& t, const char* name, const at::Device& dev) {
  TORCH_CHECK(t.is_cuda() && t.device() == dev, "kog monokernel: ", name, " must be on ", dev, ", got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "kog monokernel: ", name, " must be contiguous");
}

// One template parameter per level: the pass width HP (the caller), the head dim, then the TP and sampling flags.
template <int D, int HP>
void dispatch_flags(const StepArgs& step, bool sampled, bool tp, int grid, int smem_bytes, cudaStream_t stream) {
  if (tp) {
    sampled ? launch<D, HP, true, true>(step, grid, smem_bytes, stream)
            : launch<D, HP, false, true>(step, grid, smem_bytes, stream);
  } else {
    sampled ? launch<D, HP, true, false>(step, grid, smem_bytes, stream)
            : launch<D, HP, false, false>(step, grid, smem_bytes, stream);
  }
}

template <int HP>
void dispatch(const StepArgs& step, int64_t head_dim, bool sampled, bool tp, int grid, int smem_bytes,
              cudaStream_t stream) {
  if (head_dim == 64) {
    dispatch_flags<64, HP>(step, sampled, tp, grid, smem_bytes, stream);
  } else {
    dispatch_flags<128, HP>(step, sampled, tp, grid, smem_bytes, stream);
  }
}

}  // namespace

void monokernel_step(const at::Tensor& model_args, const at::Tensor& input_ids, const at::Tensor& positions,
                     const at::Tensor& block_table, const at::Tensor& slot_mapping, at::Tensor& tokens_out,
                     const std::optional<at::Tensor>& logits_out, const std::optional<at::Tensor>& num_out,
                     const std::optional<at::Tensor>& stop_ids, at::Tensor& scratch, int64_t num_tokens,
                     int64_t head_dim, int64_t heads_per_pass, int64_t grid, int64_t smem_bytes,
                     const std::optional<at::Tensor>& sample_seed, double temperature, int64_t tp_size,
                     const std::optional<at::Tensor>& launch_gate, int64_t gate_min,
                     const std::optional<at::Tensor>& cancel, int64_t cancel_id, int64_t top_k, double top_p,
                     double min_p, const std::optional<at::Tensor>& defer_out,
                     const std::optional<at::Tensor>& prompt_mask, const std::optional<at::Tensor>& output_counts,
                     const std::optional<at::Tensor>& burst_counts, double repetition_penalty,
                     double frequency_penalty, double presence_penalty) {
  const at::Device dev = model_args.device();
  check_cuda(model_args, "model_args", dev);
  TORCH_CHECK(model_args.scalar_type() == at::kByte && model_args.numel() == sizeof(ModelArgs),
              "kog monokernel: model_args must be uint8 [", sizeof(ModelArgs), "], got ", model_args.sizes());
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
  check_cuda(scratch, "scratch", dev);
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "kog monokernel: head_dim ", head_dim, " (64 or 128 only)");
  TORCH_CHECK(heads_per_pass == 2 || heads_per_pass == MonoConfig::kHeadsPerPass, "kog monokernel: heads_per_pass ",
              heads_per_pass, " (2 or ", MonoConfig::kHeadsPerPass, " only; plan.heads_per_pass)");
  TORCH_CHECK(tp_size >= 1 && tp_size <= MonoConfig::kMaxTP, "kog monokernel: tp_size ", tp_size, " outside 1..",
              MonoConfig::kMaxTP);
  TORCH_CHECK(grid >= 1 && smem_bytes > 0 && smem_bytes <= MonoConfig::kMaxSmemBytes,
              "kog monokernel: bad launch shape grid=", grid, " smem=", smem_bytes);

  StepArgs step{};
  step.model = reinterpret_cast<const ModelArgs*>(model_args.data_ptr());
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
  if (sample_seed.has_value()) {
    check_cuda(*sample_seed, "sample_seed", dev);
    TORCH_CHECK(sample_seed->scalar_type() == at::kLong && sample_seed->numel() == 1,
                "kog monokernel: sample_seed must be int64 [1]");
    TORCH_CHECK(temperature >= 0.0, "kog monokernel: a sampled launch needs temperature >= 0, got ", temperature);
    step.sample_seed = sample_seed->data_ptr<int64_t>();
    step.temperature = static_cast<float>(temperature);
  }
  // vLLM's filters (SamplingStates' values, fp32 as vLLM holds them): burst_sampling.cuh.
  const float p32 = static_cast<float>(top_p), mp32 = static_cast<float>(min_p);
  TORCH_CHECK(top_k >= 0 && top_k < (int64_t{1} << 31), "kog monokernel: top_k ", top_k, " (0 = off)");
  TORCH_CHECK(p32 > 0.f && p32 <= 1.f, "kog monokernel: top_p ", top_p, " outside (0, 1]");
  TORCH_CHECK(mp32 >= 0.f && mp32 <= 1.f, "kog monokernel: min_p ", min_p, " outside [0, 1]");
  const bool filtered = top_k > 0 || p32 < 1.f || mp32 > 0.f;
  if (filtered) {
    TORCH_CHECK(step.sample_seed != nullptr, "kog monokernel: top-k / top-p / min-p need a sampled launch (sample_seed)");
    TORCH_CHECK(tp_size == 1, "kog monokernel: top-k / top-p / min-p bursts need tp_size 1");
    TORCH_CHECK(defer_out.has_value(), "kog monokernel: a launch with top-k / top-p / min-p needs defer_out");
    check_cuda(*defer_out, "defer_out", dev);
    TORCH_CHECK(defer_out->scalar_type() == at::kInt && defer_out->numel() >= 1,
                "kog monokernel: defer_out must be int32 [1]");
    step.top_k = static_cast<int32_t>(top_k);
    step.top_p = p32;
    step.min_p = mp32;
    step.filtered = 1;
    step.defer_out = defer_out->data_ptr<int32_t>();
  } else {
    step.top_p = 1.f;
  }
  // vLLM's penalties (penalties.cuh), fp32 as PenaltiesState holds them; all three at their neutral values = off.
  const float rep32 = static_cast<float>(repetition_penalty), freq32 = static_cast<float>(frequency_penalty),
              pres32 = static_cast<float>(presence_penalty);
  if (rep32 != 1.f || freq32 != 0.f || pres32 != 0.f) {
    TORCH_CHECK(step.sample_seed != nullptr, "kog monokernel: penalties need a sampled launch (sample_seed)");
    TORCH_CHECK(tp_size == 1, "kog monokernel: penalties in a launch need tp_size 1");
    TORCH_CHECK(rep32 > 0.f, "kog monokernel: repetition_penalty ", repetition_penalty, " must be > 0");
    TORCH_CHECK(prompt_mask.has_value() && output_counts.has_value() && burst_counts.has_value(),
                "kog monokernel: a launch with penalties needs prompt_mask, output_counts and burst_counts");
    // burst_counts has one entry per LM-head row of the model (Monokernel allocates it with the table); vLLM's
    // rows must cover as many.
    check_cuda(*burst_counts, "burst_counts", dev);
    TORCH_CHECK(burst_counts->scalar_type() == at::kInt && burst_counts->numel() >= 1,
                "kog monokernel: burst_counts must be int32 [vocab]");
    const int64_t vocab = burst_counts->numel();
    check_cuda(*prompt_mask, "prompt_mask", dev);
    TORCH_CHECK(prompt_mask->scalar_type() == at::kInt && prompt_mask->numel() >= (vocab + 31) / 32,
                "kog monokernel: prompt_mask must be int32 [>= ", (vocab + 31) / 32, "]");
    check_cuda(*output_counts, "output_counts", dev);
    TORCH_CHECK(output_counts->scalar_type() == at::kInt && output_counts->numel() >= vocab,
                "kog monokernel: output_counts must be int32 [>= ", vocab, "]");
    step.prompt_mask = reinterpret_cast<const uint32_t*>(prompt_mask->data_ptr<int32_t>());
    step.output_counts = output_counts->data_ptr<int32_t>();
    step.burst_counts = burst_counts->data_ptr<int32_t>();
    step.repetition_penalty = rep32;
    step.frequency_penalty = freq32;
    step.presence_penalty = pres32;
    step.penalized = 1;
  } else {
    step.repetition_penalty = 1.f;
  }
  if (stop_ids.has_value() && stop_ids->numel() > 0) {
    check_cuda(*stop_ids, "stop_ids", dev);
    TORCH_CHECK(stop_ids->scalar_type() == at::kLong, "kog monokernel: stop_ids must be int64");
    step.stop_ids = stop_ids->data_ptr<int64_t>();
    step.num_stop = static_cast<int32_t>(stop_ids->numel());
  }
  if (launch_gate.has_value()) {
    check_cuda(*launch_gate, "launch_gate", dev);
    TORCH_CHECK(launch_gate->scalar_type() == at::kInt && launch_gate->numel() >= 1,
                "kog monokernel: launch_gate must be int32 [1]");
    TORCH_CHECK(tp_size == 1, "kog monokernel: launch_gate needs tp_size 1");
    step.launch_gate = launch_gate->data_ptr<int32_t>();
    step.gate_min = static_cast<int32_t>(gate_min);
  }
  // Before any runtime call: cudaHostGetDevicePointer below answers for the current device.
  const c10::cuda::CUDAGuard guard(dev);
  if (cancel.has_value()) {
    // Read by the kernel while it runs: pinned host memory, through its device mapping.
    TORCH_CHECK(cancel->device().is_cpu() && cancel->is_pinned() && cancel->scalar_type() == at::kLong &&
                    cancel->numel() >= 1,
                "kog monokernel: cancel must be a pinned CPU int64 [1] tensor");
    TORCH_CHECK(tp_size == 1, "kog monokernel: cancel needs tp_size 1 (the ranks would decide apart)");
    void* mapped = nullptr;
    const cudaError_t err = cudaHostGetDevicePointer(&mapped, cancel->data_ptr(), 0);
    if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it before the check reports it
    TORCH_CHECK(err == cudaSuccess, "kog monokernel: cancel is not mapped into the device's address space: ",
                cudaGetErrorString(err));
    step.cancel = static_cast<const int64_t*>(mapped);
    step.cancel_id = cancel_id;
  }

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  const int g = static_cast<int>(grid), sm = static_cast<int>(smem_bytes);
  const bool sampled = step.sample_seed != nullptr;
  // A TP launch is its own instantiation. A table with tp_size > 1 needs tp_size > 1 here (Monokernel passes both);
  // the reverse, a tp_size = 1 table in a TP launch, is benchmarks/bench_tp_monokernel.py's no-exchange variant.
  // Every pass width computes every GQA ratio (a KV head's query heads in passes of HP); the plan picks the one that
  // computes no empty heads in the fewest passes.
  if (heads_per_pass == 2) {
    dispatch<2>(step, head_dim, sampled, tp_size > 1, g, sm, stream);
  } else {
    dispatch<MonoConfig::kHeadsPerPass>(step, head_dim, sampled, tp_size > 1, g, sm, stream);
  }
}

namespace {
template <int D, int HP, bool kSampled, bool kTP>
int blocks_per_sm(int smem_bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(monokernel_kernel<D, HP, kSampled, kTP>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, MonoConfig::kMaxSmemBytes));
  int n = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, monokernel_kernel<D, HP, kSampled, kTP>,
                                                               MonoConfig::kThreads, static_cast<size_t>(smem_bytes)));
  return n;
}
template <int D, int HP>
int blocks_per_sm_flags(bool sampled, bool tp, int smem_bytes) {
  if (tp) return sampled ? blocks_per_sm<D, HP, true, true>(smem_bytes) : blocks_per_sm<D, HP, false, true>(smem_bytes);
  return sampled ? blocks_per_sm<D, HP, true, false>(smem_bytes) : blocks_per_sm<D, HP, false, false>(smem_bytes);
}
template <int HP>
int blocks_per_sm_dim(int64_t head_dim, bool sampled, bool tp, int smem_bytes) {
  return head_dim == 64 ? blocks_per_sm_flags<64, HP>(sampled, tp, smem_bytes)
                        : blocks_per_sm_flags<128, HP>(sampled, tp, smem_bytes);
}
}  // namespace

// Blocks of this monokernel instantiation the device holds at once: blocks per SM at this shared-memory size
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor) x the SMs this context may use (multiProcessorCount, which
// reflects an MPS active-thread percentage or a green context's SMs).
int64_t monokernel_max_grid(int64_t head_dim, int64_t heads_per_pass, bool sampled, bool tp, int64_t smem_bytes,
                            int64_t device) {
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "kog monokernel_max_grid: head_dim ", head_dim, " is not 64 or 128");
  TORCH_CHECK(smem_bytes > 0 && smem_bytes <= MonoConfig::kMaxSmemBytes, "kog monokernel_max_grid: smem_bytes ",
              smem_bytes, " outside 1..", MonoConfig::kMaxSmemBytes);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const int sm = static_cast<int>(smem_bytes);
  const int per_sm = heads_per_pass == 2 ? blocks_per_sm_dim<2>(head_dim, sampled, tp, sm)
                                         : blocks_per_sm_dim<MonoConfig::kHeadsPerPass>(head_dim, sampled, tp, sm);
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
  KOG_OFF(ModelArgs, slot_bytes);
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
          C::kSlotAlign};
}

}  // namespace kog
