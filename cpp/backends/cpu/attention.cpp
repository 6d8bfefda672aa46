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
// directly with vector conversions, in blocks of visible cells (all of them for the score-buffer
// variant, kFlashBlock for flash; online softmax at block granularity, so K and V of a block are
// read while they are in cache). Pass 1: the query heads are arranged once per call four to a
// vector (lane 4 h + d: head h, dimension d of a 4-dimension step); the K rows of kCellGroup
// visible cells are converted to f32, and each step's four dimensions of a cell, broadcast to the
// four 128-bit lanes, multiply the step's query vector, so one FMA serves four heads and a 4-lane
// transposed reduction (6 instructions per 16 scores) finishes the dot products; the scores are
// stored four cells at a time into the [head][cell] rows. (It replaced 16-lane partial products
// per (cell, head) pair, a 16-way transposed reduction and a scatter: 1.4x to 1.5x faster on
// Zen 4, one thread over 576 to 2048 cells in cache.) The V rows of the block are prefetched here
// as well. Softmax with a vector exp. Pass 2: out += p V, 16 dimensions at a time with up to 8
// heads' accumulators in registers, so each V chunk is converted once per 8 heads. When every cell
// of a block is visible (the usual decode case) neither pass tests the cells' positions and
// sequences.
//
// Scratch per call (floats), attention_group_scratch_floats: n_rep * n_cells (scores) + n_rep *
//   head_dim (accumulators) + 2 * n_rep (running maxima and normalisers) + the AVX-512 pass 1's
//   K rows (kCellGroup rows of 16-float chunks) and arranged queries. The scalar path puts its K
//   and V rows (2 * head_dim, fewer floats than those two) first.
#include <algorithm>
#include <cmath>
#include <limits>

#include "../../src/layers.h"
#include "block_unpack.h"
#include "bonsai/ops.h"
#include "bonsai/quants.h"
#include "layers_cpu.h"
#include "prefetch.h"
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
constexpr int kCellGroup = 8;        // visible cells whose scores pass 1 computes together

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

// Prefetches every cache line that holds a byte of [row, row + n) (n > 0): the lines at 64-byte
// steps from row, then the line of the last byte. Into L2 (prefetch.h).
BONSAI_AVX512 inline void prefetch_row(const uint8_t* row, size_t n) {
    for (size_t o = 0; o < n; o += 64) _mm_prefetch(reinterpret_cast<const char*>(row + o), kStreamPrefetchHint);
    _mm_prefetch(reinterpret_cast<const char*>(row + n - 1), kStreamPrefetchHint);
}

// Where a kv head's cells live in one layer of the cache and which of them token t sees.
struct CellRange {
    const uint8_t* k0;  // this kv head's K slice of cell 0; cell c's is at k0 + c * k_stride
    const uint8_t* v0;
    size_t k_stride, v_stride;
    size_t k_bytes, v_bytes;  // bytes of a slice
    const uint64_t* cell_seq;
    const int32_t* cell_pos;
    uint64_t mask;
    int32_t pos;
    bool visible(int64_t c) const { return (cell_seq[c] & mask) && cell_pos[c] <= pos; }
};

// Lane 4 h + e of the result = the sum of lanes 4 h .. 4 h + 3 of a[e]: four 4-lane sums per
// vector, transposed (6 instructions for 16 sums).
BONSAI_AVX512 inline __m512 reduce4x4(const __m512* a) {
    const __m512 u = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    const __m512 v = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    const __m512d ud = _mm512_castps_pd(u), vd = _mm512_castps_pd(v);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ud, vd)), _mm512_castpd_ps(_mm512_unpackhi_pd(ud, vd)));
}

// The query heads of a group, four to a vector step by step: qt[(g hs + m) 16 + 4 h + d] =
// q[4 g + h][4 m + d] for the hs = ceil(hd / 4) steps m, zero past n_rep heads and hd dimensions.
BONSAI_AVX512 void arrange_queries(const float* q0, int64_t n_rep, int64_t hd, float* qt) {
    const int64_t hs = (hd + 3) / 4, n_groups = (n_rep + 3) / 4;
    for (int64_t g = 0; g < n_groups; ++g)
        for (int64_t m = 0; m < hs; ++m)
            for (int64_t h = 0; h < 4; ++h)
                for (int64_t d = 0; d < 4; ++d) {
                    const int64_t r = 4 * g + h, i = 4 * m + d;
                    qt[(g * hs + m) * 16 + 4 * h + d] = r < n_rep && i < hd ? q0[r * hd + i] : 0.0f;
                }
}

