// Declarations of the test-only launchers registered in test_bindings.cpp (kog_backend._C_test, torch.ops.kog_test).
// None is on a serving path; the production extension kog_backend._C binds none of them.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace kog {

// --- fault handling (fault_test.cu) ---
void hold_sms_test(const at::Tensor& release, int64_t blocks, int64_t smem_bytes, int64_t timeout_ms, int64_t device);

// --- sampling building blocks (sampling_test.cu) ---
void philox_test(const at::Tensor& counters, int64_t key, at::Tensor& out);
void philox_uniform_test(int64_t seed, int64_t position, at::Tensor& key_out, at::Tensor& words, at::Tensor& uniform,
                         at::Tensor& noise, at::Tensor& uniform64, at::Tensor& noise64);
void gumbel_noise_words_test(int64_t first_word, at::Tensor& uniform, at::Tensor& noise);
void gumbel_argmax_test(const at::Tensor& logits, double temperature, double min_p, int64_t top_k, int64_t cut_key,
                        int64_t cut_col, int64_t seed, int64_t position, bool use_fp64, int64_t num_slices,
                        at::Tensor& params, at::Tensor& processed, at::Tensor& slice_best, at::Tensor& token);

// --- MoE route (moe_route_test.cu) ---
void moe_route_test(const at::Tensor& logits, int64_t top_k, bool norm_topk_prob, at::Tensor& ids,
                    at::Tensor& weights);

}  // namespace kog
