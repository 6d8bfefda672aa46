// Causal multi-head attention over the KV cache on the CPU.
//
// One call handles one (token t, kv head hkv) pair and the n_rep = n_head / n_head_kv query heads
// that share that kv head (grouped-query attention), so every visible K/V row is read once per
// group instead of once per query head. A cell is visible to token t when its sequence mask
// intersects t's and its position is <= t's position.
//
// Two variants, equal up to float rounding:
//   score buffer (default): s = q.K * scale for every visible cell, softmax, out = sum p V.
//   flash (online softmax): one pass keeping a running maximum m, normaliser l and accumulator;
//     when a larger score arrives the accumulator is rescaled by exp(m_old - m_new). No buffer of
//     n_cells scores is needed.
//
// The AVX-512 path (taken when the active CPU path is avx512) reads the f16 / q8_0 cache rows
// directly with vector conversions. Its score-buffer variant is one block over every visible cell
// (pass 1: scores of all n_rep heads from each K row; softmax with a vector exp; pass 2: out +=
// p V, 16 dimensions at a time with up to 8 heads' accumulators in registers, so each V chunk is
// converted once per 8 heads). Its flash variant runs the same two passes over blocks of
// kFlashBlock visible cells and rescales the accumulators between blocks (online softmax at block
// granularity, so K and V of a block are read while they are in cache).
//
// Scratch per call (floats): 2 * head_dim (K and V rows) + n_rep * n_cells (scores)
//   + n_rep * head_dim (accumulators) + 2 * n_rep (running maxima and normalisers).
#include <algorithm>
#include <cmath>
#include <limits>

#include "../../src/layers.h"
#include "block_unpack.h"
#include "bonsai/ops.h"
#include "bonsai/quants.h"
#include "layers_cpu.h"
#include "vec_exp.h"

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

void attention_group_scalar(const AttentionArgs& a, int64_t t, int64_t hkv, float* scratch) {
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

#define BONSAI_AVX512 BONSAI_AVX512_MATH

constexpr int64_t kFlashBlock = 64;  // visible cells per block of the flash variant
constexpr int kHeadGroup = 8;        // heads whose pass-2 accumulators share one V chunk
constexpr int64_t kPrefetchCells = 16; // cache rows prefetched this many cells ahead

// Elements [e, e + 16) of a cache row slice as f32; m masks the tail of an f16 head (q8_0 heads
// are whole blocks of 32, so their chunks are always full).
template <GgmlType T>
BONSAI_AVX512 inline __m512 load16(const uint8_t* row, int64_t e, __mmask16 m) {
    if constexpr (T == TYPE_F16) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * e));
    } else {
        const uint8_t* b = row + (e / 32) * sizeof(block_q8_0);
        const __m512 d = _mm512_set1_ps(fp16_to_fp32(load_u16(b)));
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + e % 32));
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
}

// Prefetches every cache line that holds a byte of [row, row + n).
BONSAI_AVX512 inline void prefetch_row(const uint8_t* row, size_t n) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(row) & ~uintptr_t{63};
    for (uintptr_t l = first; l < reinterpret_cast<uintptr_t>(row) + n; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T0);
}

// ar[h * hd + (0..16)] += sum over the visible cells of [c0, c1) of pr[h * block + j] * V[cell][16 i ..]
// for NR heads, j counting the visible cells; the accumulators stay in registers. The sweep over
// chunk 0 prefetches the V rows kPrefetchCells cells ahead.
template <GgmlType TV, int NR>
BONSAI_AVX512 void accumulate_pv(const KvCache& kv, int64_t layer, size_t v_off, size_t v_bytes, uint64_t mask,
                                 int32_t pos, int64_t c0, int64_t c1, int64_t i, int64_t hd, __mmask16 mk,
                                 const float* pr, int64_t block, float* ar) {
    const int32_t* cell_pos = kv.cell_pos_data();
    const uint64_t* cell_seq = kv.cell_seq_data();
    __m512 av[NR];
    for (int h = 0; h < NR; ++h) av[h] = _mm512_maskz_loadu_ps(mk, ar + h * hd);
    int64_t j = 0;
    for (int64_t cc = c0; cc < c1; ++cc) {
        if (i == 0 && cc + kPrefetchCells < c1) prefetch_row(kv.v_row(layer, cc + kPrefetchCells) + v_off, v_bytes);
        if (!(cell_seq[cc] & mask) || cell_pos[cc] > pos) continue;
        const __m512 v = load16<TV>(kv.v_row(layer, cc) + v_off, 16 * i, mk);
        for (int h = 0; h < NR; ++h) av[h] = _mm512_fmadd_ps(_mm512_set1_ps(pr[h * block + j]), v, av[h]);
        ++j;
    }
    for (int h = 0; h < NR; ++h) _mm512_mask_storeu_ps(ar + h * hd, mk, av[h]);
}

