// The CUDA twins of the engine's ops, on device pointers (one file per op, same basename as the
// CPU backend: act_quant.cu, matmul.cu, norm.cu, rope.cu, activation.cu, attention.cu, get_rows.cu,
// kv_cache.cu, gated_delta.cu). Each entry validates its arguments, launches on cuda::stream()
// (cuda_common.cuh: the default stream or the stream of a StreamScope) and checks the launch,
// without any synchronizing call, so that a step can be captured into a CUDA graph.
//
// Activations are row-major float32 [n_tokens, n], as on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bonsai/ops.h"
#include "bonsai/types.h"

namespace bonsai::cuda {

// A packed 2-D weight in device memory, rows of row_bytes bytes exactly as in the file.
struct DeviceMatrix {
    GgmlType type = TYPE_F32;
    const uint8_t* data = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
    size_t row_bytes = 0;
};

// The prism.hadamard rotation of one folded input on the device (signs in device memory).
struct GpuRotation {
    int64_t block = 0;             // 0 = not folded
    const float* signs = nullptr;  // [width] +-1, nullptr = identity sign mode
    bool active() const { return block > 0; }
};

// x = WHT_B(s ⊙ x) in place, row by row (hadamard.cu); bit-identical to the CPU's rotate_row.
void hadamard_rotate(float* x, int64_t n_tokens, int64_t cols, const GpuRotation& r);

// Scratch of the INT8 activation path: q [n_tokens, cols] int8 and one scale per token.
struct ActScratch {
    int8_t* q = nullptr;
    float* scale = nullptr;
    int64_t max_elems = 0;   // capacity of q (n_tokens * cols must fit)
    int64_t max_tokens = 0;  // capacity of scale
};

// act_quant.cu: per-token absmax INT8 quantization, bit-identical to cpu::quantize_act_token's q
// and scale (see cpp/backends/cpu/act_quant.h).
void quantize_act(const float* x, int64_t n_tokens, int64_t cols, const ActScratch& s);
// Throws unless n_tokens x cols activations fit the scratch.
void check_act_scratch(int64_t n_tokens, int64_t cols, const ActScratch& s);

// matmul.cu: y[t*rows + r] = sum_k W[r,k] x[t*cols + k]. INT8 mode for quantized weights: exact
// int32 per block, fma over the blocks in order, times the token scale (the CPU's operation
// order); FLOAT mode and F32/F16/BF16 weights: f32 dot products.
void matmul(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y, ActMode mode,
            const ActScratch& s);
// True when matmul of w in this mode runs the INT8 path (quantized weights, INT8 mode).
bool int8_path(const DeviceMatrix& w, ActMode mode);
// The INT8 path over activations already quantized into s (by rms_norm_quantize): several
// matrices reading one normalised input share one quantization.
void matmul_quantized(const DeviceMatrix& w, int64_t n_tokens, float* y, const ActScratch& s);

// norm.cu: y[r] = x[src(r)] / sqrt(mean(x[src(r)]^2) + eps) * w for n_rows rows of n, where
// src(r) = rows[r] when `rows` is given (device int32), else r. y may alias x when rows is null.
void rms_norm(const float* x, const int32_t* rows, const float* w, int64_t n_rows, int64_t n, float eps,
              float* y);
// rms_norm (no row list, y != x) that also leaves y quantized in s, as quantize_act(y) would.
void rms_norm_quantize(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y,
                       const ActScratch& s);

// rope.cu: rotates the first n_rot dims of each head of x [n_tokens, n_head * head_dim] in place
// with the per-token table cos_sin [n_tokens, n_rot] (built on the host by rope_table).
void rope(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot, bool neox,
          const float* cos_sin);

// activation.cu: out = silu(gate) * up; x += y; x[t] += b.
void swiglu(const float* gate, const float* up, int64_t n, float* out);
void add_inplace(float* x, const float* y, int64_t n);
void add_bias(float* x, const float* b, int64_t n_rows, int64_t n);

// kv_cache.cu: stores row t of src [n_tokens, n] (n = n_embd_kv) into cell cells[t] of one
// layer's cache (base + cell * row_bytes) as F16 or Q8_0, as KvCache::store does on the CPU.
void store_kv_rows(const float* src, int64_t n_tokens, int64_t n, const int32_t* cells, GgmlType type,
                   uint8_t* base, size_t row_bytes);

// attention.cu: causal attention of n_tokens queries over one layer's cache with one-pass online
// softmax (the CPU's flash variant). Cell c is visible to token t when cell_seq[c] & seq_mask[t]
// and cell_pos[c] <= pos[t], for c < n_used.
struct AttentionDev {
    const float* q = nullptr;           // [n_tokens, n_head * head_dim]
    int64_t n_tokens = 0;
    const int32_t* pos = nullptr;       // [n_tokens]
    const uint64_t* seq_mask = nullptr; // [n_tokens]
    const int32_t* cell_pos = nullptr;  // [n_used]
    const uint64_t* cell_seq = nullptr; // [n_used]
    int64_t n_used = 0;                 // cells; with n_used_dev: the capacity the grid is sized for
    const int32_t* n_used_dev = nullptr;  // optional device count of this step (<= n_used)
    const uint8_t* k = nullptr;         // this layer's K rows, k_row_bytes apart
    const uint8_t* v = nullptr;
    size_t k_row_bytes = 0, v_row_bytes = 0;
    GgmlType type_k = TYPE_F16, type_v = TYPE_F16;
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 1.0f;
    float* out = nullptr;               // [n_tokens, n_head * head_dim]
    float* partial = nullptr;           // flash only: split partials, partial_floats floats
    int64_t partial_floats = 0;
};
constexpr int64_t kMaxHeadDim = 256;
// The cells a kernel reads: min(*n_used_dev, n_used), or n_used.
__device__ __forceinline__ int64_t used_cells(const AttentionDev& a) {
    if (a.n_used_dev == nullptr) return a.n_used;
    const int64_t n = *a.n_used_dev;
    return n < a.n_used ? n : a.n_used;
}
// Throws unless the head shape and the cache types are supported (both kernels).
void check_attention_shape(const AttentionDev& a);
void attention(const AttentionDev& a);

// flash_attention.cu: the same result with K/V tiles in shared memory shared by a GQA group and,
// for few query tokens, the cells split across blocks (partials merged by a second kernel).
// `partial` must hold flash_partial_floats(head_dim) floats (enough for every grid it picks).
void flash_attention(const AttentionDev& a);
int64_t flash_partial_floats(int64_t head_dim);

// get_rows.cu: out[i*cols + k] = W[ids[i], k] dequantized (ids on the device, already checked).
void get_rows(const DeviceMatrix& w, const int32_t* ids, int64_t n, float* out);

// gated_delta.cu: qwen35's Gated DeltaNet ops, twins of bonsai/gated_delta.h's (same semantics and
// layouts).
// The recurrent state of token t's sequence is at base + slots[t] * stride (floats), slots a device
// int32 array of n_tokens entries; tokens of one slot update it in batch order.
struct SlotStates {
    float* base = nullptr;
    const int32_t* slots = nullptr;  // [n_tokens] device int32
    int64_t stride = 0;              // floats from one slot's state to the next
};
// In place over x [n_tokens, n_ch]; w_t [kernel][n_ch]; each slot's state [kernel-1][n_ch].
void gdn_conv1d_silu(float* x, int64_t n_tokens, int64_t n_ch, const float* w_t, int64_t kernel,
                     const SlotStates& states);
// x[r] /= sqrt(sum(x[r]^2) + eps) for n_rows contiguous rows of n.
void l2_norm_rows(float* x, int64_t n_rows, int64_t n, float eps);
// alpha_to_g <- ssm_a[h] * softplus(alpha + dt_bias[h]), beta <- sigmoid(beta), [n_tokens, n_heads].
void gdn_gates(float* alpha_to_g, float* beta, const float* dt_bias, const float* ssm_a, int64_t n_tokens,
               int64_t n_heads);
// The gated delta rule (bonsai/gated_delta.h DeltaRuleArgs); each slot's state is [n_v_heads][dv][dk], V head h
// reads K head h % n_k_heads; q and k already L2-normalized. 2 * dk floats must fit 48 KB.
struct DeltaRuleDev {
    const float* qkv = nullptr;  // [n_tokens, qkv_stride]: q (n_k_heads*dk) | k (n_k_heads*dk) | v (n_v_heads*dv)
    int64_t qkv_stride = 0;
    const float* g = nullptr;     // [n_tokens, n_v_heads]
    const float* beta = nullptr;  // [n_tokens, n_v_heads]
    int64_t n_tokens = 0, n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0;
    float scale = 1.0f;           // 1 / sqrt(dk)
    SlotStates states;
    float* out = nullptr;         // [n_tokens, n_v_heads * dv]
};
void gated_delta_rule(const DeltaRuleDev& a);
// o[r] = rms_norm(o[r]) * w * silu(z[r]) in place, n_rows rows of n, w [n].
void rms_norm_gated(float* o, const float* w, const float* z, int64_t n_rows, int64_t n, float eps);
// x *= sigmoid(gate) over n values.
void sigmoid_mul(float* x, const float* gate, int64_t n);

}  // namespace bonsai::cuda
