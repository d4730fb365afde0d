// The one TORCH_LIBRARY registration of kog_backend._C_test, the test-only extension: launchers that run the
// monokernel's device building blocks in isolation, or disturb it (kernels that hold SMs), for the GPU tests.
// Registered as torch.ops.kog_test, apart from the production ops (torch.ops.kog); loaded by
// kog_backend.ops.test_ops() only. Mutated arguments are marked `Tensor(a!)`.
#include <torch/library.h>

#include "test_ops.h"
#include "version.h"

namespace {

// The same number as kog::version() of kog_backend._C: both extensions are built from one tree.
int64_t test_version() { return KOG_OPS_VERSION; }

}  // namespace

TORCH_LIBRARY(kog_test, m) {
  m.def("version() -> int");
  m.impl("version", &test_version);

  // --- fault handling (fault_test.cu) ---
  // `blocks` blocks of `smem_bytes` dynamic shared memory each, on the device's current stream, that spin until
  // release[0] (pinned CPU int32, written by the host) != 0 or timeout_ms pass: they hold SMs from other kernels.
  m.def("hold_sms_test(Tensor release, int blocks, int smem_bytes, int timeout_ms, int device) -> ()", &kog::hold_sms_test);

  // --- sampling building blocks (sampling_test.cu) ---
  // Philox4x32-10 of counters int64 [4, n] (uint32 values) under the 64-bit key.
  m.def("philox_test(Tensor counters, int key, Tensor(a!) out) -> ()");
  // vLLM's Gumbel stream of one row: key_out [1], words int64 [4, n], uniform/noise fp32 [n], fp64 variants [n].
  m.def("philox_uniform_test(int seed, int position, Tensor(a!) key_out, Tensor(b!) words, Tensor(c!) uniform, "
        "Tensor(d!) noise, Tensor(e!) uniform64, Tensor(f!) noise64) -> ()");
  // Clamped uniform and noise of the 32-bit words first_word + i.
  m.def("gumbel_noise_words_test(int first_word, Tensor(a!) uniform, Tensor(b!) noise) -> ()");
  // The sampled token of one bf16 row through temperature, min_p, a top-k (radix select) or given cut, and the
  // Gumbel argmax over num_slices blocks; also the row parameters (int32 [8]: RowParams = temperature,
  // min_p_threshold, cut key, cut column, has_cut, Gumbel key), processed logits and per-slice best keys.
  m.def("gumbel_argmax_test(Tensor logits, float temperature, float min_p, int top_k, int cut_key, int cut_col, "
        "int seed, int position, bool use_fp64, int num_slices, Tensor(a!) params, Tensor(b!) processed, "
        "Tensor(c!) slice_best, Tensor(d!) token) -> ()");

  // --- MoE route (moe_route_test.cu) ---
  // Per row of bf16 router logits [rows, E]: the top_k experts (int32, decreasing probability, ties to the lower
  // index) and their fp32 weights (renormalised when norm_topk_prob), one warp per row.
  m.def("moe_route_test(Tensor logits, int top_k, bool norm_topk_prob, Tensor(a!) ids, Tensor(b!) weights) -> ()");
}

TORCH_LIBRARY_IMPL(kog_test, CUDA, m) {
  m.impl("moe_route_test", &kog::moe_route_test);
  m.impl("philox_test", &kog::philox_test);
  m.impl("philox_uniform_test", &kog::philox_uniform_test);
  m.impl("gumbel_noise_words_test", &kog::gumbel_noise_words_test);
  m.impl("gumbel_argmax_test", &kog::gumbel_argmax_test);
}
