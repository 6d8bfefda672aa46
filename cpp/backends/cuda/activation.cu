// Elementwise ops on the GPU, twins of cpp/backends/cpu/activation.cpp and the residual / bias adds
// of cpp/src/layers.cpp: SwiGLU out = g / (1 + exp(-g)) * up, x += y, x[t] += b. Grid-stride
// loops of 256-thread blocks.
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void add_kernel(float* x, const float* __restrict__ y, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] += y[i];
}

__global__ void add_bias_kernel(float* x, const float* __restrict__ b, int64_t total, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
        x[i] += b[i % n];
}

}  // namespace

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
    if (n <= 0) return;
    swiglu_kernel<<<stride_blocks(n), kThreads, 0, stream()>>>(gate, up, n, out);
    check_launch("swiglu_kernel");
}

void add_inplace(float* x, const float* y, int64_t n) {
    if (n <= 0) return;
    add_kernel<<<stride_blocks(n), kThreads, 0, stream()>>>(x, y, n);
    check_launch("add_kernel");
}

void add_bias(float* x, const float* b, int64_t n_rows, int64_t n) {
    if (n_rows <= 0 || n <= 0) return;
    add_bias_kernel<<<stride_blocks(n_rows * n), kThreads, 0, stream()>>>(x, b, n_rows * n, n);
    check_launch("add_bias_kernel");
}

}  // namespace bonsai::cuda
