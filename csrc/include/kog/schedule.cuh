// The static schedule of a step's chunks over the grid: chunk c of a stage belongs to block (base + c) % G, where
// base is the number of chunks of all earlier stages of the step (mod G). The loader and the consumers walk it the
// same way.
#pragma once

namespace kog {

// First chunk of a stage with n chunks that block b owns, given the stage's base; chunks c0, c0 + G, ...
__device__ __forceinline__ int first_chunk(int b, int base, int G) {
  const int c = b - base;
  return c < 0 ? c + G : c;
}

// Chunks of a stage with n chunks that the block whose first chunk is c0 owns: c0, c0 + G, ... < n.
__device__ __forceinline__ int chunks_owned(int c0, int n, int G) { return c0 < n ? (n - c0 + G - 1) / G : 0; }

}  // namespace kog