template <GgmlType TK, GgmlType TV>
BONSAI_AVX512 void attention_group_avx512(const AttentionArgs& a, int64_t t, int64_t hkv, float* scratch) {
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
    const int64_t nv = (hd + 15) / 16;
    const __mmask16 tail = hd % 16 ? static_cast<__mmask16>((1u << (hd % 16)) - 1) : static_cast<__mmask16>(0xFFFF);
    const int64_t block = a.flash ? std::min(kFlashBlock, n_cells) : n_cells;
    const size_t k_bytes = type_row_bytes(kp.type_k, hd), v_bytes = type_row_bytes(kp.type_v, hd);

    float* kbuf = scratch;                 // one K row as f32 (hd floats, room for 2 hd)
    float* scores = kbuf + 2 * hd;         // [n_rep][block]
    float* acc = scores + n_rep * n_cells;  // [n_rep][hd]
    float* m = acc + n_rep * hd;
    float* l = m + n_rep;

    const int64_t n_q = a.n_head * hd;
    const float* q0 = a.q + t * n_q + hkv * n_rep * hd;
    float* out0 = a.out + t * n_q + hkv * n_rep * hd;

    for (int64_t r = 0; r < n_rep; ++r) {
        m[r] = -std::numeric_limits<float>::infinity();
        l[r] = 0.0f;
    }
    std::fill(acc, acc + n_rep * hd, 0.0f);

    int64_t c = 0;
    while (c < end) {
        // Pass 1: scores of the next `block` visible cells.
        const int64_t c0 = c;
        int64_t n = 0;
        for (; c < end && n < block; ++c) {
            if (c + kPrefetchCells < end) prefetch_row(kv.k_row(a.layer, c + kPrefetchCells) + k_off, k_bytes);
            if (!(cell_seq[c] & mask) || cell_pos[c] > p) continue;
            const uint8_t* krow = kv.k_row(a.layer, c) + k_off;
            for (int64_t i = 0; i < nv; ++i)
                _mm512_storeu_ps(kbuf + 16 * i, load16<TK>(krow, 16 * i, i + 1 < nv ? 0xFFFF : tail));
            for (int64_t r = 0; r < n_rep; ++r) {
                const float* qr = q0 + r * hd;
                __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
                int64_t i = 0;
                for (; i + 2 <= nv; i += 2) {
                    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(kbuf + 16 * i),
                                         _mm512_maskz_loadu_ps(i + 1 < nv ? 0xFFFF : tail, qr + 16 * i), s0);
                    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(kbuf + 16 * i + 16),
                                         _mm512_maskz_loadu_ps(i + 2 < nv ? 0xFFFF : tail, qr + 16 * i + 16), s1);
                }
                if (i < nv) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(kbuf + 16 * i), _mm512_maskz_loadu_ps(tail, qr + 16 * i), s0);
                scores[r * block + n] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) * a.scale;
            }
            ++n;
        }
        if (n == 0) break;
        // Softmax step: new maxima, rescale what was accumulated, p = exp(s - m), l += sum p.
        for (int64_t r = 0; r < n_rep; ++r) {
            float* sr = scores + r * block;
            __m512 mx = _mm512_set1_ps(m[r]);
            int64_t j = 0;
            for (; j + 16 <= n; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sr + j));
            float mnew = _mm512_reduce_max_ps(mx);
            for (; j < n; ++j) mnew = std::max(mnew, sr[j]);
            const float corr = std::exp(m[r] - mnew);  // 0 on the first block
            if (corr != 1.0f) {
                l[r] *= corr;
                const __m512 cv = _mm512_set1_ps(corr);
                for (int64_t i = 0; i < nv; ++i) {
                    const __mmask16 mk = i + 1 < nv ? 0xFFFF : tail;
                    _mm512_mask_storeu_ps(acc + r * hd + 16 * i, mk,
                                          _mm512_mul_ps(cv, _mm512_maskz_loadu_ps(mk, acc + r * hd + 16 * i)));
                }
            }
            m[r] = mnew;
            const __m512 mv = _mm512_set1_ps(mnew);
            __m512 sum = _mm512_setzero_ps();
            for (j = 0; j < n; j += 16) {
                const __mmask16 mk = j + 16 <= n ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
                const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sr + j), mv));
                _mm512_mask_storeu_ps(sr + j, mk, e);
                sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mk, e));
            }
            l[r] += _mm512_reduce_add_ps(sum);
        }
        // Pass 2: acc += p V over the same cells, 16 dimensions x up to kHeadGroup heads at a time.
        for (int64_t i = 0; i < nv; ++i) {
            const __mmask16 mk = i + 1 < nv ? 0xFFFF : tail;
            for (int64_t r0 = 0; r0 < n_rep; r0 += kHeadGroup) {
                float* ar = acc + r0 * hd + 16 * i;
                const float* pr = scores + r0 * block;
                switch (std::min<int64_t>(kHeadGroup, n_rep - r0)) {
                    case 1: accumulate_pv<TV, 1>(kv, a.layer, v_off, v_bytes, mask, p, c0, c, i, hd, mk, pr, block, ar); break;
                    case 2: accumulate_pv<TV, 2>(kv, a.layer, v_off, v_bytes, mask, p, c0, c, i, hd, mk, pr, block, ar); break;
                    case 3: accumulate_pv<TV, 3>(kv, a.layer, v_off, v_bytes, mask, p, c0, c, i, hd, mk, pr, block, ar); break;
                    case 4: accumulate_pv<TV, 4>(kv, a.layer, v_off, v_bytes, mask, p, c0, c, i, hd, mk, pr, block, ar); break;
                    case 5: accumulate_pv<TV, 5>(kv, a.layer, v_off, v_bytes, mask, p, c0, c, i, hd, mk, pr, block, ar); break;
                    case 6: accumulate_pv<TV, 6>(kv, a.layer, v_off, v_bytes, mask, p, c0, c, i, hd, mk, pr, block, ar); break;
                    case 7: accumulate_pv<TV, 7>(kv, a.layer, v_off, v_bytes, mask, p, c0, c, i, hd, mk, pr, block, ar); break;
                    default: accumulate_pv<TV, 8>(kv, a.layer, v_off, v_bytes, mask, p, c0, c, i, hd, mk, pr, block, ar); break;
                }
            }
        }
    }
    for (int64_t r = 0; r < n_rep; ++r) {
        const __m512 inv = _mm512_set1_ps(l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
        for (int64_t i = 0; i < nv; ++i) {
            const __mmask16 mk = i + 1 < nv ? 0xFFFF : tail;
            _mm512_mask_storeu_ps(out0 + r * hd + 16 * i, mk, _mm512_mul_ps(inv, _mm512_maskz_loadu_ps(mk, acc + r * hd + 16 * i)));
        }
    }
}

}  // namespace

void attention_group(const AttentionArgs& a, int64_t t, int64_t hkv, float* scratch) {
    if (active_cpu_path() == CpuPath::AVX512) {
        const KvCacheParams& kp = a.kv->params();
        const bool kf = kp.type_k == TYPE_F16, vf = kp.type_v == TYPE_F16;
        if (kf && vf) return attention_group_avx512<TYPE_F16, TYPE_F16>(a, t, hkv, scratch);
        if (kf) return attention_group_avx512<TYPE_F16, TYPE_Q8_0>(a, t, hkv, scratch);
        if (vf) return attention_group_avx512<TYPE_Q8_0, TYPE_F16>(a, t, hkv, scratch);
        return attention_group_avx512<TYPE_Q8_0, TYPE_Q8_0>(a, t, hkv, scratch);
    }
    attention_group_scalar(a, t, hkv, scratch);
}

}  // namespace bonsai::cpu
