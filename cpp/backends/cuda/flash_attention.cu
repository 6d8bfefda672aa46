// Flash attention over the device KV cache (selected by ContextParams::flash_attn; attention.cu
// stays the plain path). Same visibility rule and exact softmax as attention.cu, computed tile by
// tile with K/V shared across the query heads of one GQA group.
//
// Work split: the query rows of one KV head hkv are its group rows gr = t * G + g (token t, query
// head h = hkv * G + g, G = n_head / n_head_kv). One 128-thread block takes kFlashRows = 16
// consecutive group rows (4 warps x 4 rows, row r to warp r % 4, so that the 4..8 rows of a
// single-token decode keep every warp busy), one KV head, and one split of the cells: cells
// [split * cells_per_split, min(next split, n_used)). Blocks run over tiles of bc cells (32 for
// head_dim <= 128, else 8):
//   1. the block dequantizes the tile's K and V rows (F16 or Q8_0) once into shared memory,
//      K with a padded row stride (head_dim + 1) so that lane j reading cell j is conflict-free;
//   2. per row, lane j < bc scores cell j (q from shared memory, broadcast) or -inf when the cell
//      is invisible (cell_seq & seq_mask == 0 or cell_pos > pos); the warp max gives the new
//      running maximum m', the accumulator and normaliser are rescaled by exp(m - m'), the lane's
//      weight p_j = exp(s_j - m') goes to shared memory and l += sum p_j;
//   3. per row, lane k owns dimensions k, k + 32, ...: acc += sum_j p_j V_j.
// Rows with nothing visible keep m = -inf and are never rescaled (no exp(-inf + inf)).
// With one split the block writes acc / l (zeros when l = 0). Decode has few query rows, so the
// cells are split across blocks (flash-decoding) until about kTargetBlocks blocks run; each split
// writes its partial (m, l, acc) to the context's partial buffer and flash_combine_kernel merges
// them per row: M = max m_s, out = sum exp(m_s - M) acc_s / sum exp(m_s - M) l_s.
// The grid is sized from a.n_used; with a.n_used_dev the kernel reads the count of this step there
// (at most a.n_used) and blocks past it finish at once, so one launch stays valid while the
// cache grows (CUDA graphs).
// Partial buffer layout (floats): (m, l) pairs [n_split][n_rows], then acc [n_split][n_rows][hd],
// n_rows = n_tokens * n_head. Splits are used only while the grid is below kTargetBlocks, so a
// grid never exceeds kMaxBlocks blocks and the buffer never exceeds flash_partial_floats(hd).
#include <algorithm>
#include <cmath>

#include "bonsai/block_decode.h"
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kFlashRows = kWarps * kRowsPerWarp;
constexpr int kMaxPerLane = static_cast<int>(kMaxHeadDim / 32);
constexpr int64_t kTargetBlocks = 256;
constexpr int64_t kMaxBlocks = 2 * kTargetBlocks;
constexpr int64_t kMinSplitCells = 256;

struct FlashGrid {
    int bc = 32;                  // cells per tile
    int64_t n_qtiles = 0;         // blocks of kFlashRows group rows per KV head
    int64_t n_split = 1;          // cell splits
    int64_t cells_per_split = 0;  // a multiple of bc
    size_t smem = 0;
};

FlashGrid flash_grid(const AttentionDev& a) {
    FlashGrid f;
    const int64_t hd = a.head_dim, group = a.n_head / a.n_head_kv;
    f.bc = hd <= 128 ? 32 : 8;
    f.n_qtiles = (a.n_tokens * group + kFlashRows - 1) / kFlashRows;
    const int64_t base = f.n_qtiles * a.n_head_kv;
    if (base < kTargetBlocks) {
        const int64_t by_cells = std::max<int64_t>(1, a.n_used / kMinSplitCells);
        f.n_split = std::min((kTargetBlocks + base - 1) / base, by_cells);
    }
    const int64_t per = (a.n_used + f.n_split - 1) / f.n_split;
    f.cells_per_split = std::max<int64_t>(f.bc, (per + f.bc - 1) / f.bc * f.bc);
    f.n_split = std::max<int64_t>(1, (a.n_used + f.cells_per_split - 1) / f.cells_per_split);
    f.smem = sizeof(float) * static_cast<size_t>(kFlashRows * hd + f.bc * (hd + 1) + f.bc * hd + kFlashRows * f.bc);
    return f;
}

