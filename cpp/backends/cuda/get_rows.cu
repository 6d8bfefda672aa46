// Embedding gather on the GPU, the twin of cpp/backends/cpu/get_rows.cpp: one thread per output
// element, out[i*cols + k] = W[ids[i], k] through row_element (bit-identical to the CPU).
#include "bonsai/block_decode.h"
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

__global__ void get_rows_kernel(GgmlType type, const uint8_t* __restrict__ w, int64_t cols, size_t row_bytes,
                                const int32_t* __restrict__ ids, int64_t n, float* __restrict__ out) {
    const int64_t total = n * cols;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t i = idx / cols, k = idx % cols;
        out[idx] = row_element(type, w + static_cast<int64_t>(ids[i]) * row_bytes, k);
    }
}

}  // namespace

void get_rows(const DeviceMatrix& w, const int32_t* ids, int64_t n, float* out) {
    if (!type_traits(w.type) || w.cols <= 0 || w.row_bytes != type_row_bytes(w.type, w.cols))
        throw Error("CUDA get_rows: bad weight");
    if (n <= 0) return;
    get_rows_kernel<<<stride_blocks(n * w.cols), kThreads, 0, stream()>>>(w.type, w.data, w.cols, w.row_bytes, ids,
                                                                         n, out);
    check_launch("get_rows_kernel");
}

}  // namespace bonsai::cuda
