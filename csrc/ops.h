// Declarations of the launchers registered in torch_bindings.cpp (test-only ones: testing/test_ops.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "monokernel_launch.h"

namespace kog {

// KOG_OPS_VERSION (version.h): bumped whenever an op's schema changes; kog_backend.ops checks it at load.
int64_t version();

// --- monokernel (csrc/monokernel.cu) ---
// KOG-MONOKERNEL-DECLS
// plan: what is fixed per Monokernel; sampling / run_ahead: a sampled / run-ahead launch's settings, or none;
// model_args: another argument table for this launch (benchmarks' variant and trace tables), or the plan's.
void monokernel_step(const c10::intrusive_ptr<MonokernelLaunch>& plan, const at::Tensor& input_ids,
                     const at::Tensor& positions, const at::Tensor& block_table, const at::Tensor& slot_mapping,
                     at::Tensor& tokens_out, const std::optional<at::Tensor>& logits_out,
                     const std::optional<at::Tensor>& num_out, const std::optional<at::Tensor>& stop_ids,
                     int64_t num_tokens, const std::optional<c10::intrusive_ptr<SampledLaunch>>& sampling,
                     const std::optional<c10::intrusive_ptr<RunAheadLaunch>>& run_ahead,
                     const std::optional<at::Tensor>& model_args);
std::vector<int64_t> monokernel_layout();
int64_t monokernel_max_grid(int64_t head_dim, int64_t heads_per_pass, bool sampled, bool tp, int64_t smem_bytes,
                            int64_t device, bool fp8_weights, bool moe);
std::vector<int64_t> monokernel_config();

// --- collective (csrc/allreduce.cu) ---
// KOG-ALLREDUCE-DECLS
std::vector<int64_t> allreduce_layout(int64_t world, int64_t oneshot_cap, int64_t twoshot_cap);
std::vector<int64_t> allreduce_constants();
int64_t allreduce_init(std::vector<int64_t> peer_bases, int64_t rank, int64_t oneshot_cap, int64_t twoshot_cap,
                       int64_t buffer_bytes, const at::Tensor& epochs, const at::Tensor& error, int64_t timeout_ns,
                       int64_t refresh_log2, bool trap_on_timeout);
void allreduce_dispose(int64_t handle);
void allreduce(int64_t handle, const at::Tensor& input, at::Tensor& output, int64_t algo);
int64_t ipc_alloc(int64_t nbytes, int64_t device);
void ipc_free(int64_t ptr, int64_t device);
std::vector<int64_t> ipc_get_handle(int64_t ptr, int64_t device);
int64_t ipc_open(std::vector<int64_t> handle, int64_t device);
void ipc_close(int64_t ptr, int64_t device);
void ipc_copy(int64_t dst, int64_t src, int64_t nbytes, int64_t device);

}  // namespace kog
