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
// The AVX-512 path (taken when the active CPU path is avx512) reads the kv head's panels of the
// cache (kv_cache.h: one head's cells contiguous, so each pass is one stream the hardware
// prefetchers follow) with vector conversions, in blocks of cells (all of them for the
// score-buffer variant, kFlashBlock for flash; online softmax at block granularity, so K and V of
// a block are read while they are in cache). Scores and p are kept by cell, so a cell the token
// does not see gets score -inf and p 0. Pass 1 over an F16 K panel, whose tiles hold one dimension
// of 16 cells in 16 adjacent halves: per dimension one load, and one FMA per query head with that
// head's element broadcast, gives 16 cells' partial scores; no reduction and no transposition,
// 32 FMAs per cell for 8 heads of 64 dimensions, which is all the work. (Over the cache's former
// row layout, where pass 1 converted rows to f32, broadcast four dimensions to the four 128-bit
// lanes and reduced four-lane partial sums, and pass 2 read 16 dimensions a pass, a decode token's
// call took 1.41x the time in cache on one thread, 1.48x on two, 1.44x on two with the caches
// flushed before each token: Zen 4, 8 layers of 4 kv heads x 8 query heads x 64 dimensions, 576
// cells.) Pass 1 over a Q8_0 K panel keeps that
// row method. Softmax with a vector exp. Pass 2: out += p V, 32 dimensions (two adjacent chunks
// of 16: whole cache lines) at a time with up to 8 heads' accumulators in registers, so each V
// chunk is converted once per 8 heads. When every cell of a block is visible (the usual decode
// case) pass 2 tests no cell's position or sequence.
//
// Scratch per call (floats), attention_group_scratch_floats: n_rep * n_cells (scores) + n_rep *
//   head_dim (accumulators) + 2 * n_rep (running maxima and normalisers) + the AVX-512 Q8_0 K
//   pass 1's K rows (kCellGroup rows of 16-float chunks) and arranged queries. The scalar path puts its K
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
    const uint8_t* v_panel = kv.v_panel(a.layer, hkv);
    const size_t v_bytes = kv.v_head_bytes();
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
            kv.k_head_floats(a.layer, c, hkv, krow);
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
            dequantize_row(kp.type_v, v_panel + c * v_bytes, vrow, hd);
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
        kv.k_head_floats(a.layer, c, hkv, krow);
        dequantize_row(kp.type_v, v_panel + c * v_bytes, vrow, hd);
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
constexpr int64_t kPrefetchCells = 16; // Q8_0 K rows prefetched this many cells ahead
constexpr int kCellGroup = 8;        // cells whose scores the Q8_0 K pass 1 computes together

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

// Where a kv head's cells live in one layer of the cache (its panels, kv_cache.h) and which of
// them token t sees.
struct CellRange {
    const uint8_t* k0;  // this kv head's K panel: F16 tiles (tiled) or rows k_stride apart
    const uint8_t* v0;  // its V panel: cell c's row at v0 + c * v_stride
    size_t k_stride, v_stride;  // bytes of one cell's row (= of a slice)
    int64_t n_cells;
    const uint64_t* cell_seq;
    const int32_t* cell_pos;
    uint64_t mask;
    int32_t pos;
    bool visible(int64_t c) const { return (cell_seq[c] & mask) && cell_pos[c] <= pos; }
    // Bit i: cell c + i is visible, for the n <= 16 cells from c.
    __mmask16 visible16(int64_t c, int64_t n) const {
        unsigned bits = 0;
        for (int64_t i = 0; i < n; ++i) bits |= static_cast<unsigned>(visible(c + i)) << i;
        return static_cast<__mmask16>(bits);
    }
};

// Lane 4 h + e of the result = the sum of lanes 4 h .. 4 h + 3 of a[e]: four 4-lane sums per
// vector, transposed (6 instructions for 16 sums).
BONSAI_AVX512 inline __m512 reduce4x4(const __m512* a) {
    const __m512 u = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    const __m512 v = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    const __m512d ud = _mm512_castps_pd(u), vd = _mm512_castps_pd(v);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ud, vd)), _mm512_castpd_ps(_mm512_unpackhi_pd(ud, vd)));
}

