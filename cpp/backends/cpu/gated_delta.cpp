// qwen35's Gated DeltaNet rows on the CPU: the causal conv1d step, the L2 norm, the gated delta
// rule of one V head and the gated output norm.
//
// The delta rule touches each state row twice per token (S·k, then the update fused with S·q);
// a row is dk floats (512 bytes for dk = 128), so both passes run from L1. The dot products keep
// 16 independent partial sums so that the compiler vectorizes them without reassociating.
#include <cmath>

#include "dot_f32.h"
#include "layers_cpu.h"

namespace bonsai::cpu {

namespace {

constexpr int kLanes = 16;

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

void conv1d_silu_channels(float* x, const float* w_t, float* state, int64_t n_ch, int64_t c0, int64_t c1,
                          int64_t kernel) {
    const int64_t n_state = kernel - 1;
    for (int64_t c = c0; c < c1; ++c) {
        const float in = x[c];
        float acc = w_t[n_state * n_ch + c] * in;
        for (int64_t j = 0; j < n_state; ++j) acc += w_t[j * n_ch + c] * state[j * n_ch + c];
        for (int64_t j = 0; j + 1 < n_state; ++j) state[j * n_ch + c] = state[(j + 1) * n_ch + c];
        if (n_state > 0) state[(n_state - 1) * n_ch + c] = in;
        x[c] = silu(acc);
    }
}

void l2_norm_row(float* x, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss + eps));
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void delta_rule_head(float* S, const float* q, const float* k, const float* v, float decay, float beta, float scale,
                     int64_t dk, int64_t dv, float* o) {
    for (int64_t r = 0; r < dv; ++r) {
        float* s = S + r * dk;
        // delta uses the decayed row: beta (v_r - (e^g s) . k)
        const float delta = beta * (v[r] - decay * dot_f32(s, k, dk));
        float acc[kLanes] = {};
        int64_t i = 0;
        for (; i + kLanes <= dk; i += kLanes) {
            for (int l = 0; l < kLanes; ++l) {
                const float u = decay * s[i + l] + delta * k[i + l];
                s[i + l] = u;
                acc[l] += u * q[i + l];
            }
        }
        float sum = 0.0f;
        for (int l = 0; l < kLanes; ++l) sum += acc[l];
        for (; i < dk; ++i) {
            const float u = decay * s[i] + delta * k[i];
            s[i] = u;
            sum += u * q[i];
        }
        o[r] = scale * sum;
    }
}

void rms_norm_gated_row(float* o, const float* w, const float* z, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(o[i]) * o[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) o[i] = o[i] * inv * w[i] * silu(z[i]);
}

}  // namespace bonsai::cpu