// Scores of kCellGroup cells (K rows as f32 at kf, kstride apart) for the heads of GB groups of
// four from group g0: step m multiplies the cells' dimensions 4 m .. 4 m + 3, broadcast to the
// four 128-bit lanes, with the step's query vector (lane 4 h + d: head h, dimension 4 m + d), so
// lane 4 h + d of acc[g][e] sums head h's products over the dimensions = d mod 4; reduce4x4
// finishes the sums of four cells at a time. Scaled by sv and stored, cells [0, count) of each
// head, at scores[r * block + j].
template <int GB>
BONSAI_AVX512 void score_cells(const float* kf, int64_t kstride, const float* qt, int64_t hs, int64_t g0,
                               int64_t n_rep, __m512 sv, int count, int64_t block, int64_t j, float* scores) {
    constexpr int NC = kCellGroup;
    __m512 acc[GB][NC];
    for (int g = 0; g < GB; ++g)
        for (int e = 0; e < NC; ++e) acc[g][e] = _mm512_setzero_ps();
    const float* qg = qt + g0 * hs * 16;
    for (int64_t m = 0; m < hs; ++m) {
        __m512 kb[NC];
        for (int e = 0; e < NC; ++e) kb[e] = _mm512_broadcast_f32x4(_mm_loadu_ps(kf + e * kstride + 4 * m));
        for (int g = 0; g < GB; ++g) {
            __m512 qv = _mm512_loadu_ps(qg + (g * hs + m) * 16);
            // one load per step: without this GCC folds the load into each FMA, and the repeated
            // loads, not the FMAs, bound the loop on Zen 4
            __asm__("" : "+v"(qv));
            for (int e = 0; e < NC; ++e) acc[g][e] = _mm512_fmadd_ps(qv, kb[e], acc[g][e]);
        }
    }
    for (int g = 0; g < GB; ++g) {
        const int64_t h0 = 4 * (g0 + g);
        for (int e0 = 0; e0 < NC && e0 < count; e0 += 4) {
            const __mmask8 mc = static_cast<__mmask8>((1u << std::min(4, count - e0)) - 1);
            const __m512 r = _mm512_mul_ps(reduce4x4(acc[g] + e0), sv);
            const __m128 lanes[4] = {_mm512_castps512_ps128(r), _mm512_extractf32x4_ps(r, 1),
                                     _mm512_extractf32x4_ps(r, 2), _mm512_extractf32x4_ps(r, 3)};
            for (int64_t h = 0; h < 4 && h0 + h < n_rep; ++h)
                _mm_mask_storeu_ps(scores + (h0 + h) * block + j + e0, mc, lanes[h]);
        }
    }
}

// score_cells for every group of four heads, two groups at a time. (A function, not a lambda: GCC
// does not give a lambda the target attribute of the function it is written in, so on a host
// without AVX-512 it would not compile.)
BONSAI_AVX512 void score_groups(const float* kf, int64_t kstride, const float* qt, int64_t hs, int64_t n_rep,
                                __m512 sv, int count, int64_t block, int64_t j, float* scores) {
    const int64_t n_groups = (n_rep + 3) / 4;
    int64_t g = 0;
    for (; g + 2 <= n_groups; g += 2) score_cells<2>(kf, kstride, qt, hs, g, n_rep, sv, count, block, j, scores);
    if (g < n_groups) score_cells<1>(kf, kstride, qt, hs, g, n_rep, sv, count, block, j, scores);
}

