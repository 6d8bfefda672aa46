// Entry points of the transformer building blocks: argument checks, then the CPU backend
// (cpp/backends/cpu/). Row loops are spread over the thread pool where the work is per token.
#include "layers.h"

#include <string>

#include "../backends/cpu/layers_cpu.h"
#include "bonsai/error.h"

namespace bonsai {

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
    if (n <= 0 || n_rows < 0 || !x || !w || !y) throw Error("rms_norm: invalid arguments");
    for (int64_t r = 0; r < n_rows; ++r) cpu::rms_norm_row(x + r * n, w, n, eps, y + r * n);
}

void rope_table(const int32_t* pos, int64_t n_tokens, const RopeParams& p, float* cos_sin) {
    if (p.n_rot <= 0 || p.n_rot % 2 != 0) {
        throw Error("rope: the rotated dimension count must be even and positive, got " +
                    std::to_string(p.n_rot));
    }
    cpu::rope_table(pos, n_tokens, p, cos_sin);
}

void rope_apply(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, const RopeParams& p,
                const float* cos_sin) {
    if (p.n_rot > head_dim) {
        throw Error("rope: n_rot " + std::to_string(p.n_rot) + " exceeds the head size " +
                    std::to_string(head_dim));
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t h = 0; h < n_head; ++h) {
            cpu::rope_head(x + (t * n_head + h) * head_dim, p, cos_sin + t * p.n_rot);
        }
    }
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
    cpu::swiglu(gate, up, n, out);
}

void add_bias(float* x, const float* b, int64_t n_rows, int64_t n) {
    for (int64_t r = 0; r < n_rows; ++r) {
        float* xr = x + r * n;
        for (int64_t i = 0; i < n; ++i) xr[i] += b[i];
    }
}

void add_inplace(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

size_t attention_scratch_floats(int64_t n_cells, int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    const int64_t n_rep = n_head / n_head_kv;
    return static_cast<size_t>(2 * head_dim + n_rep * n_cells + n_rep * head_dim + 2 * n_rep);
}

void attention(const AttentionArgs& a, float* scratch, size_t scratch_per_thread, ThreadPool& pool) {
    if (!a.kv || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 ||
        a.n_head_kv * a.head_dim != a.kv->params().n_embd_kv || a.layer < 0 ||
        a.layer >= a.kv->params().n_layer) {
        throw Error("attention: query/cache shapes do not match");
    }
    if (scratch_per_thread < attention_scratch_floats(a.kv->n_cells(), a.n_head, a.n_head_kv, a.head_dim)) {
        throw Error("attention: scratch buffer too small");
    }
    const int64_t n_jobs = a.n_tokens * a.n_head_kv;
    pool.parallel_for(n_jobs, [&](int64_t begin, int64_t end, int thread) {
        float* s = scratch + static_cast<size_t>(thread) * scratch_per_thread;
        for (int64_t j = begin; j < end; ++j) cpu::attention_group(a, j / a.n_head_kv, j % a.n_head_kv, s);
    });
}

}  // namespace bonsai
