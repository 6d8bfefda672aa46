// CPU implementations of the building blocks declared in cpp/src/layers.h (one file per concept:
// norm.cpp, rope.cpp, activation.cpp, softmax.cpp, attention.cpp). Arguments are trusted here;
// the entry points in layers.cpp validate them.
#pragma once

#include <cstdint>
#include <vector>

#include "bonsai/kv_cache.h"

namespace bonsai {
struct AttentionArgs;
struct RopeParams;

namespace cpu {

void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y);
void rope_table(const int32_t* pos, int64_t n_tokens, const RopeParams& p, float* cos_sin);
void rope_head(float* x, const RopeParams& p, const float* cos_sin);
void swiglu(const float* gate, const float* up, int64_t n, float* out);
// Softmax of x[0..n) in place; returns nothing, x sums to 1 afterwards.
void softmax(float* x, int64_t n);
// Attention of token t against kv head hkv: writes the n_head / n_head_kv query heads that read it.
// scratch: attention_group_scratch_floats(kv->n_cells(), n_head / n_head_kv, head_dim) floats.
void attention_group(const AttentionArgs& a, int64_t t, int64_t hkv, float* scratch);
size_t attention_group_scratch_floats(int64_t n_cells, int64_t n_rep, int64_t head_dim);

// qwen35 Gated DeltaNet rows (gated_delta.cpp).
void conv1d_silu_channels(float* x, const float* w_t, float* state, int64_t n_ch, int64_t c0, int64_t c1,
                          int64_t kernel);
void l2_norm_row(float* x, int64_t n, float eps);
void delta_rule_head(float* S, const float* q, const float* k, const float* v, float decay, float beta, float scale,
                     int64_t dk, int64_t dv, float* o);
void rms_norm_gated_row(float* o, const float* w, const float* z, int64_t n, float eps);
// The delta rule over n consecutive tokens of one sequence and one V head in the chunked (WY)
// form, equal to n delta_rule_head steps (gated_delta_chunked.cpp). q/k/v/o: per-token rows.
struct DeltaChunkScratch {
    std::vector<float> G, kk, qk, sk, sq;
};
void delta_rule_chunk(float* S, const float* const* q, const float* const* k, const float* const* v, const float* g,
                      const float* beta, float scale, int64_t n, int64_t dk, int64_t dv, float* const* o,
                      DeltaChunkScratch& w);

}  // namespace cpu
}  // namespace bonsai
