// Shared helpers of the CUDA backend: error checks that turn every failing CUDA call into one
// bonsai::Error naming the operation and cudaGetErrorString, the stream the ops launch on, launch-
// size helpers that respect the grid limits, and warp / block reductions used by the kernels.
//
// Reductions assume blockDim.x is a multiple of 32 and at most 1024 (every launch here uses 32,
// 128 or 256 threads); block_sum / block_max leave the result in every thread.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "bonsai/error.h"

namespace bonsai::cuda {

inline void check(cudaError_t err, const std::string& what) {
    if (err != cudaSuccess) throw Error("CUDA: " + what + " failed: " + cudaGetErrorString(err));
}

// After a kernel launch: a bad configuration is reported here, asynchronous faults at the next
// synchronizing call (also checked).
inline void check_launch(const char* kernel) {
    check(cudaGetLastError(), std::string("launch of ") + kernel);
}

// Every op launches on stream(): the legacy default stream, or the stream of the innermost
// StreamScope of this thread (gpu_forward runs a context's step on its own stream, which can be
// captured into a CUDA graph).
inline cudaStream_t& current_stream_slot() {
    thread_local cudaStream_t s = nullptr;
    return s;
}
inline cudaStream_t stream() { return current_stream_slot(); }

class StreamScope {
public:
    explicit StreamScope(cudaStream_t s) : prev_(current_stream_slot()) { current_stream_slot() = s; }
    ~StreamScope() { current_stream_slot() = prev_; }
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;

private:
    cudaStream_t prev_;
};

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (n >= 1), capped well below the grid.x limit.
inline unsigned stride_blocks(int64_t n, int threads = kThreads) {
    const int64_t want = (n + threads - 1) / threads;
    return static_cast<unsigned>(want < (1 << 20) ? (want > 0 ? want : 1) : (1 << 20));
}

// grid.x for one block per item; throws when n exceeds the 2^31 - 1 limit of grid.x.
inline unsigned grid_for(int64_t n, const char* what) {
    if (n <= 0 || n > 0x7fffffffLL)
        throw Error(std::string("CUDA: ") + what + ": " + std::to_string(n) + " blocks is outside the grid limit");
    return static_cast<unsigned>(n);
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; `scratch` is __shared__ T[32]. Safe to call repeatedly with one scratch.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // a previous call may still be reading scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T s = lane < n_warps ? scratch[lane] : T(0);
        s = warp_sum(s);
        if (lane == 0) scratch[0] = s;
    }
    __syncthreads();
    return scratch[0];
}

// Maximum over the block (values >= 0 in every use here; the identity is 0).
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < n_warps ? scratch[lane] : 0.0f;
        s = warp_max(s);
        if (lane == 0) scratch[0] = s;
    }
    __syncthreads();
    return scratch[0];
}

}  // namespace bonsai::cuda
