// One row's per-token absmax INT8 quantization by the calling block (act_quant.cu's algorithm,
// see its header), shared by quantize_act_kernel and the fused rms_norm_quantize_kernel (norm.cu)
// so that both give bit-identical q and scale. red: __shared__ float[32]. A row the block has
// just written must be made visible (__syncthreads) before the call.
#pragma once

#include <cfloat>

#include "cuda_common.cuh"

namespace bonsai::cuda {

__device__ __forceinline__ void quantize_row(const float* xr, int64_t cols, int8_t* qr, float* scale, float* red) {
    float amax = 0.0f;
    int bad = 0;
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) {
        const float a = fabsf(xr[k]);
        if (!(a <= FLT_MAX)) bad = 1;
        else amax = fmaxf(amax, a);
    }
    bad = __syncthreads_or(bad);
    amax = block_max(amax, red);
    if (bad || amax == 0.0f) {
        for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) qr[k] = 0;
        if (threadIdx.x == 0) *scale = bad ? __int_as_float(0x7fc00000) : 0.0f;
        return;
    }
    const float iscale = 127.0f / amax;
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) {
        const float v = __fmul_rn(xr[k], iscale);
        const float tr = truncf(v);
        const float f = __fsub_rn(v, tr);
        float r = tr + static_cast<float>(f >= 0.5f) - static_cast<float>(f <= -0.5f);
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        qr[k] = static_cast<int8_t>(r);
    }
    if (threadIdx.x == 0) *scale = amax / 127.0f;
}

}  // namespace bonsai::cuda
