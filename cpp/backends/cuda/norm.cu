// RMSNorm on the GPU, the twin of cpp/backends/cpu/norm.cpp: one block of 256 threads per row; the
// sum of squares is accumulated in double (as on the CPU, so the scale rounds to the same float
// except in rare ties of the summation order), y = x * scale * w with both products rounded.
// An optional row index list gathers the input rows (the output head normalises only the rows
// whose logits are wanted). rms_norm_quantize also quantizes each normalised row for the INT8
// matmuls with act_quant.cu's quantize_row on the values just written (so q and the scale are
// exactly what quantize_act would give): one launch instead of a norm and one quantization per
// matrix that reads the row.
#include "cuda_common.cuh"
#include "ops_cuda.cuh"
#include "quantize_row.cuh"

namespace bonsai::cuda {

namespace {

// y = x * (1 / sqrt(mean(x^2) + eps)) * w for one row (see above); every thread of the block takes
// part, and y may be x (in-place q/k norms: each thread rewrites only the elements it read).
__device__ void normalize_row(const float* xr, const float* __restrict__ w, int64_t n, float eps, float* yr,
                              double* red) {
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
    ss = block_sum(ss, red);
    const float scale = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + static_cast<double>(eps)));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

__global__ void rms_norm_kernel(const float* x, const int32_t* __restrict__ rows, const float* __restrict__ w,
                                int64_t n, float eps, float* y) {
    __shared__ double red[32];
    const int64_t r = blockIdx.x;
    normalize_row(x + (rows ? static_cast<int64_t>(rows[r]) : r) * n, w, n, eps, y + r * n, red);
}

__global__ void rms_norm_quantize_kernel(const float* x, const float* __restrict__ w, int64_t n, float eps, float* y,
                                         int8_t* q, float* qscale) {
    __shared__ double red[32];
    __shared__ float fred[32];
    const int64_t r = blockIdx.x;
    float* yr = y + r * n;
    normalize_row(x + r * n, w, n, eps, yr, red);
    __syncthreads();  // the row is read back by other threads
    quantize_row(yr, n, q + r * n, qscale + r, fred);
}

}  // namespace

void rms_norm(const float* x, const int32_t* rows, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
    if (n <= 0 || n_rows < 0 || !x || !w || !y) throw Error("CUDA rms_norm: invalid arguments");
    if (n_rows == 0) return;
    rms_norm_kernel<<<grid_for(n_rows, "rms_norm"), kThreads, 0, stream()>>>(x, rows, w, n, eps, y);
    check_launch("rms_norm_kernel");
}

void rms_norm_quantize(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y,
                       const ActScratch& s) {
    if (n <= 0 || n_rows < 0 || !x || !w || !y || x == y) throw Error("CUDA rms_norm_quantize: invalid arguments");
    if (n_rows == 0) return;
    check_act_scratch(n_rows, n, s);
    rms_norm_quantize_kernel<<<grid_for(n_rows, "rms_norm_quantize"), kThreads, 0, stream()>>>(x, w, n, eps, y, s.q,
                                                                                               s.scale);
    check_launch("rms_norm_quantize_kernel");
}

}  // namespace bonsai::cuda
