// Dispatch of a batch chunk's offloaded layers from the architecture forward loops:
//   for (il = forward_gpu(m, st); il < n_layer; ++il) { CPU layer il }
//   if (!gpu_did_output(m, st)) output_logits(m, st);
// forward_gpu runs layers [0, n_gpu) on the GPU (CUDA builds with a GPU context; see
// bonsai/cuda/gpu_backend.h) and returns the first layer left for the CPU: 0 when nothing is
// offloaded. When every layer is offloaded the GPU also computes the logits, except in embeddings
// mode (st.embd): then the GPU copies x back and the CPU applies output_norm, with no head.
#pragma once

#include <cstdint>

#include "arch/arch.h"

namespace bonsai {

int64_t forward_gpu(const Model& m, ForwardState& st);
bool gpu_did_output(const Model& m, const ForwardState& st);

}  // namespace bonsai
