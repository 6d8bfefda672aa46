// CUDA dequantization of whole tensors (cpp/backends/cuda/dequantize.cu), the GPU twin of
// bonsai::dequantize_row. Declared without CUDA headers so plain C++ callers can use it; only
// defined in BONSAI_CUDA builds.
#pragma once

#include <cstdint>

#include "bonsai/types.h"

namespace bonsai {

// Number of CUDA devices; 0 when there is no driver or no device (never throws).
int cuda_device_count();

// Dequantizes n elements of `type` from host memory to host memory through the GPU: copies the
// bytes to the device, runs the dequantize kernel, copies the floats back. The result is
// bit-identical to dequantize_row. Throws bonsai::Error on a bad type / n or any CUDA error.
void cuda_dequantize(GgmlType type, const void* host_src, float* host_dst, int64_t n);

}  // namespace bonsai
