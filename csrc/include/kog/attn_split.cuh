// One attention split (attention.cuh): its task, and where it reads its context (one KV head's rows of a layer's
// paged K / V caches in vLLM's layout, strides in elements, through the split's block-table entries, cached in
// shared memory when they fit).
#pragma once

#include <cstdint>

#include "kog/args.cuh"

namespace kog {

struct AttnTask {
  int kvh;
  int split;
  int start;  // first position of this split
  int end;    // one past the last (start >= end: empty split)
  bool owner; // start <= pos < end: appends this token's K/V
  int bt_first;  // block-table entries [bt_first, bt_first + bt_count) are cached in shared memory
  int bt_count;  // -1: not cached, read the block table from global memory
  bool single;   // one split per KV head: split 0 covers the context and writes the output (others are empty)
  int mode;      // how splits longer than kAttnShortLen run (ModelArgs::attn_mode: kAttnMode*, config.cuh)
  int prefetch;  // rounds of tiles a tensor-core pass keeps on their way into L2 (ModelArgs::attn_prefetch)
};

struct KvSource {
  const bf16* k;
  const bf16* v;
  const int32_t* block_table;  // global block table (used where the split's entries are not cached)
  const int* bt_s;             // the split's cached entries [bt_first, bt_first + count), or null
  int bt_first, bt_len;
  int bs_log2;  // log2 of the block size: vLLM's block sizes are powers of two (the gate admits 16-128, the launcher
                // checks), so a row's block and offset are a shift and a mask, not an integer division per row
  int64_t s_blk, s_pos, head_off;  // block and position strides; kvh * head stride

  // Element offset of position p's row (D elements) of this KV head in k / v, or -1 where the block table has no
  // block for it.
  __device__ __forceinline__ int64_t row(int p) const {
    const int bi = p >> bs_log2;
    int blk = -1;
    if (bt_s != nullptr) {
      blk = bt_s[bi - bt_first];
    } else if (bi < bt_len) {
      blk = __ldg(block_table + bi);
    }
    return blk < 0 ? -1 : blk * s_blk + (p & ((1 << bs_log2) - 1)) * s_pos + head_off;
  }
};

}  // namespace kog