// acc + *p * v, with *p broadcast by the FMA itself (an embedded-broadcast memory operand). Written
// out because GCC loads a value two FMAs share once, with a broadcast that on Zen 4 takes a slot of
// the FP pipes the FMAs need (with pass 2 in chunk pairs, a decode call took 1.07x the time in
// cache on one thread).
BONSAI_AVX512 inline __m512 fmadd_bcast(const float* p, __m512 v, __m512 acc) {
    __asm__("vfmadd231ps %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(*p), "v"(v));
    return acc;
}

// --- Pass 1 over an F16 K panel (tiles of 16 cells, dimension-major within a tile) ---

// Scores of NT consecutive tiles from tile t for NR query heads (q: the first one's head_dim
// floats, the next hd further): dimension d of a tile's cells is one 16-lane load, multiplied by
// each head's q[d] (broadcast) into one accumulator per (tile, head), so no reduction is needed.
// NT > 1 for few heads keeps NT * NR independent FMA chains in flight. Lane i of tile t is cell
// 16 t + i; it is stored at out[h * block + 16 (t - t0) + i] for the cells below c1 (and in the
// panel), scaled by sv.
template <int NR, int NT>
BONSAI_AVX512 void score_tiles(const uint16_t* panel, int64_t n_cells, int64_t t, int64_t c1, int64_t hd,
                               const float* q, __m512 sv, float* out, int64_t block) {
    constexpr int64_t T = KvCache::kKTile;
    __m512 acc[NT][NR];
    const uint16_t* tile[NT];
    int64_t w[NT];
    __mmask16 lanes[NT];
#pragma GCC unroll 4
    for (int u = 0; u < NT; ++u) {
        const int64_t c = (t + u) * T;
        tile[u] = panel + c * hd;
        w[u] = std::min(T, n_cells - c);
        const int64_t n = std::max<int64_t>(0, std::min(w[u], c1 - c));
        lanes[u] = static_cast<__mmask16>((1u << n) - 1);
#pragma GCC unroll 8
        for (int h = 0; h < NR; ++h) acc[u][h] = _mm512_setzero_ps();
    }
    for (int64_t d = 0; d < hd; ++d) {
#pragma GCC unroll 4
        for (int u = 0; u < NT; ++u) {
            // the full-tile case reads 16 halves; a last partial tile of w cells is w halves apart
            const __m512 k = _mm512_cvtph_ps(w[u] == T ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile[u] + d * T))
                                                       : _mm256_maskz_loadu_epi16(lanes[u], tile[u] + d * w[u]));
#pragma GCC unroll 8
            for (int h = 0; h < NR; ++h) acc[u][h] = fmadd_bcast(q + h * hd + d, k, acc[u][h]);
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < NT; ++u)
#pragma GCC unroll 8
        for (int h = 0; h < NR; ++h) _mm512_mask_storeu_ps(out + h * block + u * T, lanes[u], _mm512_mul_ps(acc[u][h], sv));
}

// The tiles of cells [c0, c1) (c0 a multiple of 16) for NR heads: NT tiles at a time, then one.
template <int NR>
BONSAI_AVX512 void score_tiles_heads(const CellRange& cr, int64_t c0, int64_t c1, int64_t hd, const float* q, __m512 sv,
                                     float* out, int64_t block) {
    constexpr int64_t T = KvCache::kKTile;
    constexpr int NT = NR >= 5 ? 1 : NR >= 3 ? 2 : 4;
    const uint16_t* panel = reinterpret_cast<const uint16_t*>(cr.k0);
    const int64_t t0 = c0 / T, t1 = (c1 + T - 1) / T;
    int64_t t = t0;
    for (; t + NT <= t1; t += NT) score_tiles<NR, NT>(panel, cr.n_cells, t, c1, hd, q, sv, out + (t - t0) * T, block);
    for (; t < t1; ++t) score_tiles<NR, 1>(panel, cr.n_cells, t, c1, hd, q, sv, out + (t - t0) * T, block);
}

