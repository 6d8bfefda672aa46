// Storing new K/V rows into the device KV cache (the twin of KvCache::store): F16 elements with
// the engine's round-to-nearest-even conversion (fp32_to_fp16), or Q8_0 blocks of 32 with
// d = amax / 127, q = round-half-away(x * (1/d)) clamped to [-127, 127] — quantize_row's
// arithmetic, so the cache bytes match the CPU's for the same input. One thread per F16 element,
// one thread per Q8_0 block. Rows are row_bytes apart from `base` (this layer's cache).
#include "bonsai/block_decode.h"
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

__global__ void store_f16_kernel(const float* __restrict__ src, int64_t n_tokens, int64_t n,
                                 const int32_t* __restrict__ cells, uint8_t* base, size_t row_bytes) {
    const int64_t total = n_tokens * n;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t t = idx / n, i = idx % n;
        uint16_t* row = reinterpret_cast<uint16_t*>(base + static_cast<int64_t>(cells[t]) * row_bytes);
        row[i] = fp32_to_fp16(src[idx]);
    }
}

__global__ void store_q8_0_kernel(const float* __restrict__ src, int64_t n_tokens, int64_t n,
                                  const int32_t* __restrict__ cells, uint8_t* base, size_t row_bytes) {
    const int64_t nb = n / QK8_0;
    const int64_t total = n_tokens * nb;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t t = idx / nb, b = idx % nb;
        const float* x = src + t * n + b * QK8_0;
        uint8_t* blk = base + static_cast<int64_t>(cells[t]) * row_bytes + b * 34;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; ++j) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t h = fp32_to_fp16(d);
        blk[0] = static_cast<uint8_t>(h & 0xff);
        blk[1] = static_cast<uint8_t>(h >> 8);
        for (int j = 0; j < QK8_0; ++j) {
            float v = __fmul_rn(x[j], id);
            if (v != v) v = 0.0f;
            v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
            blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(roundf(v)));
        }
    }
}

}  // namespace

void store_kv_rows(const float* src, int64_t n_tokens, int64_t n, const int32_t* cells, GgmlType type, uint8_t* base,
                   size_t row_bytes) {
    if (n_tokens <= 0) return;
    if (row_bytes != type_row_bytes(type, n)) throw Error("CUDA store_kv_rows: row size does not match the cache type");
    if (type == TYPE_F16) {
        store_f16_kernel<<<stride_blocks(n_tokens * n), kThreads, 0, stream()>>>(src, n_tokens, n, cells, base,
                                                                                 row_bytes);
        check_launch("store_f16_kernel");
    } else if (type == TYPE_Q8_0 && n % QK8_0 == 0) {
        store_q8_0_kernel<<<stride_blocks(n_tokens * (n / QK8_0)), kThreads, 0, stream()>>>(src, n_tokens, n, cells,
                                                                                            base, row_bytes);
        check_launch("store_q8_0_kernel");
    } else {
        throw Error("CUDA store_kv_rows: the KV cache type must be F16 or Q8_0 (with rows a multiple of 32)");
    }
}

}  // namespace bonsai::cuda
