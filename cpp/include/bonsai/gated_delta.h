// qwen35's Gated DeltaNet (linear attention) ops, SPEC §6a: device-agnostic entry points that
// validate their arguments and run the CPU implementation (cpp/backends/cpu/gated_delta.cpp; CUDA
// twins in cpp/backends/cuda/gated_delta.cu). Public so that the Python tests can check each op
// against a float64 reference.
//
// A chunk may hold tokens of several sequences; each op that carries state takes, per token, a
// pointer to the recurrent state of that token's sequence (its slot), and processes the tokens in
// batch order, so the tokens of one sequence update its state one after the other.
#pragma once

#include <cstdint>

#include "bonsai/thread_pool.h"

namespace bonsai {

// Causal depthwise conv1d with a carried state, then SiLU, in place: for token t and channel c,
// x[t][c] = silu(sum_j w_t[j][c] * u_j) over the window u = (state rows 0..kernel-2, x[t]) of the
// last `kernel` inputs, oldest first; the state then drops its oldest row and appends x[t]'s input.
// w_t: [kernel][n_ch] (the file's [n_ch][kernel] taps transposed); state[t]: [kernel-1][n_ch].
void gdn_conv1d_silu(float* x, int64_t n_tokens, int64_t n_ch, const float* w_t, int64_t kernel,
                     float* const* state, ThreadPool& pool);

// x[r] /= sqrt(sum(x[r]^2) + eps) for n_rows rows of n (transformers' l2norm, eps 1e-6).
void l2_norm_rows(float* x, int64_t n_rows, int64_t n, float eps);

// beta = sigmoid(beta_logit) and g = ssm_a[h] * softplus(alpha[t][h] + dt_bias[h]) (the log of
// the decay; ssm_a = -exp(A_log) < 0), in place over [n_tokens, n_heads].
void gdn_gates(float* alpha_to_g, float* beta, const float* dt_bias, const float* ssm_a, int64_t n_tokens,
               int64_t n_heads);

// The gated delta rule over the tokens of a chunk. Per token t and V head h, with its K head
// kh = h % n_k_heads (tiled order) and S = state[t] + h * dv * dk ([dv][dk], row r holds S[r][.]):
//   S <- e^g S;  delta = beta (v - S k);  S <- S + delta k^T;  o = scale * S q
// q and k must already be L2-normalized per head.
struct DeltaRuleArgs {
    const float* qkv = nullptr;  // [n_tokens, qkv_stride]: q (n_k_heads*dk) | k (n_k_heads*dk) | v (n_v_heads*dv)
    int64_t qkv_stride = 0;
    const float* g = nullptr;     // [n_tokens, n_v_heads]
    const float* beta = nullptr;  // [n_tokens, n_v_heads]
    int64_t n_tokens = 0, n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0;
    float scale = 1.0f;           // 1 / sqrt(dk)
    float* const* state = nullptr;  // [n_tokens]: the delta state of token t's sequence, [n_v_heads][dv][dk]
    float* out = nullptr;         // [n_tokens, n_v_heads * dv]
    // Runs of >= chunk consecutive tokens sharing one state go through the chunked (WY) form in
    // chunks of `chunk` tokens; shorter runs and the tail of a run take the one-token step.
    // 0 = the step only, the default: on the 2-core AVX-512 dev machine qwen35 pp512 measured 907
    // t/s with the step vs 819 (chunk 32) and 735 (chunk 64), medians of 3, noisy.
    int64_t chunk = 0;
};
void gated_delta_rule(const DeltaRuleArgs& a, ThreadPool& pool);

// o[r] = rms_norm(o[r]) * w * silu(z[r]) for n_rows rows of n (the GDN output norm, per V head).
void rms_norm_gated(float* o, const float* w, const float* z, int64_t n_rows, int64_t n, float eps);

// x *= sigmoid(gate) over n values (the output gate of qwen35's attention).
void sigmoid_mul(float* x, const float* gate, int64_t n);

}  // namespace bonsai
