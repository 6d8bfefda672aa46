// Entry points of the transformer building blocks: argument checks, then the CPU backend
// (cpp/backends/cpu/). Row loops are spread over the thread pool where the work is per token.
#include "layers.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

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
    return cpu::attention_group_scratch_floats(n_cells, n_head / n_head_kv, head_dim);
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
    // (token, kv head) jobs claimed one at a time, so a thread that starts late or is descheduled
    // holds at most one job back (contiguous shares of a few long one-token jobs did).
    const int64_t n_jobs = a.n_tokens * a.n_head_kv;
    std::atomic<int64_t> next{0};
    pool.parallel_for(std::min<int64_t>(pool.size(), n_jobs), [&](int64_t, int64_t, int thread) {
        float* s = scratch + static_cast<size_t>(thread) * scratch_per_thread;
        for (int64_t j = next.fetch_add(1, std::memory_order_relaxed); j < n_jobs;
             j = next.fetch_add(1, std::memory_order_relaxed))
            cpu::attention_group(a, j / a.n_head_kv, j % a.n_head_kv, s);
    });
}

void gdn_conv1d_silu(float* x, int64_t n_tokens, int64_t n_ch, const float* w_t, int64_t kernel,
                     float* const* state, ThreadPool& pool) {
    if (n_ch <= 0 || kernel < 1 || n_tokens < 0 || !x || !w_t || (n_tokens > 0 && !state)) {
        throw Error("gdn_conv1d_silu: invalid arguments");
    }
    // Channels are independent: each thread runs its channel range through every token in order.
    constexpr int64_t kBlock = 64;
    const int64_t n_blocks = (n_ch + kBlock - 1) / kBlock;
    pool.parallel_for(n_blocks, [&](int64_t b0, int64_t b1, int) {
        const int64_t c0 = b0 * kBlock, c1 = std::min(n_ch, b1 * kBlock);
        for (int64_t t = 0; t < n_tokens; ++t) cpu::conv1d_silu_channels(x + t * n_ch, w_t, state[t], n_ch, c0, c1, kernel);
    });
}

void l2_norm_rows(float* x, int64_t n_rows, int64_t n, float eps) {
    if (n <= 0 || n_rows < 0 || !x) throw Error("l2_norm_rows: invalid arguments");
    for (int64_t r = 0; r < n_rows; ++r) cpu::l2_norm_row(x + r * n, n, eps);
}

void gdn_gates(float* alpha_to_g, float* beta, const float* dt_bias, const float* ssm_a, int64_t n_tokens,
               int64_t n_heads) {
    if (n_heads <= 0 || n_tokens < 0 || !alpha_to_g || !beta || !dt_bias || !ssm_a) {
        throw Error("gdn_gates: invalid arguments");
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t h = 0; h < n_heads; ++h) {
            const int64_t i = t * n_heads + h;
            const float u = alpha_to_g[i] + dt_bias[h];
            const float softplus = u > 20.0f ? u : std::log1p(std::exp(u));  // log(1 + e^u), exact past 20
            alpha_to_g[i] = ssm_a[h] * softplus;
            beta[i] = 1.0f / (1.0f + std::exp(-beta[i]));
        }
    }
}

void gated_delta_rule(const DeltaRuleArgs& a, ThreadPool& pool) {
    if (a.n_k_heads <= 0 || a.n_v_heads <= 0 || a.n_v_heads % a.n_k_heads != 0 || a.dk <= 0 || a.dv <= 0 ||
        a.qkv_stride < 2 * a.n_k_heads * a.dk + a.n_v_heads * a.dv || !a.qkv || !a.g || !a.beta || !a.out ||
        (a.n_tokens > 0 && !a.state)) {
        throw Error("gated_delta_rule: invalid arguments");
    }
    if (a.chunk < 0) throw Error("gated_delta_rule: negative chunk length");
    const int64_t q_off = 0, k_off = a.n_k_heads * a.dk, v_off = 2 * a.n_k_heads * a.dk;
    const int64_t state_head = a.dv * a.dk;
    // runs of consecutive tokens sharing a state pointer: [begin, end)
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
        if (runs.empty() || a.state[t] != a.state[t - 1]) runs.emplace_back(t, t);
        runs.back().second = t + 1;
    }
    // V heads are independent: each thread runs its heads through every token in order.
    pool.parallel_for(a.n_v_heads, [&](int64_t h0, int64_t h1, int) {
        cpu::DeltaChunkScratch w;
        std::vector<const float*> qs, ks, vs;
        std::vector<float> gs, bs;
        std::vector<float*> os;
        auto step = [&](int64_t t, int64_t h) {
            const float* row = a.qkv + t * a.qkv_stride;
            const int64_t kh = h % a.n_k_heads;
            const int64_t gi = t * a.n_v_heads + h;
            cpu::delta_rule_head(a.state[t] + h * state_head, row + q_off + kh * a.dk, row + k_off + kh * a.dk,
                                 row + v_off + h * a.dv, std::exp(a.g[gi]), a.beta[gi], a.scale, a.dk, a.dv,
                                 a.out + t * a.n_v_heads * a.dv + h * a.dv);
        };
        for (const auto& [b, e] : runs) {
            int64_t t = b;
            if (a.chunk > 0) {
                for (; t + a.chunk <= e; t += a.chunk) {
                    for (int64_t h = h0; h < h1; ++h) {
                        const int64_t kh = h % a.n_k_heads, n = a.chunk;
                        qs.resize(n), ks.resize(n), vs.resize(n), gs.resize(n), bs.resize(n), os.resize(n);
                        for (int64_t i = 0; i < n; ++i) {
                            const float* row = a.qkv + (t + i) * a.qkv_stride;
                            qs[i] = row + q_off + kh * a.dk;
                            ks[i] = row + k_off + kh * a.dk;
                            vs[i] = row + v_off + h * a.dv;
                            gs[i] = a.g[(t + i) * a.n_v_heads + h];
                            bs[i] = a.beta[(t + i) * a.n_v_heads + h];
                            os[i] = a.out + (t + i) * a.n_v_heads * a.dv + h * a.dv;
                        }
                        cpu::delta_rule_chunk(a.state[t] + h * state_head, qs.data(), ks.data(), vs.data(), gs.data(),
                                              bs.data(), a.scale, n, a.dk, a.dv, os.data(), w);
                    }
                }
            }
            for (; t < e; ++t) {
                for (int64_t h = h0; h < h1; ++h) step(t, h);
            }
        }
    });
}

void rms_norm_gated(float* o, const float* w, const float* z, int64_t n_rows, int64_t n, float eps) {
    if (n <= 0 || n_rows < 0 || !o || !w || !z) throw Error("rms_norm_gated: invalid arguments");
    for (int64_t r = 0; r < n_rows; ++r) cpu::rms_norm_gated_row(o + r * n, w, z + r * n, n, eps);
}

void sigmoid_mul(float* x, const float* gate, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

}  // namespace bonsai