// Element i of a head slice (starting at `row`) of a cache row of type t.
__device__ __forceinline__ float cache_value(GgmlType t, const uint8_t* row, int64_t i) {
    if (t == TYPE_F16) return fp16_to_fp32(reinterpret_cast<const uint16_t*>(row)[i]);
    const uint8_t* blk = row + (i / QK8_0) * 34;
    return fp16_to_fp32(load_le16(blk)) * static_cast<float>(static_cast<int8_t>(blk[2 + i % QK8_0]));
}

__device__ __forceinline__ size_t head_offset(GgmlType t, int64_t hkv, int64_t hd) {
    return t == TYPE_F16 ? static_cast<size_t>(2 * hkv * hd) : static_cast<size_t>(hkv * hd / QK8_0 * 34);
}

__global__ void flash_attention_kernel(AttentionDev a, int bc, int64_t n_split, int64_t cells_per_split) {
    extern __shared__ float smem[];
    const int64_t hd = a.head_dim, group = a.n_head / a.n_head_kv, n_q = a.n_head * hd;
    const int64_t split = blockIdx.x % n_split;
    const int64_t hkv = (blockIdx.x / n_split) % a.n_head_kv;
    const int64_t qt = blockIdx.x / n_split / a.n_head_kv;
    const int64_t n_group_rows = a.n_tokens * group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* sq = smem;                      // [kFlashRows][hd]
    float* sk = sq + kFlashRows * hd;      // [bc][hd + 1]
    float* sv = sk + bc * (hd + 1);        // [bc][hd]
    float* sp = sv + bc * hd;              // [kFlashRows][bc]

    for (int64_t i = threadIdx.x; i < kFlashRows * hd; i += blockDim.x) {
        const int64_t gr = qt * kFlashRows + i / hd;
        float val = 0.0f;
        if (gr < n_group_rows) val = a.q[(gr / group) * n_q + (hkv * group + gr % group) * hd + i % hd];
        sq[i] = val;
    }

    bool active[kRowsPerWarp];
    int32_t pos[kRowsPerWarp];
    uint64_t mask[kRowsPerWarp];
    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxPerLane];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int64_t gr = qt * kFlashRows + rr * kWarps + warp;
        active[rr] = gr < n_group_rows;
        pos[rr] = active[rr] ? a.pos[gr / group] : 0;
        mask[rr] = active[rr] ? a.seq_mask[gr / group] : 0;
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int u = 0; u < kMaxPerLane; ++u) acc[rr][u] = 0.0f;
    }

    const size_t k_off = head_offset(a.type_k, hkv, hd), v_off = head_offset(a.type_v, hkv, hd);
    const int64_t n_used = used_cells(a);
    const int64_t c_begin = split * cells_per_split;
    const int64_t c_end = c_begin + cells_per_split < n_used ? c_begin + cells_per_split : n_used;
    for (int64_t c0 = c_begin; c0 < c_end; c0 += bc) {
        const int nc = static_cast<int>(c_end - c0 < bc ? c_end - c0 : bc);
        __syncthreads();  // the previous tile is no longer read
        for (int64_t i = threadIdx.x; i < bc * hd; i += blockDim.x) {
            const int64_t j = i / hd, d = i % hd;
            float kv = 0.0f, vv = 0.0f;
            if (j < nc) {
                kv = cache_value(a.type_k, a.k + (c0 + j) * a.k_row_bytes + k_off, d);
                vv = cache_value(a.type_v, a.v + (c0 + j) * a.v_row_bytes + v_off, d);
            }
            sk[j * (hd + 1) + d] = kv;
            sv[j * hd + d] = vv;
        }
        __syncthreads();
        const bool have = lane < nc;
        const int32_t cpos = have ? a.cell_pos[c0 + lane] : 0;
        const uint64_t cseq = have ? a.cell_seq[c0 + lane] : 0;
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            if (!active[rr]) continue;  // uniform across the warp
            const int r = rr * kWarps + warp;
            float s = -INFINITY;
            if (have && (cseq & mask[rr]) && cpos <= pos[rr]) {
                const float* qr = sq + r * hd;
                const float* kr = sk + lane * (hd + 1);
                float dot = 0.0f;
                for (int64_t d = 0; d < hd; ++d) dot += qr[d] * kr[d];
                s = dot * a.scale;
            }
            const float mn = fmaxf(m[rr], warp_max(s));
            float p = 0.0f;
            if (mn != -INFINITY) {
                const float corr = expf(m[rr] - mn);  // 0 while nothing was visible
                p = expf(s - mn);
                l[rr] = l[rr] * corr + warp_sum(p);
                m[rr] = mn;
#pragma unroll
                for (int u = 0; u < kMaxPerLane; ++u) acc[rr][u] *= corr;
            }
            if (lane < bc) sp[r * bc + lane] = p;
        }
        __syncwarp();
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            if (!active[rr] || m[rr] == -INFINITY) continue;
            const float* pr = sp + (rr * kWarps + warp) * bc;
            for (int j = 0; j < nc; ++j) {
                const float pj = pr[j];
                const float* vr = sv + j * hd;
#pragma unroll
                for (int u = 0; u < kMaxPerLane; ++u) {
                    const int64_t d = lane + 32 * u;
                    if (d < hd) acc[rr][u] += pj * vr[d];
                }
            }
        }
    }

    const int64_t n_rows = a.n_tokens * a.n_head;
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        if (!active[rr]) continue;
        const int64_t gr = qt * kFlashRows + rr * kWarps + warp;
        const int64_t row = (gr / group) * a.n_head + hkv * group + gr % group;
        float* dst;
        float mul = 1.0f;
        if (n_split == 1) {
            dst = a.out + row * hd;
            mul = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
        } else {
            dst = a.partial + 2 * n_split * n_rows + (split * n_rows + row) * hd;
            if (lane == 0) {
                a.partial[2 * (split * n_rows + row)] = m[rr];
                a.partial[2 * (split * n_rows + row) + 1] = l[rr];
            }
        }
