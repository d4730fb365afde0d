// Hand-offs through tagged words: QKV -> attention and attention -> O in every TP = 1 kernel (tagged_attention_chain),
// gate/up -> down a benchmark variant (ModelArgs::tagged_handoffs bit 1); docs/monokernel.md items 12, 12b.
//
// A counter hand-off costs the producer a release (its fence waits for the bulk copies its SM has in flight:
// ~1 us with none under the others' stream, 5-7 us with six, docs/tuning.md) and the consumer a counter round
// trip before the data round trip. Here the producer stores each bf16 output together with the token's tag in one
// 32-bit word (st.relaxed.gpu: single-copy atomic, no fence) and the consumer polls the words themselves: a word
// that carries this token's tag carries this token's value. No ordering is needed, only each word's atomicity.
//
// Tags: 1 + epoch mod 65535, never 0, so a zeroed buffer is never ready (the host zeroes it with the counters).
// Every step rewrites every word of every layer, so a word is always from this token or the previous one; a tag
// can only repeat 65535 tokens later.
#pragma once

#include <cstdint>

#include "kog/args.cuh"
#include "kog/config.cuh"
#include "kog/numerics.cuh"
#include "kog/sync.cuh"

namespace kog {

// Bits of ModelArgs::tagged_handoffs (a benchmark variant, built only with -DKOG_TAGGED_HANDOFFS=1).
constexpr int kTaggedGateUp = 1;  // gate/up -> down: act through the layer's tagged act words

// A layer's tagged words (ModelArgs::act_tagged, [num_layers][tagged_layer_words]): act [I] | qkv_out
// [(nh + 2 nkv) D] | attn_out [nh D]. A TP = 1 launch rewrites every qkv_out and attn_out word (and, with bit 1,
// every act word) for every token and layer it runs. The host sizes the buffer with layout.tagged_layer_words (checked through
// monokernel_config).
__host__ __device__ constexpr int64_t tagged_layer_words(int64_t inter, int64_t nh, int64_t nkv, int64_t d) {
  return inter + (nh + 2 * nkv) * d + nh * d;
}

// Whether the attention chain (QKV -> attention -> O) of a kernel goes through tagged words: every TP = 1 kernel,
// no TP kernel (whose ranks exchange partial sums through counters, tp.cuh). The consumers then make the QKV
// hand-off without a release and the loader does not hold for it, so both read this one constant.
template <bool kTP>
__host__ __device__ constexpr bool tagged_attention_chain() {
  return !kTP;
}

__device__ __forceinline__ uint32_t handoff_tag(uint32_t epoch) { return epoch % 65535u + 1u; }
__device__ __forceinline__ uint32_t tagged_word(uint32_t tag, float v) {
  return (tag << 16) | static_cast<uint32_t>(f2bf_bits(v));
}

__device__ __forceinline__ void st_relaxed_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Four relaxed 32-bit loads (the memory model treats a vector access as its scalar accesses).
__device__ __forceinline__ uint4 ld_relaxed_v4(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One lane's N tagged words src[lane + 32 e] (e < N), as bf16 bit patterns, once each carries `tag`: all N loads are
// issued before any is checked, and only those not yet ready are polled again. A wait past kWaitTimeoutCycles
// records itself (site kSiteTagged) and returns what it has.
template <int N>
__device__ __forceinline__ void tagged_lane_words(const uint32_t* src, int lane, uint32_t tag, uint32_t* ctrs,
                                                  uint16_t (&out)[N]) {
  uint32_t w[N];
#pragma unroll
  for (int e = 0; e < N; ++e) w[e] = ld_relaxed_u32(src + lane + 32 * e);
  const long long t0 = clock64();
  unsigned long long g0 = 0;
  for (uint32_t round = 1;; ++round) {
    bool all = true;
#pragma unroll
    for (int e = 0; e < N; ++e) all &= (w[e] >> 16) == tag;
    if (all) break;
    if ((round & 1023u) == 0) {
      if (aborted(ctrs) || clock64() - t0 > kWaitTimeoutCycles) {
        record_abort(ctrs, kSiteTagged, tag, static_cast<uint32_t>(lane), 0u);
        break;
      }
      if (abort_if_not_resident(ctrs, g0, kWhatTagged)) break;
    }
    __nanosleep(32);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      if ((w[e] >> 16) != tag) w[e] = ld_relaxed_u32(src + lane + 32 * e);
    }
  }
#pragma unroll
  for (int e = 0; e < N; ++e) out[e] = static_cast<uint16_t>(w[e] & 0xffffu);
}

__device__ __forceinline__ bool tagged4_ready(const uint4& v, uint32_t tag) {
  return ((v.x >> 16) == tag) & ((v.y >> 16) == tag) & ((v.z >> 16) == tag) & ((v.w >> 16) == tag);
}

// x_s[0:n] = the bf16 halves of src[0:n] (tagged words other blocks store in this launch, n % 4 == 0), once every
// word carries `tag`. A thread keeps up to kTaggedBatch 16-byte loads in flight per round and re-polls only the
// ones not ready. Ends with a consumer barrier. A wait past kWaitTimeoutCycles records itself (site kSiteTagged).
// kF16 and the result: as rmsnorm_to_smem's.
template <bool kF16 = false>
__device__ __forceinline__ bool tagged_to_smem(bf16* x_s, const uint32_t* src, int n, uint32_t tag, uint32_t* ctrs) {
  bool over = false;
  constexpr int kB = MonoConfig::kTaggedBatch;
  constexpr int kStep = MonoConfig::kConsumerThreads * 4;
  for (int i0 = threadIdx.x * 4; i0 < n; i0 += kStep * kB) {
    uint4 v[kB];
    uint32_t pending = 0;
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      if (i0 + j * kStep < n) {
        v[j] = ld_relaxed_v4(src + i0 + j * kStep);
        pending |= 1u << j;
      }
    }
    const long long t0 = clock64();
    unsigned long long g0 = 0;
    for (uint32_t round = 1;; ++round) {
#pragma unroll
      for (int j = 0; j < kB; ++j) {
        if (((pending >> j) & 1u) && tagged4_ready(v[j], tag)) {
          const uint32_t lo = (v[j].x & 0xffffu) | (v[j].y << 16), hi = (v[j].z & 0xffffu) | (v[j].w << 16);
          *reinterpret_cast<uint2*>(x_s + i0 + j * kStep) =
              kF16 ? make_uint2(bf16x2_to_f16x2(lo, over), bf16x2_to_f16x2(hi, over)) : make_uint2(lo, hi);
          pending &= ~(1u << j);
        }
      }
      if (pending == 0) break;
      if ((round & 1023u) == 0) {
        if (aborted(ctrs) || clock64() - t0 > kWaitTimeoutCycles) {
          record_abort(ctrs, kSiteTagged, tag, static_cast<uint32_t>(i0), pending);
          break;
        }
        if (abort_if_not_resident(ctrs, g0, kWhatTagged)) break;
      }
      __nanosleep(32);
#pragma unroll
      for (int j = 0; j < kB; ++j) {
        if ((pending >> j) & 1u) v[j] = ld_relaxed_v4(src + i0 + j * kStep);
      }
    }
  }
  if constexpr (kF16) return consumer_sync_or(over);
  consumer_sync();
  return false;
}

}  // namespace kog