// Pass 1, F16 K: scores[r * block + c - c0] = q_r . K[c] * scale for every cell of [c0, c1) and the
// n_rep heads of the group, up to 8 heads at a time.
BONSAI_AVX512 void scores_tiled(const CellRange& cr, int64_t c0, int64_t c1, const float* q0, int64_t n_rep, int64_t hd,
                                float scale, int64_t block, float* scores) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t r0 = 0; r0 < n_rep; r0 += 8) {
        const float* q = q0 + r0 * hd;
        float* out = scores + r0 * block;
        switch (std::min<int64_t>(8, n_rep - r0)) {
            case 1: score_tiles_heads<1>(cr, c0, c1, hd, q, sv, out, block); break;
            case 2: score_tiles_heads<2>(cr, c0, c1, hd, q, sv, out, block); break;
            case 3: score_tiles_heads<3>(cr, c0, c1, hd, q, sv, out, block); break;
            case 4: score_tiles_heads<4>(cr, c0, c1, hd, q, sv, out, block); break;
            case 5: score_tiles_heads<5>(cr, c0, c1, hd, q, sv, out, block); break;
            case 6: score_tiles_heads<6>(cr, c0, c1, hd, q, sv, out, block); break;
            case 7: score_tiles_heads<7>(cr, c0, c1, hd, q, sv, out, block); break;
            default: score_tiles_heads<8>(cr, c0, c1, hd, q, sv, out, block); break;
        }
    }
}

// --- Pass 1 over a Q8_0 K panel (rows of head_dim elements) ---

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

