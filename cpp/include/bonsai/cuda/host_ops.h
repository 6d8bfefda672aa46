// Host-memory entry points of the CUDA ops, for the parity tests and benchmarks (python/_core
// bind_cuda.cpp): each validates its arguments like the CPU entry, copies the inputs to the
// device, runs the kernel of cpp/backends/cuda/<op>.cu, copies the result back and frees its
// temporary device buffers (also when a CUDA call fails). Defined only in BONSAI_CUDA builds.
#pragma once

#include <cstdint>

#include "bonsai/ops.h"
#include "bonsai/types.h"

namespace bonsai {

// y [n_tokens, w.rows] as bonsai::matmul computes it (same activation modes).
void cuda_matmul_host(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode);
// out [n, w.cols] as bonsai::get_rows (ids checked against w.rows first).
void cuda_get_rows_host(const WeightView& w, const int32_t* ids, int64_t n, float* out);
// y [n_rows, n] = rms_norm of x with weight w [n].
void cuda_rms_norm_host(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);
// Rotates x [n_tokens, n_head * head_dim] in place; the table comes from the CPU rope_table for
// positions pos with base theta, freq_scale and optional freq_factors [n_rot / 2].
void cuda_rope_host(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot,
                    bool neox, float theta, float freq_scale, const float* freq_factors);
// out = silu(gate) * up over n values.
void cuda_swiglu_host(const float* gate, const float* up, int64_t n, float* out);
// Converts rows [n_rows, n] to the KV cache type (F16 or Q8_0) with the device store kernel;
// out receives n_rows * row_bytes(type, n) bytes.
void cuda_store_kv_host(const float* rows, int64_t n_rows, int64_t n, GgmlType type, uint8_t* out);
// Attention of q [n_tokens, n_head * head_dim] over n_cells cache rows k, v [n_cells, n_head_kv *
// head_dim] (stored as type_k / type_v first), with cell positions / sequence masks and the
// tokens' positions / masks; out [n_tokens, n_head * head_dim]. flash selects flash_attention.cu
// (with a partial buffer of flash_partial_floats) instead of attention.cu.
void cuda_attention_host(const float* q, int64_t n_tokens, const int32_t* pos, const uint64_t* seq_mask,
                         const float* k, const float* v, int64_t n_cells, const int32_t* cell_pos,
                         const uint64_t* cell_seq, GgmlType type_k, GgmlType type_v, int64_t n_head,
                         int64_t n_head_kv, int64_t head_dim, float scale, bool flash, float* out);

// qwen35's Gated DeltaNet ops (gated_delta.cu), in place like the CPU ops of bonsai/gated_delta.h. The
// recurrent states are n_slots host slots (conv: [kernel-1][n_ch] each; delta rule: [n_v_heads][dv][dk]
// each), token t using slot slots[t] (checked against n_slots); on the device the slots lie a few
// floats further apart than their size, so the kernels' slot stride is exercised, and a write into
// that padding throws.
void cuda_gdn_conv1d_silu_host(float* x, int64_t n_tokens, int64_t n_ch, const float* w_t, int64_t kernel,
                               float* states, int64_t n_slots, const int32_t* slots);
void cuda_l2_norm_rows_host(float* x, int64_t n_rows, int64_t n, float eps);
void cuda_gdn_gates_host(float* alpha_to_g, float* beta, const float* dt_bias, const float* ssm_a, int64_t n_tokens,
                         int64_t n_heads);
// qkv [n_tokens, qkv_stride], g and beta [n_tokens, n_v_heads], out [n_tokens, n_v_heads * dv].
void cuda_gated_delta_rule_host(const float* qkv, int64_t n_tokens, int64_t qkv_stride, const float* g,
                                const float* beta, int64_t n_k_heads, int64_t n_v_heads, int64_t dk, int64_t dv,
                                float scale, float* states, int64_t n_slots, const int32_t* slots, float* out);
void cuda_rms_norm_gated_host(float* o, const float* w, const float* z, int64_t n_rows, int64_t n, float eps);
void cuda_sigmoid_mul_host(float* x, const float* gate, int64_t n);

// Device memory bandwidth probe: copies a device buffer of `bytes` to another `iters` times
// (after one untimed copy) and returns the bytes read + written per second (2 * bytes * iters /
// wall time between two device synchronizations): the roofline figure of the GPU benchmark.
double cuda_copy_bandwidth(uint64_t bytes, int iters);

}  // namespace bonsai
