// Causal attention over the device KV cache, the twin of the CPU's flash variant
// (cpp/backends/cpu/attention.cpp): one-pass online softmax, no score buffer.
//
// One warp (a 32-thread block) per (token t, query head h); lane l owns dimensions l, l+32, ...
// (head_dim <= 256, so at most 8 per lane) of q, of the accumulator and of each K/V row. For every
// cell c < n_used, in order: skip it unless cell_seq[c] & seq_mask[t] and cell_pos[c] <= pos[t];
// s = (q . K_c) * scale (warp butterfly sum, identical in every lane); when s exceeds the running
// maximum m the accumulator and normaliser are rescaled by exp(m - s); then acc += exp(s - m) V_c,
// l += exp(s - m). out = acc * (1 / l) (zeros when nothing is visible). GQA: head h reads kv head
// h / (n_head / n_head_kv). K/V rows are F16 or Q8_0 (head slices start at whole Q8_0 blocks).
#include <cmath>

#include "bonsai/block_decode.h"
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kMaxPerLane = static_cast<int>(kMaxHeadDim / 32);

// Element i of a head slice (starting at `row`) of a cache row of type t.
__device__ __forceinline__ float cache_element(GgmlType t, const uint8_t* row, int64_t i) {
    if (t == TYPE_F16) return fp16_to_fp32(reinterpret_cast<const uint16_t*>(row)[i]);
    const uint8_t* blk = row + (i / QK8_0) * 34;
    return fp16_to_fp32(load_le16(blk)) * static_cast<float>(static_cast<int8_t>(blk[2 + i % QK8_0]));
}

__global__ void attention_kernel(AttentionDev a) {
    const int64_t t = blockIdx.x / a.n_head;
    const int64_t h = blockIdx.x % a.n_head;
    const int64_t hkv = h / (a.n_head / a.n_head_kv);
    const int lane = threadIdx.x;
    const int64_t hd = a.head_dim;
    const int64_t n_q = a.n_head * hd;
    const float* q = a.q + t * n_q + h * hd;
    const size_t k_off = a.type_k == TYPE_F16 ? static_cast<size_t>(2 * hkv * hd) : static_cast<size_t>(hkv * hd / QK8_0 * 34);
    const size_t v_off = a.type_v == TYPE_F16 ? static_cast<size_t>(2 * hkv * hd) : static_cast<size_t>(hkv * hd / QK8_0 * 34);
    const uint64_t mask = a.seq_mask[t];
    const int32_t p = a.pos[t];

    float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
    for (int u = 0; u < kMaxPerLane; ++u) {
        const int64_t i = lane + 32 * u;
        qv[u] = i < hd ? q[i] : 0.0f;
        acc[u] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int64_t n_used = used_cells(a);
    for (int64_t c = 0; c < n_used; ++c) {
        if (!(a.cell_seq[c] & mask) || a.cell_pos[c] > p) continue;
        const uint8_t* krow = a.k + c * a.k_row_bytes + k_off;
        float part = 0.0f;
#pragma unroll
        for (int u = 0; u < kMaxPerLane; ++u) {
            const int64_t i = lane + 32 * u;
            if (i < hd) part += qv[u] * cache_element(a.type_k, krow, i);
        }
        const float s = warp_sum(part) * a.scale;
        if (s > m) {
            const float corr = expf(m - s);  // 0 on the first visible cell
#pragma unroll
            for (int u = 0; u < kMaxPerLane; ++u) acc[u] *= corr;
            l *= corr;
            m = s;
        }
        const float wgt = expf(s - m);
        const uint8_t* vrow = a.v + c * a.v_row_bytes + v_off;
#pragma unroll
        for (int u = 0; u < kMaxPerLane; ++u) {
            const int64_t i = lane + 32 * u;
            if (i < hd) acc[u] += wgt * cache_element(a.type_v, vrow, i);
        }
        l += wgt;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* out = a.out + t * n_q + h * hd;
#pragma unroll
    for (int u = 0; u < kMaxPerLane; ++u) {
        const int64_t i = lane + 32 * u;
        if (i < hd) out[i] = acc[u] * inv;
    }
}

}  // namespace

void check_attention_shape(const AttentionDev& a) {
    if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.head_dim <= 0 || a.head_dim > kMaxHeadDim)
        throw Error("CUDA attention: unsupported head shape (" + std::to_string(a.n_head) + " heads, " +
                    std::to_string(a.n_head_kv) + " kv heads, head size " + std::to_string(a.head_dim) +
                    "; head size must be <= " + std::to_string(kMaxHeadDim) + ")");
    for (GgmlType t : {a.type_k, a.type_v})
        if (t != TYPE_F16 && !(t == TYPE_Q8_0 && a.head_dim % QK8_0 == 0))
            throw Error("CUDA attention: the KV cache type must be F16 or Q8_0 (head size a multiple of 32)");
}

void attention(const AttentionDev& a) {
    if (a.n_tokens <= 0) return;
    check_attention_shape(a);
    attention_kernel<<<grid_for(a.n_tokens * a.n_head, "attention"), 32, 0, stream()>>>(a);
    check_launch("attention_kernel");
}

}  // namespace bonsai::cuda
