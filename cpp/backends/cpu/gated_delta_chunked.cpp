// qwen35's gated delta rule over a chunk of n consecutive tokens of one sequence and one V head,
// in the WY form (SPEC §6a). With G_t = g_1 + ... + g_t (cumulative log-decay inside the chunk,
// G_t <= G_j for t >= j since g <= 0) and S0 the carried state, the recurrence unrolls to
//   S_t = e^{G_t} S0 + sum_{j<=t} e^{G_t - G_j} d_j k_j^T,
// where d_t is the recurrence's delta. Substituting S_{t-1} k_t gives the lower-triangular system
//   d_t = beta_t (v_t - e^{G_t} S0 k_t) - beta_t sum_{j<t} e^{G_t - G_j} (k_t . k_j) d_j,
// solved by forward substitution; then
//   o_t = scale (e^{G_t} S0 q_t + sum_{j<=t} e^{G_t - G_j} (q_t . k_j) d_j),
//   S  <- e^{G_n} S0 + sum_j e^{G_n - G_j} d_j k_j^T.
// Every exponent is G_i - G_j with i >= j (<= 0), so no factor overflows. The state row S0_r is
// read once for all n tokens (S0 k_t and S0 q_t) and written once, instead of twice per token.
#include <cmath>
#include <vector>

#include "dot_f32.h"
#include "layers_cpu.h"

namespace bonsai::cpu {

void delta_rule_chunk(float* S, const float* const* q, const float* const* k, const float* const* v, const float* g,
                      const float* beta, float scale, int64_t n, int64_t dk, int64_t dv, float* const* o,
                      DeltaChunkScratch& w) {
    w.G.resize(n);
    w.kk.resize(n * n);
    w.qk.resize(n * n);
    w.sk.resize(n * dv);
    w.sq.resize(n * dv);
    float* G = w.G.data();
    float run = 0.0f;
    for (int64_t t = 0; t < n; ++t) G[t] = run += g[t];
    // decay-weighted K K^T (strictly lower) and Q K^T (lower with diagonal)
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t j = 0; j <= t; ++j) {
            const float e = std::exp(G[t] - G[j]);
            w.kk[t * n + j] = j < t ? e * dot_f32(k[t], k[j], dk) : 0.0f;
            w.qk[t * n + j] = e * dot_f32(q[t], k[j], dk);
        }
    }
    // S0 k_t and S0 q_t, [t][r]: each state row read once for the chunk
    for (int64_t r = 0; r < dv; ++r) {
        const float* s = S + r * dk;
        for (int64_t t = 0; t < n; ++t) {
            w.sk[t * dv + r] = dot_f32(s, k[t], dk);
            w.sq[t * dv + r] = dot_f32(s, q[t], dk);
        }
    }
    // forward substitution for the deltas, stored in sk's place ([t][r])
    float* d = w.sk.data();
    for (int64_t t = 0; t < n; ++t) {
        const float eg = std::exp(G[t]);
        float* dt = d + t * dv;
        for (int64_t r = 0; r < dv; ++r) dt[r] = v[t][r] - eg * dt[r];
        for (int64_t j = 0; j < t; ++j) {
            const float c = w.kk[t * n + j];
            const float* dj = d + j * dv;
            for (int64_t r = 0; r < dv; ++r) dt[r] -= c * dj[r];
        }
        const float b = beta[t];
        for (int64_t r = 0; r < dv; ++r) dt[r] *= b;
        // output: the carried state's part plus the chunk's own tokens up to t
        float* ot = o[t];
        const float* sqt = w.sq.data() + t * dv;
        for (int64_t r = 0; r < dv; ++r) ot[r] = eg * sqt[r];
        for (int64_t j = 0; j <= t; ++j) {
            const float c = w.qk[t * n + j];
            const float* dj = d + j * dv;
            for (int64_t r = 0; r < dv; ++r) ot[r] += c * dj[r];
        }
        for (int64_t r = 0; r < dv; ++r) ot[r] *= scale;
    }
    // state update: S_r <- e^{G_n} S_r + sum_j e^{G_n - G_j} d_j[r] k_j
    const float en = std::exp(G[n - 1]);
    for (int64_t j = 0; j < n; ++j) w.G[j] = std::exp(G[n - 1] - G[j]);  // G no longer needed
    for (int64_t r = 0; r < dv; ++r) {
        float* s = S + r * dk;
        for (int64_t i = 0; i < dk; ++i) s[i] *= en;
        for (int64_t j = 0; j < n; ++j) {
            const float c = w.G[j] * d[j * dv + r];
            const float* kj = k[j];
            for (int64_t i = 0; i < dk; ++i) s[i] += c * kj[i];
        }
    }
}

}  // namespace bonsai::cpu
