// Declarations of the launchers registered in torch_bindings.cpp.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace kog {

// Bumped whenever an op's schema changes; kog_backend.ops checks it at load.
int64_t version();

// --- monokernel (csrc/monokernel.cu) ---
// KOG-MONOKERNEL-DECLS

// --- collective (csrc/allreduce.cu) ---
// KOG-ALLREDUCE-DECLS

}  // namespace kog
