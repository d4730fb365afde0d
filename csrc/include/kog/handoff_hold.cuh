// The loader's hold around a block's hand-offs (docs/monokernel.md item 9; on at stage ends by default, h = 2).
//
// A hand-off ends with a release (the stage's counter signal, the attention split's publish), and a release on an
// SM waits for the bulk copies that SM has in flight: ~1 us with none while the other SMs stream, ~2 us with two
// 32 KiB copies, 5-7 us with six (benchmarks/probes/latency_under_stream.cu). With a hold of h chunks, the loader
// issues at most h chunks past the point where a hand-off's work is all in the ring, until the consumers have made
// that hand-off (SmemHeader::released), so its release waits for at most h copies.
//
// Schedule positions (hand_off_seq): per token and layer QKV, attention, O, gate/up, down; then the LM head. The
// consumers publish the position of each hand-off they have made (monotone); the loader keeps the hand-offs it
// has armed and not yet seen made, oldest first, each with the issue count at which it must wait.
#pragma once

#include <cstdint>

#include "kog/config.cuh"
#include "kog/sync.cuh"

namespace kog {

constexpr int kHandoffAttn = -1;  // hand_off_seq's stage id of the attention split (not a weight stage)

__device__ __forceinline__ int hand_off_seq(int t, int l, int st, int num_layers) {
  const int per_token = 5 * num_layers + 1;
  int k;
  if (st == MonoConfig::kStageLM) {
    k = 5 * num_layers;
  } else if (st == kHandoffAttn) {
    k = 5 * l + 1;
  } else {
    k = 5 * l + (st == MonoConfig::kStageQKV ? 0 : st + 1);
  }
  return t * per_token + k;
}

struct HandoffHold {
  static constexpr int kQ = MonoConfig::kHandoffQueue;
  int seq[kQ];      // hand-off positions, oldest first
  int wait_at[kQ];  // the loader's issue count at which it waits for that hand-off
  int head = 0, tail = 0;

  __device__ __forceinline__ void arm(int s, int at) {
    seq[tail & (kQ - 1)] = s;
    wait_at[tail & (kQ - 1)] = at;
    ++tail;
  }
  // Before issuing chunk number `issued`: drops the hand-offs made, then waits for the latest armed hand-off whose
  // limit is reached (hand-offs are made in order, so that covers every earlier one). False: a wait timed out or
  // another one did (recorded); the loader stops.
  __device__ __forceinline__ bool before_issue(const volatile int& released, int issued, uint32_t* ctrs) {
    while (head != tail && released >= seq[head & (kQ - 1)]) ++head;
    int need = -1;
    for (int i = head; i != tail; ++i) {
      if (issued >= wait_at[i & (kQ - 1)]) need = seq[i & (kQ - 1)];
    }
    if (need < 0) return true;
    const long long t0 = clock64();
    while (released < need) {
      __nanosleep(32);
      if (clock64() - t0 > kWaitTimeoutCycles || aborted(ctrs)) {
        record_abort(ctrs, kSiteHandoff, static_cast<uint32_t>(need), static_cast<uint32_t>(released), 0u);
        return false;
      }
    }
    return true;
  }
};

}  // namespace kog