// Pass 1, Q8_0 K, over [c0, c1): scores[r * block + c - c0] = q_r . K[c] * scale for the n_rep
// heads of the group (qt: arrange_queries), kCellGroup cells at a time: their K rows converted to
// f32 into kf (rows of 16 nv floats, zero past hd), then score_cells for two groups of four heads
// at a time. The K and V rows kPrefetchCells ahead are prefetched (pass 2 reads V next).
BONSAI_AVX512 void scores_rows(const CellRange& cr, int64_t c0, int64_t c1, const float* qt, int64_t n_rep,
                               int64_t hd, float scale, int64_t block, float* kf, float* scores) {
    const int64_t nv = (hd + 15) / 16, ks = 16 * nv, hs = (hd + 3) / 4;
    const __mmask16 tail = hd % 16 ? static_cast<__mmask16>((1u << (hd % 16)) - 1) : static_cast<__mmask16>(0xFFFF);
    const __m512 sv = _mm512_set1_ps(scale);
    int e = 0;
    int64_t j = 0;
    for (int64_t c = c0; c < c1; ++c) {
        if (c + kPrefetchCells < c1) {
            prefetch_row(cr.k0 + (c + kPrefetchCells) * cr.k_stride, cr.k_stride);
            prefetch_row(cr.v0 + (c + kPrefetchCells) * cr.v_stride, cr.v_stride);
        }
        const uint8_t* krow = cr.k0 + c * cr.k_stride;
        for (int64_t i = 0; i < nv; ++i)
            _mm512_storeu_ps(kf + e * ks + 16 * i, load16<TYPE_Q8_0>(krow, 16 * i, i + 1 < nv ? 0xFFFF : tail));
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

// ar[h * hd + 16 (i + u) + (0..16)] += sum over the visible cells c of [c0, c1) of
// pr[h * block + c - c0] * V[c][16 (i + u) ..] for NR heads and the NI 16-dimension chunks u from i
// (the last chunk of the head masked by tail); the NR * NI accumulators stay in registers, and the
// chunks of one pass are adjacent in each V row, so a pass reads whole lines. ALL: every cell of
// the range is visible (the usual decode case), so no cell is tested.
template <GgmlType TV, int NR, int NI, bool ALL>
BONSAI_AVX512 void accumulate_pv(const CellRange& cr, int64_t c0, int64_t c1, int64_t i, int64_t nv, __mmask16 tail,
                                 int64_t hd, const float* pr, int64_t block, float* ar) {
    __m512 av[NI][NR];
    __mmask16 mk[NI];
#pragma GCC unroll 2
    for (int u = 0; u < NI; ++u) {
        mk[u] = i + u + 1 < nv ? static_cast<__mmask16>(0xFFFF) : tail;
#pragma GCC unroll 8
        for (int h = 0; h < NR; ++h) av[u][h] = _mm512_maskz_loadu_ps(mk[u], ar + h * hd + 16 * (i + u));
    }
    const uint8_t* vrow = cr.v0 + c0 * cr.v_stride;
    const float* pj = pr;
    for (int64_t cc = c0; cc < c1; ++cc, vrow += cr.v_stride, ++pj) {
        if (!ALL && !cr.visible(cc)) continue;
        __m512 v[NI];
#pragma GCC unroll 2
        for (int u = 0; u < NI; ++u) v[u] = load16<TV>(vrow, 16 * (i + u), mk[u]);
#pragma GCC unroll 8
        for (int h = 0; h < NR; ++h)
#pragma GCC unroll 2
            for (int u = 0; u < NI; ++u) av[u][h] = fmadd_bcast(pj + h * block, v[u], av[u][h]);
    }
#pragma GCC unroll 2
    for (int u = 0; u < NI; ++u)
#pragma GCC unroll 8
        for (int h = 0; h < NR; ++h) _mm512_mask_storeu_ps(ar + h * hd + 16 * (i + u), mk[u], av[u][h]);
}

// Pass 2 for NR heads: every chunk of the head, two at a time.
template <GgmlType TV, int NR, bool ALL>
BONSAI_AVX512 void accumulate_pv_chunks(const CellRange& cr, int64_t c0, int64_t c1, int64_t nv, __mmask16 tail,
                                        int64_t hd, const float* pr, int64_t block, float* ar) {
    int64_t i = 0;
    for (; i + 2 <= nv; i += 2) accumulate_pv<TV, NR, 2, ALL>(cr, c0, c1, i, nv, tail, hd, pr, block, ar);
    if (i < nv) accumulate_pv<TV, NR, 1, ALL>(cr, c0, c1, i, nv, tail, hd, pr, block, ar);
}

template <GgmlType TV, bool ALL>
BONSAI_AVX512 void accumulate_pv_heads(const CellRange& cr, int64_t c0, int64_t c1, int64_t nv, __mmask16 tail,
                                       int64_t hd, const float* pr, int64_t block, float* ar, int64_t nr) {
    switch (nr) {
        case 1: return accumulate_pv_chunks<TV, 1, ALL>(cr, c0, c1, nv, tail, hd, pr, block, ar);
        case 2: return accumulate_pv_chunks<TV, 2, ALL>(cr, c0, c1, nv, tail, hd, pr, block, ar);
        case 3: return accumulate_pv_chunks<TV, 3, ALL>(cr, c0, c1, nv, tail, hd, pr, block, ar);
        case 4: return accumulate_pv_chunks<TV, 4, ALL>(cr, c0, c1, nv, tail, hd, pr, block, ar);
        case 5: return accumulate_pv_chunks<TV, 5, ALL>(cr, c0, c1, nv, tail, hd, pr, block, ar);
        case 6: return accumulate_pv_chunks<TV, 6, ALL>(cr, c0, c1, nv, tail, hd, pr, block, ar);
        case 7: return accumulate_pv_chunks<TV, 7, ALL>(cr, c0, c1, nv, tail, hd, pr, block, ar);
        default: return accumulate_pv_chunks<TV, 8, ALL>(cr, c0, c1, nv, tail, hd, pr, block, ar);
    }
}

template <GgmlType TK, GgmlType TV>
BONSAI_AVX512 void attention_group_avx512(const AttentionArgs& a, int64_t t, int64_t hkv, float* scratch) {
    const KvCache& kv = *a.kv;
    const int64_t hd = a.head_dim, n_rep = a.n_head / a.n_head_kv, n_cells = kv.n_cells();
    const CellRange cr{kv.k_panel(a.layer, hkv), kv.v_panel(a.layer, hkv), kv.k_head_bytes(), kv.v_head_bytes(), n_cells,
                       kv.cell_seq_data(), kv.cell_pos_data(), a.seq_mask[t], a.pos[t]};
    const int64_t end = kv.used_end();
    const int64_t nv = (hd + 15) / 16;
    const __mmask16 tail = hd % 16 ? static_cast<__mmask16>((1u << (hd % 16)) - 1) : static_cast<__mmask16>(0xFFFF);
    // Blocks of cells start at multiples of `block`, 64 or (one block) n_cells, so at a tile of
    // the F16 K panel.
    const int64_t block = a.flash ? std::min(kFlashBlock, n_cells) : n_cells;
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();

    float* scores = scratch;                // [n_rep][block], cell c of the block at c - c0
    float* acc = scores + n_rep * n_cells;  // [n_rep][hd]
    float* m = acc + n_rep * hd;
    float* l = m + n_rep;
    float* kf = l + n_rep;                  // kCellGroup K rows as f32, 16 nv floats each
    float* qt = kf + kCellGroup * 16 * nv;  // the queries, arrange_queries

    const int64_t n_q = a.n_head * hd;
    const float* q0 = a.q + t * n_q + hkv * n_rep * hd;
    float* out0 = a.out + t * n_q + hkv * n_rep * hd;
    if constexpr (TK != TYPE_F16) arrange_queries(q0, n_rep, hd, qt);

    for (int64_t r = 0; r < n_rep; ++r) {
        m[r] = kNegInf;
        l[r] = 0.0f;
    }
    std::fill(acc, acc + n_rep * hd, 0.0f);

    for (int64_t c0 = 0; c0 < end; c0 += block) {
        // The passes stop after the last visible cell of the block: a causal prompt's token sees a
        // prefix of the cells, so its block is usually all visible (the fast path).
        int64_t n = 0, last = c0;
        for (int64_t c = c0; c < std::min(end, c0 + block); ++c)
            if (cr.visible(c)) {
                ++n;
                last = c;
            }
        if (n == 0) continue;
        const int64_t c1 = last + 1, nc = c1 - c0;
        const bool all = n == nc;
        // Pass 1: scores of every cell of [c0, c1); those the token does not see are set to -inf,
        // so they take no part in the maximum, and their p to 0 below.
        if constexpr (TK == TYPE_F16) scores_tiled(cr, c0, c1, q0, n_rep, hd, a.scale, block, scores);
        else scores_rows(cr, c0, c1, qt, n_rep, hd, a.scale, block, kf, scores);
        if (!all) {
            for (int64_t c = c0; c < c1; ++c)
                if (!cr.visible(c))
                    for (int64_t r = 0; r < n_rep; ++r) scores[r * block + c - c0] = kNegInf;
        }
        // Softmax step: new maxima, rescale what was accumulated, p = exp(s - m), l += sum p.
        for (int64_t r = 0; r < n_rep; ++r) {
            float* sr = scores + r * block;
            __m512 mx = _mm512_set1_ps(m[r]);
            int64_t j = 0;
            for (; j + 16 <= nc; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sr + j));
            float mnew = _mm512_reduce_max_ps(mx);
            for (; j < nc; ++j) mnew = std::max(mnew, sr[j]);
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
            for (j = 0; j < nc; j += 16) {
                __mmask16 mk = j + 16 <= nc ? 0xFFFF : static_cast<__mmask16>((1u << (nc - j)) - 1);
                if (!all) mk &= cr.visible16(c0 + j, std::min<int64_t>(16, nc - j));  // exp512(-inf) is not 0
                const __m512 e = _mm512_maskz_mov_ps(mk, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sr + j), mv)));
                _mm512_mask_storeu_ps(sr + j, j + 16 <= nc ? 0xFFFF : static_cast<__mmask16>((1u << (nc - j)) - 1), e);
                sum = _mm512_add_ps(sum, e);
            }
            l[r] += _mm512_reduce_add_ps(sum);
        }
        // Pass 2: acc += p V over the same cells, 32 dimensions x up to kHeadGroup heads at a time.
        for (int64_t r0 = 0; r0 < n_rep; r0 += kHeadGroup) {
            const int64_t nr = std::min<int64_t>(kHeadGroup, n_rep - r0);
            float* ar = acc + r0 * hd;
            const float* pr = scores + r0 * block;
            if (all) accumulate_pv_heads<TV, true>(cr, c0, c1, nv, tail, hd, pr, block, ar, nr);
            else accumulate_pv_heads<TV, false>(cr, c0, c1, nv, tail, hd, pr, block, ar, nr);
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
