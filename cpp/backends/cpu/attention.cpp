// Causal multi-head attention over the KV cache on the CPU.
//
// One call handles one (token t, kv head hkv) pair and the n_rep = n_head / n_head_kv query heads
// that share that kv head (grouped-query attention), so every visible K/V row is converted from
// the cache type (f16 / q8_0) once per group instead of once per query head. A cell is visible to
// token t when its sequence mask intersects t's and its position is <= t's position.
//
// Two variants, equal up to float rounding:
//   score buffer (default): s = q.K * scale for every visible cell, softmax, out = sum p V.
//   flash (online softmax): one pass keeping a running maximum m, normaliser l and accumulator;
//     when a larger score arrives the accumulator is rescaled by exp(m_old - m_new). No buffer of
//     n_cells scores is needed.
//
// Scratch per call (floats): 2 * head_dim (K and V rows) + n_rep * n_cells (scores)
//   + n_rep * head_dim (accumulators) + 2 * n_rep (running maxima and normalisers).
#include <cmath>
#include <limits>

#include "../../src/layers.h"
#include "bonsai/quants.h"
#include "layers_cpu.h"

namespace bonsai::cpu {

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

inline void axpy(float* y, float a, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void attention_group(const AttentionArgs& a, int64_t t, int64_t hkv, float* scratch) {
    const KvCache& kv = *a.kv;
    const int64_t hd = a.head_dim, n_rep = a.n_head / a.n_head_kv, n_cells = kv.n_cells();
    const KvCacheParams& kp = kv.params();
    const size_t k_off = type_row_bytes(kp.type_k, hkv * hd);
    const size_t v_off = type_row_bytes(kp.type_v, hkv * hd);
    const int32_t* cell_pos = kv.cell_pos_data();
    const uint64_t* cell_seq = kv.cell_seq_data();
    const int64_t end = kv.used_end();
    const uint64_t mask = a.seq_mask[t];
    const int32_t p = a.pos[t];

    float* krow = scratch;
    float* vrow = krow + hd;
    float* scores = vrow + hd;
    float* acc = scores + n_rep * n_cells;
    float* m = acc + n_rep * hd;
    float* l = m + n_rep;

    const int64_t n_q = a.n_head * hd;
    const float* q0 = a.q + t * n_q + hkv * n_rep * hd;
    float* out0 = a.out + t * n_q + hkv * n_rep * hd;

    if (!a.flash) {
        int64_t nv = 0;
        for (int64_t c = 0; c < end; ++c) {
            if (!(cell_seq[c] & mask) || cell_pos[c] > p) continue;
            dequantize_row(kp.type_k, kv.k_row(a.layer, c) + k_off, krow, hd);
            for (int64_t r = 0; r < n_rep; ++r) {
                scores[r * n_cells + nv] = dot(q0 + r * hd, krow, hd) * a.scale;
            }
            ++nv;
        }
        for (int64_t r = 0; r < n_rep; ++r) {
            if (nv > 0) softmax(scores + r * n_cells, nv);
            for (int64_t i = 0; i < hd; ++i) out0[r * hd + i] = 0.0f;
        }
        int64_t j = 0;
        for (int64_t c = 0; c < end; ++c) {
            if (!(cell_seq[c] & mask) || cell_pos[c] > p) continue;
            dequantize_row(kp.type_v, kv.v_row(a.layer, c) + v_off, vrow, hd);
            for (int64_t r = 0; r < n_rep; ++r) axpy(out0 + r * hd, scores[r * n_cells + j], vrow, hd);
            ++j;
        }
        return;
    }

    for (int64_t r = 0; r < n_rep; ++r) {
        m[r] = -std::numeric_limits<float>::infinity();
        l[r] = 0.0f;
        for (int64_t i = 0; i < hd; ++i) acc[r * hd + i] = 0.0f;
    }
    for (int64_t c = 0; c < end; ++c) {
        if (!(cell_seq[c] & mask) || cell_pos[c] > p) continue;
        dequantize_row(kp.type_k, kv.k_row(a.layer, c) + k_off, krow, hd);
        dequantize_row(kp.type_v, kv.v_row(a.layer, c) + v_off, vrow, hd);
        for (int64_t r = 0; r < n_rep; ++r) {
            const float s = dot(q0 + r * hd, krow, hd) * a.scale;
            float* ar = acc + r * hd;
            if (s > m[r]) {
                const float corr = std::exp(m[r] - s);  // 0 on the first visible cell
                for (int64_t i = 0; i < hd; ++i) ar[i] *= corr;
                l[r] *= corr;
                m[r] = s;
            }
            const float w = std::exp(s - m[r]);
            axpy(ar, w, vrow, hd);
            l[r] += w;
        }
    }
    for (int64_t r = 0; r < n_rep; ++r) {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t i = 0; i < hd; ++i) out0[r * hd + i] = acc[r * hd + i] * inv;
    }
}

}  // namespace bonsai::cpu
