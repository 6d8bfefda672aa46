// CUDA dequantize kernels for every tensor type, the GPU twin of dequantize_row (quants.cpp).
//
// One thread per output element (grid-stride loop): element i lies in block i / block_size at
// position j = i % block_size, and is read with the layout helpers of quant_blocks.h
// (tq1_0_trit, ptq1_0_trit, tq2_0_code, q2_code) and the fp16 / bf16 helpers of quants.h, which
// are the same functions the CPU reference uses. Each value is (code - 1) * d (Q8_0: q * d,
// Q4_0: (nibble - 8) * d) in float32, one rounding, so the output is bit-identical to the CPU.
#include <cuda_runtime.h>

#include <string>

#include "bonsai/cuda/dequantize.h"
#include "bonsai/error.h"
#include "bonsai/quant_blocks.h"
#include "bonsai/quants.h"

namespace bonsai {

namespace {

template <GgmlType T>
__device__ __forceinline__ float dequantize_element(const uint8_t* src, int64_t i) {
    if constexpr (T == TYPE_F32) {
        return reinterpret_cast<const float*>(src)[i];
    } else if constexpr (T == TYPE_F16) {
        return fp16_to_fp32(reinterpret_cast<const uint16_t*>(src)[i]);
    } else if constexpr (T == TYPE_BF16) {
        return bf16_to_fp32(reinterpret_cast<const uint16_t*>(src)[i]);
    } else if constexpr (T == TYPE_Q8_0) {
        const block_q8_0& b = reinterpret_cast<const block_q8_0*>(src)[i / QK8_0];
        return static_cast<float>(b.qs[i % QK8_0]) * fp16_to_fp32(b.d);
    } else if constexpr (T == TYPE_Q4_0) {
        const block_q4_0& b = reinterpret_cast<const block_q4_0*>(src)[i / QK4_0];
        const int j = static_cast<int>(i % QK4_0);
        const int nibble = j < QK4_0 / 2 ? (b.qs[j] & 15) : (b.qs[j - QK4_0 / 2] >> 4);
        return static_cast<float>(nibble - 8) * fp16_to_fp32(b.d);
    } else if constexpr (T == TYPE_TQ1_0) {
        const block_tq1_0& b = reinterpret_cast<const block_tq1_0*>(src)[i / QK_K];
        return static_cast<float>(tq1_0_trit(b, static_cast<int>(i % QK_K))) * fp16_to_fp32(b.d);
    } else if constexpr (T == TYPE_TQ2_0) {
        const block_tq2_0& b = reinterpret_cast<const block_tq2_0*>(src)[i / QK_K];
        const int code = tq2_0_code(b, static_cast<int>(i % QK_K));
        return static_cast<float>(code - 1) * fp16_to_fp32(b.d);
    } else if constexpr (T == TYPE_PTQ1_0) {
        const block_ptq1_0& b = reinterpret_cast<const block_ptq1_0*>(src)[i / QK_PTQ1_0];
        const int trit = ptq1_0_trit(b, static_cast<int>(i % QK_PTQ1_0));
        return static_cast<float>(trit) * fp16_to_fp32(b.d);
    } else {
        // Q2_0 (64), Q2_0_G128 and PQ2_0 (128): fp16 d first, then the 2-bit codes.
        constexpr int bs = T == TYPE_Q2_0 ? QK2_0 : QK_PQ2_0;
        constexpr int size = 2 + bs / 4;
        const uint8_t* p = src + (i / bs) * size;
        const uint16_t d = static_cast<uint16_t>(p[0] | (p[1] << 8));
        const int code = q2_code(p + 2, static_cast<int>(i % bs));
        return static_cast<float>(code - 1) * fp16_to_fp32(d);
    }
}

template <GgmlType T>
__global__ void dequantize_kernel(const uint8_t* __restrict__ src, float* __restrict__ dst,
                                  int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride)
        dst[i] = dequantize_element<T>(src, i);
}

void check_cuda(cudaError_t err, const char* what) {
    if (err != cudaSuccess)
        throw Error(std::string("CUDA dequantize: ") + what + " failed: " +
                    cudaGetErrorString(err));
}

// Device allocation freed on scope exit, so an error thrown midway leaks nothing.
struct DeviceBuffer {
    void* ptr = nullptr;
    DeviceBuffer(size_t bytes, const char* what) { check_cuda(cudaMalloc(&ptr, bytes), what); }
    ~DeviceBuffer() { cudaFree(ptr); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

template <GgmlType T>
void launch(const uint8_t* src, float* dst, int64_t n) {
    constexpr int threads = 256;
    const int64_t want = (n + threads - 1) / threads;
    const unsigned blocks = static_cast<unsigned>(want < (1 << 20) ? want : (1 << 20));
    dequantize_kernel<T><<<blocks, threads>>>(src, dst, n);
}

}  // namespace

int cuda_device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver / no device" error
        return 0;
    }
    return count;
}

