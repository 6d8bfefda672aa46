// Blockwise fast Walsh-Hadamard rotation on the GPU, the twin of cpp/backends/cpu/hadamard.
//
// x[t] = WHT_B(s ⊙ x[t]) in place for n_tokens rows of cols (the input of a prism.hadamard-folded
// matmul; H_B[r][c] = (-1)^popcount(r & c) / sqrt(B)). One CUDA block per (token, Hadamard block):
// the B values are loaded times their signs into shared memory, log2(B) butterfly stages run with
// a barrier between them (stage h: every pair (i, i + h) with (i & h) == 0 becomes (u + v, u - v),
// each thread handling pairs in a stride loop), and the values are stored times 1/sqrt(B). The
// operations are those of the CPU scalar path in the same order (an exact sign multiply, one add or
// subtract per butterfly output, one final multiply by the same scale; no fused multiply-add), so
// results are bit-identical to the CPU's. B up to 8192 (32 KiB of shared memory).
#include <cmath>

#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

constexpr int64_t kMaxBlock = 8192;

__global__ void hadamard_rotate_kernel(float* __restrict__ x, const float* __restrict__ signs, int64_t cols,
                                       int block, float scale) {
    extern __shared__ float a[];
    const int64_t blocks_per_row = cols / block;
    const int64_t t = blockIdx.x / blocks_per_row;
    const int64_t b0 = (blockIdx.x % blocks_per_row) * block;
    float* row = x + t * cols + b0;
    for (int i = threadIdx.x; i < block; i += blockDim.x) a[i] = signs ? __fmul_rn(row[i], signs[b0 + i]) : row[i];
    __syncthreads();
    for (int h = 1; h < block; h <<= 1) {
        for (int p = threadIdx.x; p < block / 2; p += blockDim.x) {
            const int i = (p / h) * 2 * h + (p % h);  // the p-th pair's lower index
            const float u = a[i], v = a[i + h];
            a[i] = __fadd_rn(u, v);
            a[i + h] = __fsub_rn(u, v);
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < block; i += blockDim.x) row[i] = __fmul_rn(a[i], scale);
}

}  // namespace

void hadamard_rotate(float* x, int64_t n_tokens, int64_t cols, const GpuRotation& r) {
    if (n_tokens <= 0) return;
    if (r.block < 2 || (r.block & (r.block - 1)) != 0 || r.block > kMaxBlock || cols % r.block != 0)
        throw Error("CUDA hadamard_rotate: block " + std::to_string(r.block) + " must be a power of two <= " +
                    std::to_string(kMaxBlock) + " dividing the width " + std::to_string(cols));
    const float scale = 1.0f / std::sqrt(static_cast<float>(r.block));
    const int threads = r.block / 2 < kThreads ? static_cast<int>(r.block / 2) : kThreads;
    hadamard_rotate_kernel<<<grid_for(n_tokens * (cols / r.block), "hadamard_rotate"), threads,
                             static_cast<size_t>(r.block) * sizeof(float), stream()>>>(
        x, r.signs, cols, static_cast<int>(r.block), scale);
    check_launch("hadamard_rotate_kernel");
}

}  // namespace bonsai::cuda
