// Diagnostic builds of the monokernel: every compile-time switch that removes part of a step, or moves its code,
// for timing bounds (docs/tuning.md, "Bounds"; docs/monokernel.md). A default build defines none of them and
// every hook below compiles to nothing, so its kernels are those without this header. Switched on with
// KOG_NVCC_FLAGS="-D..." at build time (setup.py); a build with any of them is for timing only.
//
//   -DKOG_BENCH_NO_COPY          the loader marks ring slots full without copying weights (wrong results)
//   -DKOG_BENCH_NO_MATH          the consumers skip the chunks' dot products (wrong results)
//   -DKOG_BENCH_NO_ATTN          attention tasks keep their hand-offs and do no attention work (wrong results)
//   -DKOG_BENCH_RELAXED_MASK=b   the hand-offs whose kRelax* bit is set in b signal without their release (readers
//                                may see stale data); 31: all of them
//   -DKOG_BENCH_SALT=n           n zero-length sleeps at the kernel's start move every instruction after them by
//                                16 n bytes (nothing else changes: the placement spread of one source)
//   -DKOG_BENCH_SALT_MID=n       a never-run branch of n sleeps in the attention task: ptxas schedules the whole
//                                kernel anew (a sample of how much its choices alone move the step)
#pragma once

#if defined(KOG_BENCH_NO_RING_SYNC) || defined(KOG_BENCH_NO_EPILOGUE) || defined(KOG_BENCH_NO_REDUCE)
#error "KOG_BENCH_NO_RING_SYNC, KOG_BENCH_NO_EPILOGUE and KOG_BENCH_NO_REDUCE were removed (see git history)"
#endif

namespace kog {

// The hand-offs a relaxed-mask build can weaken, one bit each (the template argument of consumer_signal).
constexpr int kRelaxQKV = 1, kRelaxAttn = 2, kRelaxO = 4, kRelaxGU = 8, kRelaxDown = 16;

namespace diag {

#ifdef KOG_BENCH_NO_COPY
constexpr bool kNoCopy = true;
#else
constexpr bool kNoCopy = false;
#endif

#ifdef KOG_BENCH_NO_MATH
constexpr bool kNoMath = true;
#else
constexpr bool kNoMath = false;
#endif

#ifdef KOG_BENCH_NO_ATTN
constexpr bool kNoAttn = true;
#else
constexpr bool kNoAttn = false;
#endif

#ifdef KOG_BENCH_RELAXED_MASK
constexpr int kRelaxedMask = KOG_BENCH_RELAXED_MASK;
#else
constexpr int kRelaxedMask = 0;
#endif

#ifdef KOG_BENCH_SALT
constexpr int kSalt = KOG_BENCH_SALT;
#else
constexpr int kSalt = 0;
#endif

#ifdef KOG_BENCH_SALT_MID
constexpr int kSaltMid = KOG_BENCH_SALT_MID;
#else
constexpr int kSaltMid = 0;
#endif

// Whether the hand-off with this kRelax* bit signals without its release.
constexpr bool relaxed(int relax_bit) { return (kRelaxedMask & relax_bit) != 0; }

// The two code-placement hooks are called as `if constexpr (diag::kSalt > 0) diag::salt();`: the call itself must
// be discarded in a default build. Even an empty inlined call at the kernel's start changes the code NVVM emits
// for the whole kernel (measured on the PTX: every instance's loader and consumers renumbered and reordered).

// kSalt zero-length sleeps, 16 B of code each (KOG_BENCH_SALT).
__device__ __forceinline__ void salt() {
#pragma unroll
  for (int i = 0; i < kSalt; ++i) asm volatile("nanosleep.u32 0;");
}

// A branch taken only when `never` holds (the caller passes a condition that is false at run time), of kSaltMid
// zero-length sleeps (KOG_BENCH_SALT_MID).
__device__ __forceinline__ void salt_mid(bool never) {
  if (never) {
#pragma unroll
    for (int i = 0; i < kSaltMid; ++i) asm volatile("nanosleep.u32 0;");
  }
}

}  // namespace diag
}  // namespace kog
