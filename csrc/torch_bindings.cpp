// The one TORCH_LIBRARY registration of kog_backend._C. Launchers live in csrc/<family>.cu; device code
// lives in csrc/include/kog/*.cuh and includes no torch header. Mutated arguments are marked `Tensor!`.
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(kog, m) {
  m.def("version() -> int");
  m.impl("version", &kog::version);

  // --- monokernel (csrc/monokernel.cu) ---
  // KOG-MONOKERNEL-DEFS

  // --- collective (csrc/allreduce.cu) ---
  // KOG-ALLREDUCE-DEFS
}

TORCH_LIBRARY_IMPL(kog, CUDA, m) {
  // KOG-MONOKERNEL-CUDA-IMPLS
  // KOG-ALLREDUCE-CUDA-IMPLS
}