#pragma unroll
        for (int u = 0; u < kMaxPerLane; ++u) {
            const int64_t d = lane + 32 * u;
            if (d < hd) dst[d] = acc[rr][u] * mul;
        }
    }
}

// One warp per output row (token, head): merges the n_split partials of flash_attention_kernel.
__global__ void flash_combine_kernel(const float* partial, int64_t n_split, int64_t n_rows, int64_t hd, float* out) {
    const int64_t row = blockIdx.x;
    const int lane = threadIdx.x;
    float mx = -INFINITY;
    for (int64_t s = 0; s < n_split; ++s) mx = fmaxf(mx, partial[2 * (s * n_rows + row)]);
    float* dst = out + row * hd;
    if (mx == -INFINITY) {
        for (int64_t d = lane; d < hd; d += 32) dst[d] = 0.0f;
        return;
    }
    float acc[kMaxPerLane], den = 0.0f;
#pragma unroll
    for (int u = 0; u < kMaxPerLane; ++u) acc[u] = 0.0f;
    for (int64_t s = 0; s < n_split; ++s) {
        const float ms = partial[2 * (s * n_rows + row)];
        if (ms == -INFINITY) continue;
        const float w = expf(ms - mx);
        den += w * partial[2 * (s * n_rows + row) + 1];
        const float* src = partial + 2 * n_split * n_rows + (s * n_rows + row) * hd;
#pragma unroll
        for (int u = 0; u < kMaxPerLane; ++u) {
            const int64_t d = lane + 32 * u;
            if (d < hd) acc[u] += w * src[d];
        }
    }
    const float inv = 1.0f / den;
#pragma unroll
    for (int u = 0; u < kMaxPerLane; ++u) {
        const int64_t d = lane + 32 * u;
        if (d < hd) dst[d] = acc[u] * inv;
    }
}

}  // namespace

int64_t flash_partial_floats(int64_t head_dim) { return kMaxBlocks * kFlashRows * (head_dim + 2); }

void flash_attention(const AttentionDev& a) {
    if (a.n_tokens <= 0) return;
    check_attention_shape(a);
    const int64_t n_rows = a.n_tokens * a.n_head;
    if (a.n_used <= 0) {
        check(cudaMemsetAsync(a.out, 0, sizeof(float) * n_rows * a.head_dim, stream()),
              "clearing the attention output");
        return;
    }
    const FlashGrid f = flash_grid(a);
    if (f.n_split > 1 && (a.partial == nullptr || a.partial_floats < n_rows * f.n_split * (a.head_dim + 2)))
        throw Error("CUDA flash attention: the partial-result buffer is missing or too small");
    const unsigned blocks = grid_for(f.n_qtiles * a.n_head_kv * f.n_split, "flash attention");
    flash_attention_kernel<<<blocks, kWarps * 32, f.smem, stream()>>>(a, f.bc, f.n_split, f.cells_per_split);
    check_launch("flash_attention_kernel");
    if (f.n_split > 1) {
        flash_combine_kernel<<<grid_for(n_rows, "flash attention combine"), 32, 0, stream()>>>(a.partial, f.n_split,
                                                                                              n_rows, a.head_dim, a.out);
        check_launch("flash_combine_kernel");
    }
}

}  // namespace bonsai::cuda
