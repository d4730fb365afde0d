// vLLM 0.26's repetition, frequency and presence penalties on one logit, bit for bit, inside a K-token burst
// (torch reference of the same arithmetic: kog_backend/reference/sampling.py `apply_penalties`).
//
// vLLM (sample/penalties.py `_penalties_kernel`) runs before temperature, on the bf16 logits in place: per column c
// of the request's row, with count = output_bin_counts[c] (+ the draft tokens before this one) and
// in_prompt = bit c of prompt_bin_mask (int32 words, bit c % 32 of word c / 32):
//   x = fp32(logit)
//   if rep != 1: scale = (in_prompt or count > 0) ? rep : 1;  x = x * (x > 0 ? div.full.f32(1, scale) : scale)
//   x = x - freq * count          (Triton fuses the multiply and the subtract into one FMA: fp fusion is on)
//   x = x - pres * (count > 0)
//   logit = bf16_rn(x)            (stored back into the bf16 logits)
// Inside a burst, count also holds this launch's own earlier tokens (Penalty::burst_counts), which vLLM's
// post-update adds to output_bin_counts only after the step. The multiply, divide and FMA are spelled with explicit
// rounding intrinsics: nvcc must not contract or reorder them.
#pragma once

#include <cstdint>

#include "kog/numerics.cuh"
#include "kog/sampling.cuh"
#include "kog/sync.cuh"

namespace kog {
namespace penalties {

// One request's penalties (SamplingParams' values as vLLM's PenaltiesState holds them, fp32).
struct Penalty {
  const uint32_t* prompt_mask;   // [ceil(V / 32)] vLLM's prompt_bin_mask row (read-only while the kernel runs)
  const int32_t* output_counts;  // [V] vLLM's output_bin_counts row as of the launch (read-only while it runs)
  const int32_t* burst_counts;   // [V] this launch's tokens so far (written by the token's publisher, released
                                 // with kCtrTokenReady, which every block acquires before the next LM head)
  float rep, freq, pres;
};

// The penalised logit (fp32 holding a bf16 value) of column `col`, whose LM-head value is `x` (a bf16 value).
__device__ __forceinline__ float penalized(float x, uint32_t col, const Penalty& p) {
  const int32_t count = __ldg(p.output_counts + col) + static_cast<int32_t>(ld_cg_u32(
                                                           reinterpret_cast<const uint32_t*>(p.burst_counts) + col));
  if (p.rep != 1.f) {
    const bool in_prompt = ((__ldg(p.prompt_mask + (col >> 5)) >> (col & 31u)) & 1u) != 0u;
    const float scale = (in_prompt || count > 0) ? p.rep : 1.f;
    x = __fmul_rn(x, x > 0.f ? sampling::div_full(1.f, scale) : scale);
  }
  x = __fmaf_rn(-p.freq, static_cast<float>(count), x);
  x = __fsub_rn(x, count > 0 ? p.pres : 0.f);
  return round_bf16(x);
}

}  // namespace penalties
}  // namespace kog