// Pass 1 over [c0, c1): scores[r * block + j] = q_r . K[j-th visible cell] * scale for the n_rep
// heads of the group (qt: arrange_queries), kCellGroup visible cells at a time: their K rows converted
// to f32 into kf (rows of 16 nv floats, zero past hd), then score_cells for two groups of four heads
// at a time. The K and V rows kPrefetchCells ahead are prefetched (pass 2 reads V next). ALL: every
// cell of the range is visible (the usual decode case), so no cell is tested.
template <GgmlType TK, bool ALL>
BONSAI_AVX512 void scores_block(const CellRange& cr, int64_t c0, int64_t c1, const float* qt, int64_t n_rep,
                                int64_t hd, float scale, int64_t block, float* kf, float* scores) {
    const int64_t nv = (hd + 15) / 16, ks = 16 * nv, hs = (hd + 3) / 4;
    const __mmask16 tail = hd % 16 ? static_cast<__mmask16>((1u << (hd % 16)) - 1) : static_cast<__mmask16>(0xFFFF);
    const __m512 sv = _mm512_set1_ps(scale);
    int e = 0;
    int64_t j = 0;
    for (int64_t c = c0; c < c1; ++c) {
        if (c + kPrefetchCells < c1) {
            prefetch_row(cr.k0 + (c + kPrefetchCells) * cr.k_stride, cr.k_bytes);
            prefetch_row(cr.v0 + (c + kPrefetchCells) * cr.v_stride, cr.v_bytes);
        }
        if (!ALL && !cr.visible(c)) continue;
        const uint8_t* krow = cr.k0 + c * cr.k_stride;
        for (int64_t i = 0; i < nv; ++i)
            _mm512_storeu_ps(kf + e * ks + 16 * i, load16<TK>(krow, 16 * i, i + 1 < nv ? 0xFFFF : tail));
        if (++e == kCellGroup) {
            score_groups(kf, ks, qt, hs, n_rep, sv, kCellGroup, block, j, scores);
            j += kCellGroup;
            e = 0;
        }
    }
    if (e > 0) {
        std::fill(kf + e * ks, kf + kCellGroup * ks, 0.0f);
        score_groups(kf, ks, qt, hs, n_rep, sv, e, block, j, scores);
    }
}

// ar[h * hd + (0..16)] += sum over the visible cells of [c0, c1) of pr[h * block + j] * V[cell][16 i ..]
// for NR heads, j counting the visible cells; the accumulators stay in registers. ALL: as above.
template <GgmlType TV, int NR, bool ALL>
BONSAI_AVX512 void accumulate_pv(const CellRange& cr, int64_t c0, int64_t c1, int64_t i, int64_t hd, __mmask16 mk,
                                 const float* pr, int64_t block, float* ar) {
    __m512 av[NR];
#pragma GCC unroll 8
    for (int h = 0; h < NR; ++h) av[h] = _mm512_maskz_loadu_ps(mk, ar + h * hd);
    const uint8_t* vrow = cr.v0 + c0 * cr.v_stride;
    const float* pj = pr;
    for (int64_t cc = c0; cc < c1; ++cc, vrow += cr.v_stride) {
        if (!ALL && !cr.visible(cc)) continue;
        const __m512 v = load16<TV>(vrow, 16 * i, mk);
#pragma GCC unroll 8
        for (int h = 0; h < NR; ++h) av[h] = _mm512_fmadd_ps(_mm512_set1_ps(pj[h * block]), v, av[h]);
        ++pj;
    }
#pragma GCC unroll 8
    for (int h = 0; h < NR; ++h) _mm512_mask_storeu_ps(ar + h * hd, mk, av[h]);
}

template <GgmlType TV, bool ALL>
BONSAI_AVX512 void accumulate_pv_heads(const CellRange& cr, int64_t c0, int64_t c1, int64_t i, int64_t hd,
                                       __mmask16 mk, const float* pr, int64_t block, float* ar, int64_t nr) {
    switch (nr) {
        case 1: return accumulate_pv<TV, 1, ALL>(cr, c0, c1, i, hd, mk, pr, block, ar);
        case 2: return accumulate_pv<TV, 2, ALL>(cr, c0, c1, i, hd, mk, pr, block, ar);
        case 3: return accumulate_pv<TV, 3, ALL>(cr, c0, c1, i, hd, mk, pr, block, ar);
        case 4: return accumulate_pv<TV, 4, ALL>(cr, c0, c1, i, hd, mk, pr, block, ar);
        case 5: return accumulate_pv<TV, 5, ALL>(cr, c0, c1, i, hd, mk, pr, block, ar);
        case 6: return accumulate_pv<TV, 6, ALL>(cr, c0, c1, i, hd, mk, pr, block, ar);
        case 7: return accumulate_pv<TV, 7, ALL>(cr, c0, c1, i, hd, mk, pr, block, ar);
        default: return accumulate_pv<TV, 8, ALL>(cr, c0, c1, i, hd, mk, pr, block, ar);
    }
}