void cuda_dequantize(GgmlType type, const void* host_src, float* host_dst, int64_t n) {
    const TypeTraits* t = type_traits(type);
    if (!t) throw Error("CUDA dequantize: unknown tensor type id " + std::to_string(type));
    if (n < 0 || n % t->block_size != 0)
        throw Error("CUDA dequantize: " + std::to_string(n) +
                    " elements is not a multiple of the " + t->name + " block size " +
                    std::to_string(t->block_size));
    if (type == TYPE_PTQ1_0_R16 || type == TYPE_PTQ1_0_R16L || type == TYPE_Q8_0_R4)
        throw Error("CUDA dequantize: " +
                    std::string(type == TYPE_Q8_0_R4 ? "Q8_0_R4" : type == TYPE_PTQ1_0_R16 ? "PTQ1_0_R16" : "PTQ1_0_R16L") +
                    " is an in-memory order of the CPU backend; pass the rows in the file's type");
    if (n == 0) return;
    const size_t in_bytes = type_row_bytes(type, n);
    const size_t out_bytes = static_cast<size_t>(n) * sizeof(float);
    DeviceBuffer src(in_bytes, "cudaMalloc (quantized input)");
    DeviceBuffer dst(out_bytes, "cudaMalloc (float output)");
    check_cuda(cudaMemcpy(src.ptr, host_src, in_bytes, cudaMemcpyHostToDevice),
               "copy to the device");
    const auto* s = static_cast<const uint8_t*>(src.ptr);
    auto* d = static_cast<float*>(dst.ptr);
    switch (type) {
        case TYPE_F32: launch<TYPE_F32>(s, d, n); break;
        case TYPE_F16: launch<TYPE_F16>(s, d, n); break;
        case TYPE_BF16: launch<TYPE_BF16>(s, d, n); break;
        case TYPE_Q8_0: launch<TYPE_Q8_0>(s, d, n); break;
        case TYPE_Q4_0: launch<TYPE_Q4_0>(s, d, n); break;
        case TYPE_TQ1_0: launch<TYPE_TQ1_0>(s, d, n); break;
        case TYPE_TQ2_0: launch<TYPE_TQ2_0>(s, d, n); break;
        case TYPE_Q2_0: launch<TYPE_Q2_0>(s, d, n); break;
        case TYPE_Q2_0_G128: launch<TYPE_Q2_0_G128>(s, d, n); break;
        case TYPE_PQ2_0: launch<TYPE_PQ2_0>(s, d, n); break;
        case TYPE_PTQ1_0: launch<TYPE_PTQ1_0>(s, d, n); break;
        case TYPE_PTQ1_0_R16:  // checked before the copy below
        case TYPE_PTQ1_0_R16L:
        case TYPE_Q8_0_R4:
            break;
    }
    check_cuda(cudaGetLastError(), "kernel launch");
    check_cuda(cudaMemcpy(host_dst, dst.ptr, out_bytes, cudaMemcpyDeviceToHost),
               "dequantize kernel / copy back");
}

}  // namespace bonsai
