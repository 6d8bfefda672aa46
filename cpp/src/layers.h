// Device-agnostic entry points of the transformer building blocks (RMSNorm, rotary embedding,
// SwiGLU, residual/bias adds, attention over the KV cache). Each entry validates its arguments
// once and runs the CPU implementation in cpp/backends/cpu/ (the ground truth); a CUDA twin of the
// same basename would be dispatched from here.
//
// Activations are row-major float32: a matrix [n_tokens, n] has token t's row at x + t * n.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bonsai/gated_delta.h"  // the qwen35 Gated DeltaNet ops (public: bound for tests)
#include "bonsai/kv_cache.h"
#include "bonsai/model.h"
#include "bonsai/thread_pool.h"

namespace bonsai {

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for n_rows rows of n; y may alias x.
void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);

// Per-token rotation table: cos_sin[t * n_rot + 2*i] = cos(theta_i(pos[t])), [.. + 1] = sin.
// theta_i(p) = p * freq_scale * theta_base^(-2i / n_rot) / freq_factors[i] (factors optional).
struct RopeParams {
    RopeType type = RopeType::NORMAL;
    int64_t n_rot = 0;
    float theta_base = 10000.0f;
    float freq_scale = 1.0f;
    const float* freq_factors = nullptr;  // n_rot / 2 values (llama3 rope_freqs), or null
};
void rope_table(const int32_t* pos, int64_t n_tokens, const RopeParams& p, float* cos_sin);
// Rotates the first n_rot dimensions of every head of x [n_tokens, n_head * head_dim] in place.
void rope_apply(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, const RopeParams& p,
                const float* cos_sin);

// out = silu(gate) * up, elementwise over n values.
void swiglu(const float* gate, const float* up, int64_t n, float* out);
// x[t] += b for n_rows rows of n (bias add).
void add_bias(float* x, const float* b, int64_t n_rows, int64_t n);
// x += y over n values (residual add).
void add_inplace(float* x, const float* y, int64_t n);

// Causal attention of a batch of queries over the KV cache of one layer (GQA: query head h reads
// kv head h / (n_head / n_head_kv)). Token t sees the cells whose sequence mask intersects
// seq_mask[t] and whose position is <= pos[t]. The tokens' own K/V must already be stored.
struct AttentionArgs {
    const float* q = nullptr;        // [n_tokens, n_head * head_dim]
    int64_t n_tokens = 0;
    const int32_t* pos = nullptr;    // [n_tokens]
    const uint64_t* seq_mask = nullptr;  // [n_tokens]
    const KvCache* kv = nullptr;
    int64_t layer = 0;
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 1.0f;              // 1 / sqrt(head_dim)
    bool flash = false;              // one-pass online softmax instead of a score buffer
    float* out = nullptr;            // [n_tokens, n_head * head_dim]
};
// Floats of scratch one thread needs for a cache of n_cells cells.
size_t attention_scratch_floats(int64_t n_cells, int64_t n_head, int64_t n_head_kv, int64_t head_dim);
// scratch: n_threads * attention_scratch_floats(...) floats.
void attention(const AttentionArgs& a, float* scratch, size_t scratch_per_thread, ThreadPool& pool);

}  // namespace bonsai
