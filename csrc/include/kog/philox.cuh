// Triton's random stream as vLLM 0.26's Gumbel sampler draws it (triton/language/random.py, vLLM
// v1/worker/gpu/sample/gumbel.py), bit for bit; torch reference: kog_backend/reference/sampling.py.
//   Philox4x32-10 = Random123's philox4x32 with 10 rounds (counter c0..c3, key k0, k1; word 0 is tl.randint);
//   row key   = tl.randint(int64 seed, int64 position): key (seed lo, seed hi), counter (pos lo, pos hi, 0, 0);
//   column    = tl.randint4x(row key, int32 col): key (row key, 0), counter (col, 0, 0, 0);
//   uniform   = uint_to_uniform_float: int32 view, negatives folded to ~x, RN to fp32, times 2^-31 (1 - 2^-24),
//               clamped below at the same value (vLLM tl_rand32, includes_zero=False);
//   uniform64 = words 0 (low) and 1 (high) as a uint64, RN to double, times 2^-64, clamped at DBL_MIN.
// Pure integer and correctly rounded fp32/fp64 arithmetic, so these functions also compile as host C++
// (tests/sampling_host_check.cpp checks them on the CPU against the reference).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KOG_RNG_FN __host__ __device__ __forceinline__
#else
#define KOG_RNG_FN inline
#endif

namespace kog {
namespace rng {

struct PhiloxConfig {
  static constexpr int kRounds = 10;
  // Salmon et al. 2011, as triton/language/random.py uses them for 32-bit words.
  static constexpr uint32_t kKeyA = 0x9E3779B9u;
  static constexpr uint32_t kKeyB = 0xBB67AE85u;
  static constexpr uint32_t kRoundA = 0xD2511F53u;
  static constexpr uint32_t kRoundB = 0xCD9E8D57u;
  // Triton uint_to_uniform_float's scale, also vLLM tl_rand32's clamp: fp32 bits 0x2FFFFFFF = 2^-31 (1 - 2^-24).
  static constexpr uint32_t kRand32ScaleBits = 0x2FFFFFFFu;
  // vLLM tl_rand64: 2^-64 and the clamp (float64 tiny).
  static constexpr double kRand64Scale = 5.421010862427522170037e-20;
  static constexpr double kRand64Min = 2.2250738585072014e-308;
};

struct Words {
  uint32_t w0, w1, w2, w3;
};

KOG_RNG_FN uint32_t mulhi32(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);  // one IMAD.HI / mul.hi.u32 on the GPU
}

KOG_RNG_FN Words philox4x32_10(Words c, uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < PhiloxConfig::kRounds; ++r) {
    const uint32_t hi_b = mulhi32(PhiloxConfig::kRoundB, c.w2);
    const uint32_t lo_b = PhiloxConfig::kRoundB * c.w2;
    const uint32_t hi_a = mulhi32(PhiloxConfig::kRoundA, c.w0);
    const uint32_t lo_a = PhiloxConfig::kRoundA * c.w0;
    c = {hi_b ^ c.w1 ^ k0, lo_b, hi_a ^ c.w3 ^ k1, lo_a};
    k0 += PhiloxConfig::kKeyA;
    k1 += PhiloxConfig::kKeyB;
  }
  return c;
}

// tl.randint(int64 seed, int64 pos): the 32-bit key of the row sampled at `position`.
KOG_RNG_FN uint32_t row_key(int64_t seed, int64_t position) {
  const uint64_t s = static_cast<uint64_t>(seed);
  const uint64_t p = static_cast<uint64_t>(position);
  const Words c = {static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32), 0u, 0u};
  return philox4x32_10(c, static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32)).w0;
}

// tl.randint4x(row key, col) for vLLM's int32 column offsets.
KOG_RNG_FN Words column_words(uint32_t key, uint32_t col) { return philox4x32_10({col, 0u, 0u, 0u}, key, 0u); }

KOG_RNG_FN float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Triton uint_to_uniform_float (32-bit words) -> [0, 1).
KOG_RNG_FN float uint_to_uniform(uint32_t w) {
  const int32_t i = static_cast<int32_t>(w);
  const int32_t folded = i < 0 ? ~i : i;
#if defined(__CUDA_ARCH__)
  return __fmul_rn(__int2float_rn(folded), __uint_as_float(PhiloxConfig::kRand32ScaleBits));
#else
  return static_cast<float>(folded) * bits_to_float(PhiloxConfig::kRand32ScaleBits);
#endif
}

// vLLM tl_rand32(key, col, includes_zero=False).
KOG_RNG_FN float uniform_f32(uint32_t key, uint32_t col) {
  return fmaxf(uint_to_uniform(column_words(key, col).w0), bits_to_float(PhiloxConfig::kRand32ScaleBits));
}

// vLLM tl_rand64(key, col, includes_zero=False).
KOG_RNG_FN double uniform_f64(uint32_t key, uint32_t col) {
  const Words w = column_words(key, col);
  const uint64_t r = (static_cast<uint64_t>(w.w1) << 32) | w.w0;
#if defined(__CUDA_ARCH__)
  return fmax(__dmul_rn(__ull2double_rn(r), PhiloxConfig::kRand64Scale), PhiloxConfig::kRand64Min);
#else
  return std::fmax(static_cast<double>(r) * PhiloxConfig::kRand64Scale, PhiloxConfig::kRand64Min);
#endif
}

}  // namespace rng
}  // namespace kog