template <GgmlType TK, GgmlType TV>
BONSAI_AVX512 void attention_group_avx512(const AttentionArgs& a, int64_t t, int64_t hkv, float* scratch) {
    const KvCache& kv = *a.kv;
    const int64_t hd = a.head_dim, n_rep = a.n_head / a.n_head_kv, n_cells = kv.n_cells();
    const KvCacheParams& kp = kv.params();
    const CellRange cr{kv.k_row(a.layer, 0) + type_row_bytes(kp.type_k, hkv * hd),
                       kv.v_row(a.layer, 0) + type_row_bytes(kp.type_v, hkv * hd),
                       kv.k_row_bytes(), kv.v_row_bytes(), type_row_bytes(kp.type_k, hd), type_row_bytes(kp.type_v, hd),
                       kv.cell_seq_data(), kv.cell_pos_data(), a.seq_mask[t], a.pos[t]};
    const int64_t end = kv.used_end();
    const int64_t nv = (hd + 15) / 16;
    const __mmask16 tail = hd % 16 ? static_cast<__mmask16>((1u << (hd % 16)) - 1) : static_cast<__mmask16>(0xFFFF);
    const int64_t block = a.flash ? std::min(kFlashBlock, n_cells) : n_cells;

    float* scores = scratch;                // [n_rep][block]
    float* acc = scores + n_rep * n_cells;  // [n_rep][hd]
    float* m = acc + n_rep * hd;
    float* l = m + n_rep;
    float* kf = l + n_rep;                  // kCellGroup K rows as f32, 16 nv floats each
    float* qt = kf + kCellGroup * 16 * nv;  // the queries, arrange_queries

    const int64_t n_q = a.n_head * hd;
    const float* q0 = a.q + t * n_q + hkv * n_rep * hd;
    float* out0 = a.out + t * n_q + hkv * n_rep * hd;
    arrange_queries(q0, n_rep, hd, qt);

    for (int64_t r = 0; r < n_rep; ++r) {
        m[r] = -std::numeric_limits<float>::infinity();
        l[r] = 0.0f;
    }
    std::fill(acc, acc + n_rep * hd, 0.0f);

    int64_t c = 0;
    while (c < end) {
        // Pass 1: scores of the next `block` visible cells, which end before cell c1.
        const int64_t c0 = c;
        int64_t c1 = c0, n = 0, last = c0;
        for (; c1 < end && n < block; ++c1)
            if (cr.visible(c1)) {
                ++n;
                last = c1;
            }
        c = c1;
        if (n == 0) continue;
        // The passes stop after the last visible cell: a causal prompt's token sees a prefix of the
        // cells, so its block is usually all visible (the fast path) instead of scanned to the end.
        c1 = last + 1;
        const bool all = n == c1 - c0;
        if (all) scores_block<TK, true>(cr, c0, c1, qt, n_rep, hd, a.scale, block, kf, scores);
        else scores_block<TK, false>(cr, c0, c1, qt, n_rep, hd, a.scale, block, kf, scores);
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
                const int64_t nr = std::min<int64_t>(kHeadGroup, n_rep - r0);
                float* ar = acc + r0 * hd + 16 * i;
                const float* pr = scores + r0 * block;
                if (all) accumulate_pv_heads<TV, true>(cr, c0, c1, i, hd, mk, pr, block, ar, nr);
                else accumulate_pv_heads<TV, false>(cr, c0, c1, i, hd, mk, pr, block, ar, nr);
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

size_t attention_group_scratch_floats(int64_t n_cells, int64_t n_rep, int64_t head_dim) {
    // the AVX-512 layout (attention_group_avx512), which holds the scalar one (2 hd + the same)
    const int64_t nv = (head_dim + 15) / 16, hs = (head_dim + 3) / 4, n_groups = (n_rep + 3) / 4;
    return static_cast<size_t>(n_rep * n_cells + n_rep * head_dim + 2 * n_rep + kCellGroup * 16 * nv +
                               16 * n_groups * hs);
}

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
