// Rotary position embedding on the GPU, the twin of cpp/backends/cpu/rope.cpp. The cos/sin table
// is built on the host (rope_table, in double, with the frequency factors and linear scaling) and
// uploaded once per batch chunk; this kernel only rotates. One thread per (token, head, pair i):
// NORMAL pairs (x[2i], x[2i+1]), NEOX pairs (x[i], x[i + n_rot/2]); dims >= n_rot pass through.
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

__global__ void rope_kernel(float* __restrict__ x, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot,
                            bool neox, const float* __restrict__ cs) {
    const int64_t half = n_rot / 2;
    const int64_t total = n_tokens * n_head * half;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t i = idx % half;
        const int64_t th = idx / half;  // token * n_head + head
        const int64_t t = th / n_head;
        float* h = x + th * head_dim;
        const float c = cs[t * n_rot + 2 * i], s = cs[t * n_rot + 2 * i + 1];
        float* a = neox ? h + i : h + 2 * i;
        float* b = neox ? h + i + half : h + 2 * i + 1;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
    }
}

}  // namespace

void rope(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot, bool neox, const float* cos_sin) {
    if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim)
        throw Error("CUDA rope: n_rot " + std::to_string(n_rot) + " must be even, positive and <= the head size " +
                    std::to_string(head_dim));
    const int64_t total = n_tokens * n_head * (n_rot / 2);
    if (total <= 0) return;
    rope_kernel<<<stride_blocks(total), kThreads, 0, stream()>>>(x, n_tokens, n_head, head_dim, n_rot, neox, cos_sin);
    check_launch("rope_kernel");
}

}  // namespace bonsai::cuda
