// Matrix-vector / matrix-matrix products on the GPU for every weight type, the twin of
// cpp/backends/cpu/matmul*.cpp. Correct first (issue #8 makes them fast): weights are read in
// their packed file layout through the byte-wise accessors of bonsai/block_decode.h.
//
// INT8 mode (quantized weights): one thread block per (output row, group of up to kTT tokens).
//   1. Threads take the row's weight blocks in turn; for block b and each token t of the group
//      they form the exact integer dot product isum[t][b] = sum_j w_j * q[t][b*E + j] (int32) and
//      keep d_b, both in shared memory.
//   2. Thread t then runs acc = fmaf(d_b, (float)isum[t][b], acc) over b = 0, 1, ... in order and
//      writes acc * s_t — the CPU's exact operation sequence, so given the same int8 activations
//      the result is bit-identical to the CPU's.
//   Shared memory: (tt * nb + nb) * 4 bytes; tt shrinks for very long rows to stay under 48 KiB.
// FLOAT mode and F32/F16/BF16 weights: one block per (row, token group); each thread accumulates
//   w * x over a strided slice of the row in f32, then a block reduction. Equal to the CPU up to
//   float summation order.
#include <string>

#include "bonsai/block_decode.h"
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kTT = 8;                 // tokens per thread block
constexpr int kMatThreads = 128;
constexpr size_t kSmemLimit = 48 * 1024;

bool is_float_type(GgmlType t) { return t == TYPE_F32 || t == TYPE_F16 || t == TYPE_BF16; }

__global__ void matmul_int8_kernel(GgmlType type, const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
                                   size_t row_bytes, const int8_t* __restrict__ q, const float* __restrict__ scale,
                                   int64_t n_tokens, int tt, float* __restrict__ y) {
    extern __shared__ int32_t smem[];
    const BlockGeom g = block_geom(type);
    const int64_t nb = cols / g.elems;
    const int64_t groups = (n_tokens + tt - 1) / tt;
    const int64_t r = blockIdx.x / groups;
    const int64_t t0 = (blockIdx.x % groups) * tt;
    const int nt = static_cast<int>(n_tokens - t0 < tt ? n_tokens - t0 : tt);
    int32_t* isum = smem;                                    // [tt][nb]
    float* dsc = reinterpret_cast<float*>(smem + tt * nb);  // [nb]
    const uint8_t* row = w + r * row_bytes;

    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        const uint8_t* blk = row + b * g.bytes;
        dsc[b] = block_scale(type, blk);
        int32_t acc[kTT];
#pragma unroll
        for (int t = 0; t < kTT; ++t) acc[t] = 0;
        const int8_t* qb = q + t0 * cols + b * g.elems;
        for (int j = 0; j < g.elems; ++j) {
            const int wv = block_value(type, blk, j);
            if (wv == 0) continue;
#pragma unroll
            for (int t = 0; t < kTT; ++t)
                if (t < nt) acc[t] += wv * static_cast<int32_t>(qb[t * cols + j]);
        }
#pragma unroll
        for (int t = 0; t < kTT; ++t)
            if (t < nt) isum[t * nb + b] = acc[t];
    }
    __syncthreads();
    for (int t = threadIdx.x; t < nt; t += blockDim.x) {
        float a = 0.0f;
        for (int64_t b = 0; b < nb; ++b) a = fmaf(dsc[b], static_cast<float>(isum[t * nb + b]), a);
        y[(t0 + t) * rows + r] = __fmul_rn(a, scale[t0 + t]);
    }
}

__global__ void matmul_float_kernel(GgmlType type, const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
                                    size_t row_bytes, const float* __restrict__ x, int64_t n_tokens,
                                    float* __restrict__ y) {
    __shared__ float red[32];
    const int64_t groups = (n_tokens + kTT - 1) / kTT;
    const int64_t r = blockIdx.x / groups;
    const int64_t t0 = (blockIdx.x % groups) * kTT;
    const int nt = static_cast<int>(n_tokens - t0 < kTT ? n_tokens - t0 : kTT);
    const uint8_t* row = w + r * row_bytes;
    float acc[kTT];
#pragma unroll
    for (int t = 0; t < kTT; ++t) acc[t] = 0.0f;
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) {
        const float wv = row_element(type, row, k);
#pragma unroll
        for (int t = 0; t < kTT; ++t)
            if (t < nt) acc[t] += wv * x[(t0 + t) * cols + k];
    }
    for (int t = 0; t < nt; ++t) {  // nt is the same for every thread of the block
        const float s = block_sum(acc[t], red);
        if (threadIdx.x == 0) y[(t0 + t) * rows + r] = s;
    }
}

void check_matrix(const DeviceMatrix& w) {
    const TypeTraits* tr = type_traits(w.type);
    if (!tr) throw Error("CUDA matmul: unsupported weight type id " + std::to_string(w.type));
    if (w.rows <= 0 || w.cols <= 0 || w.cols % tr->block_size != 0 || w.row_bytes != type_row_bytes(w.type, w.cols) ||
        !w.data)
        throw Error(std::string("CUDA matmul: bad ") + tr->name + " weight " + std::to_string(w.rows) + " x " +
                    std::to_string(w.cols) + " (row bytes " + std::to_string(w.row_bytes) + ")");
}

void run_matmul(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y, ActMode mode, const ActScratch& s,
                bool quantize) {
    check_matrix(w);
    if (n_tokens <= 0) return;
    const int64_t groups = (n_tokens + kTT - 1) / kTT;
    if (mode == ActMode::FLOAT || is_float_type(w.type)) {
        matmul_float_kernel<<<grid_for(w.rows * groups, "matmul"), kMatThreads, 0, stream()>>>(
            w.type, w.data, w.rows, w.cols, w.row_bytes, x, n_tokens, y);
        check_launch("matmul_float_kernel");
        return;
    }
    const int64_t nb = w.cols / type_traits(w.type)->block_size;
    int64_t tt = kTT < n_tokens ? kTT : n_tokens;
    while (tt > 1 && static_cast<size_t>(tt * nb + nb) * 4 > kSmemLimit) --tt;
    const size_t smem = static_cast<size_t>(tt * nb + nb) * 4;
    if (smem > kSmemLimit)
        throw Error("CUDA matmul: rows of " + std::to_string(w.cols) + " columns (" + std::to_string(nb) +
                    " blocks) exceed the kernel's shared-memory limit");
    if (quantize)
        quantize_act(x, n_tokens, w.cols, s);
    else
        check_act_scratch(n_tokens, w.cols, s);
    const int64_t tgroups = (n_tokens + tt - 1) / tt;
    matmul_int8_kernel<<<grid_for(w.rows * tgroups, "matmul"), kMatThreads, smem, stream()>>>(
        w.type, w.data, w.rows, w.cols, w.row_bytes, s.q, s.scale, n_tokens, static_cast<int>(tt), y);
    check_launch("matmul_int8_kernel");
}

}  // namespace

bool int8_path(const DeviceMatrix& w, ActMode mode) { return mode == ActMode::INT8 && !is_float_type(w.type); }

void matmul(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y, ActMode mode, const ActScratch& s) {
    run_matmul(w, x, n_tokens, y, mode, s, true);
}

void matmul_quantized(const DeviceMatrix& w, int64_t n_tokens, float* y, const ActScratch& s) {
    if (!int8_path(w, ActMode::INT8)) throw Error("CUDA matmul_quantized: the weight type has no INT8 path");
    run_matmul(w, nullptr, n_tokens, y, ActMode::INT8, s, false);
}

}  // namespace bonsai::cuda
