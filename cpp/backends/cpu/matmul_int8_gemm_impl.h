// AVX-512 VNNI multi-token INT8 matmul (a GEMM) kernel body, included by matmul_int8_gemm_avx512.cpp
// (base-3 bytes unpacked with 16-bit multiplies) and matmul_int8_gemm_avx512_vbmi.cpp (byte-table
// lookups, + AVX-512 VBMI); both give the same codes, hence the same results. The includer defines
// BONSAI_GEMM_TARGET (target attribute string), BONSAI_GEMM_TRIT_LUT (0 or 1) and BONSAI_GEMM_ENTRY.
//
// Layout. Rows are taken 32 at a time (a panel: two halves of 16 rows, one int32 lane per row). A
// row's unit (int8_layout.h: G blocks, 64 source bytes whose byte p gives code byte p of every code
// vector v) is loaded for the 16 rows of a half and transposed as 16 x 16 dwords, so that vector
// T[q] holds source dword q of every row; unpacking T[q] gives, for each code vector v, the codes
// of "quad" (v, q) — the 4 slots 4q..4q+3 of vector v — of the 16 rows, ready for vpdpbusd. Quads
// that are padding for every row (the scale and the bytes past a PTQ1_0/TQ1_0 block) are dropped;
// the live quads of a block are stored in (q, v) order, the two halves side by side, then the 32
// rows' scales as floats: the panel. It is built at run time, per call and per chunk of about
// 24 KiB (L1-resident), so the model file stays mapped as it is and no memory is added to the
// plan; the unpack + transpose is paid once per row and call and shared by every token.
// Activations: the quantizer's slot-ordered int8 (act_quant.h) are repacked once per call into
// token tiles of up to 6 tokens: per block, for each live quad the tile's dwords side by side,
// then off * asum of each token.
//
// Microkernel (32 rows x NT <= 6 tokens): per block, 2 x NT int32 accumulators take, for each
// quad, vpdpbusd(codes of 16 rows, activation dword of token t in every lane) (unsigned code x
// signed activation, exact; the dword comes from a 128-bit broadcast of 4 tokens and a vpshufd,
// shared by both halves); then acc = fma(d_b, float(isum - off * asum_b,t), acc) with the rows'
// scales d_b, block after block from block 0, and y = acc * s_t: the scalar kernel's exact
// operations per (row, token), so the results are bit-identical to it. Q8_0 codes are w + 128
// (off 128), so every type uses the unsigned x signed product.
// Threads take chunks of panels from a shared counter (and token tiles when there are fewer panels
// than threads).
#pragma once

// GCC 12 warns about the deliberately undefined pass-through operands inside its AVX-512 headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/types.h"
#include "matmul_int8_gemm.h"
#include "prefetch.h"
#include "repack.h"

#define BONSAI_GEMM __attribute__((target(BONSAI_GEMM_TARGET)))

namespace bonsai::cpu {

namespace {

constexpr int kHalfRows = 16;           // rows of a half panel (the int32 lanes of a zmm)
constexpr int kPanelRows = 32;          // rows of a panel: two halves
constexpr int kMaxTile = 6;             // tokens of a microkernel tile (2 x 2 x 6 zmm accumulators)
constexpr int64_t kChunkBytes = 24576;  // panel bytes unpacked at a time
constexpr int64_t kChunksPerThread = 8;  // work chunks per thread (dynamic hand-out)

}  // namespace
}  // namespace bonsai::cpu

#define BONSAI_UNPACK BONSAI_GEMM
#define BONSAI_UNPACK_LUT BONSAI_GEMM_TRIT_LUT
#include "unpack_avx512.h"

namespace bonsai::cpu {
namespace {


// Per type: G, C, block bytes, scale offset and off of int8_layout.h; kDSrc: offset of the scale in
// block g's 64 / G source bytes when load() reads it (-1: it does not); live(q, v): quad (v, q) of a
// block (q < 16 / G) holds a real element; load() reads a unit's 64 source bytes (never past the
// row's last block: more = another unit follows), codes() unpacks them.
struct GPtq1 {
    static constexpr int G = 2, C = 5, kBytes = 28, kDOff = 26, kOff = 1, kDSrc = 26;
    static constexpr bool live(int q, int v) { return q < 6 || (q == 6 && v < 4); }  // qs, then qh
    BONSAI_GEMM static __m512i load(const uint8_t* p, int nin, bool more) {
        if (more)
            return join256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kBytes)));
        const __mmask32 m = (1u << kBytes) - 1;
        return join256(_mm256_maskz_loadu_epi8(m, p),
                       nin > 1 ? _mm256_maskz_loadu_epi8(m, p + kBytes) : _mm256_setzero_si256());
    }
    BONSAI_GEMM static void codes(__m512i src, __m512i* c) { trits5(src, c); }
};

struct GTq1 {
    static constexpr int G = 1, C = 5, kBytes = 54, kDOff = 52, kOff = 1, kDSrc = 52;
    static constexpr bool live(int q, int v) { return q < 12 || (q == 12 && v < 4); }  // qs, then qh
    BONSAI_GEMM static __m512i load(const uint8_t* p, int, bool more) {
        if (more) return _mm512_loadu_si512(p);
        return _mm512_maskz_loadu_epi8((1ull << kBytes) - 1, p);
    }
    BONSAI_GEMM static void codes(__m512i src, __m512i* c) { trits5(src, c); }
};

struct GTq2 {
    static constexpr int G = 1, C = 4, kBytes = 66, kDOff = 64, kOff = 1, kDSrc = -1;
    static constexpr bool live(int, int) { return true; }
    BONSAI_GEMM static __m512i load(const uint8_t* p, int, bool) { return _mm512_loadu_si512(p); }
    BONSAI_GEMM static void codes(__m512i src, __m512i* c) { fields2(src, c); }
};

struct GQ2g64 {
    static constexpr int G = 4, C = 4, kBytes = 18, kDOff = 0, kOff = 1, kDSrc = -1;
    static constexpr bool live(int, int) { return true; }
    BONSAI_GEMM static __m512i load(const uint8_t* p, int nin, bool) { return load4x16(p, kBytes, nin); }
    BONSAI_GEMM static void codes(__m512i src, __m512i* c) { fields2(src, c); }
};

struct GQ2g128 {
    static constexpr int G = 2, C = 4, kBytes = 34, kDOff = 0, kOff = 1, kDSrc = -1;
    static constexpr bool live(int, int) { return true; }
    BONSAI_GEMM static __m512i load(const uint8_t* p, int nin, bool) { return load2x32(p, 2, kBytes, nin); }
    BONSAI_GEMM static void codes(__m512i src, __m512i* c) { fields2(src, c); }
};

struct GQ4 {
    static constexpr int G = 4, C = 2, kBytes = 18, kDOff = 0, kOff = 8, kDSrc = -1;
    static constexpr bool live(int, int) { return true; }
    BONSAI_GEMM static __m512i load(const uint8_t* p, int nin, bool) { return load4x16(p, kBytes, nin); }
    BONSAI_GEMM static void codes(__m512i src, __m512i* c) {
        const __m512i m4 = _mm512_set1_epi8(15);
        c[0] = _mm512_and_si512(src, m4);
        c[1] = _mm512_and_si512(_mm512_srli_epi16(src, 4), m4);
    }
};

struct GQ8 {
    static constexpr int G = 2, C = 1, kBytes = 34, kDOff = 0, kOff = 128, kDSrc = -1;
    static constexpr bool live(int, int) { return true; }
    BONSAI_GEMM static __m512i load(const uint8_t* p, int nin, bool) { return load2x32(p, 2, kBytes, nin); }
    BONSAI_GEMM static void codes(__m512i src, __m512i* c) {  // w + 128 as an unsigned byte
        c[0] = _mm512_xor_si512(src, _mm512_set1_epi8(static_cast<char>(0x80)));
    }
};

// Live quads of a block.
template <class K>
constexpr int block_quads() {
    int n = 0;
    for (int q = 0; q < 16 / K::G; ++q)
        for (int v = 0; v < K::C; ++v) n += K::live(q, v) ? 1 : 0;
    return n;
}

// In-place 16 x 16 transpose of dwords: afterwards r[q] lane i = old r[i] lane q.
BONSAI_GEMM inline void transpose16(__m512i* r) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // u[4i + k], chunk c: dword 4c + k of rows 4i..4i+3
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; ++k) {
        const __m512i a0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), a1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
        const __m512i b0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        const __m512i b1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
        r[k] = _mm512_shuffle_i32x4(a0, b0, 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(a0, b0, 0xDD);
        r[4 + k] = _mm512_shuffle_i32x4(a1, b1, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(a1, b1, 0xDD);
    }
}

// Unpacks unit uoff of 16 rows (rp, byte offsets vidx from rp[0]) into one half of the panel blocks
// at out: quad j of a block at out + 128 j, the 16 scales after the block's quads.
template <class K>
BONSAI_GEMM void unpack_unit(const uint8_t* const* rp, __m512i vidx, int64_t uoff, int nin, bool more, uint8_t* out) {
    constexpr int NQ = block_quads<K>(), QB = 16 / K::G;
    // the fp16 scale is read as a dword inside the block: the low half, or the high half of the
    // dword ending at the scale when the scale ends the block
    constexpr int kDPos = K::kDOff + 4 <= K::kBytes ? K::kDOff : K::kDOff - 2;
    __m512i s[16];
    for (int i = 0; i < 16; ++i) s[i] = K::load(rp[i] + uoff, nin, more);
    transpose16(s);
#pragma GCC unroll 4
    for (int g = 0; g < K::G; ++g) {
        if (g >= nin) break;
        uint8_t* o = out + g * (NQ + 1) * 128;
        int j = 0;
#pragma GCC unroll 16
        for (int q = 0; q < QB; ++q) {
            __m512i c[K::C];
            K::codes(s[g * QB + q], c);
#pragma GCC unroll 5
            for (int v = 0; v < K::C; ++v)
                if (K::live(q, v)) _mm512_store_si512(o + 128 * j++, c[v]);
        }
        __m512i d;
        if constexpr (K::kDSrc >= 0) {  // in the transposed source already: one dword per row
            d = _mm512_srli_epi32(s[g * QB + K::kDSrc / 4], 8 * (K::kDSrc % 4));
        } else {
            d = _mm512_i32gather_epi32(vidx, rp[0] + uoff + g * K::kBytes + kDPos, 1);
            if constexpr (kDPos != K::kDOff) d = _mm512_srli_epi32(d, 16);
        }
        _mm512_store_ps(o + 128 * NQ, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
    }
}

// s[h][t] += the products of quad j (half h's 16 rows x token t of the tile's activations A).
template <int NT>
BONSAI_GEMM inline void quad_products(__m512i (*s)[NT], const uint8_t* P, const int32_t* A, int j) {
    const __m512i w0 = _mm512_load_si512(P + 128 * j), w1 = _mm512_load_si512(P + 128 * j + 64);
    // 4 tokens' dwords in every 128-bit chunk, then vpshufd picks one for both halves: a dword
    // broadcast load per product would be the bottleneck
#pragma GCC unroll 2
    for (int t4 = 0; t4 < NT; t4 += 4) {
        const __m512i a4 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(A + j * NT + t4)));
        __m512i av = _mm512_shuffle_epi32(a4, _MM_PERM_AAAA);
        s[0][t4] = _mm512_dpbusd_epi32(s[0][t4], w0, av);
        s[1][t4] = _mm512_dpbusd_epi32(s[1][t4], w1, av);
        if (t4 + 1 < NT) {
            av = _mm512_shuffle_epi32(a4, _MM_PERM_BBBB);
            s[0][t4 + 1] = _mm512_dpbusd_epi32(s[0][t4 + 1], w0, av);
            s[1][t4 + 1] = _mm512_dpbusd_epi32(s[1][t4 + 1], w1, av);
        }
        if (t4 + 2 < NT) {
            av = _mm512_shuffle_epi32(a4, _MM_PERM_CCCC);
            s[0][t4 + 2] = _mm512_dpbusd_epi32(s[0][t4 + 2], w0, av);
            s[1][t4 + 2] = _mm512_dpbusd_epi32(s[1][t4 + 2], w1, av);
        }
        if (t4 + 3 < NT) {
            av = _mm512_shuffle_epi32(a4, _MM_PERM_DDDD);
            s[0][t4 + 3] = _mm512_dpbusd_epi32(s[0][t4 + 3], w0, av);
            s[1][t4 + 3] = _mm512_dpbusd_epi32(s[1][t4 + 3], w1, av);
        }
    }
}

// 32 rows x NT tokens over nblk panel blocks: acc_io[16 (h NT + t) + i] += (row 16 h + i, token t)
// as the scalar kernel accumulates it. Few tokens: KS accumulator sets take alternate quads
// (integer sums, so the split changes nothing) to keep enough vpdpbusd chains in flight.
template <int NQ, int NT>
BONSAI_GEMM void micro(const uint8_t* P, const int32_t* A, int64_t nblk, float* acc_io) {
    constexpr int KS = NT == 1 ? 4 : (NT <= 3 ? 2 : 1);
    __m512 acc[2][NT];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 6
        for (int t = 0; t < NT; ++t) acc[h][t] = _mm512_load_ps(acc_io + 16 * (h * NT + t));
    for (int64_t b = 0; b < nblk; ++b) {
        __m512i s[KS][2][NT];
#pragma GCC unroll 4
        for (int k = 0; k < KS; ++k)
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h)
#pragma GCC unroll 6
                for (int t = 0; t < NT; ++t) s[k][h][t] = _mm512_setzero_si512();
        constexpr int JM = NQ - NQ % KS;
        if constexpr (KS == 1) {
#pragma GCC unroll 2
            for (int j = 0; j < NQ; ++j) quad_products<NT>(s[0], P, A, j);
        } else {
#pragma GCC unroll 2
            for (int j = 0; j < JM; j += KS)
#pragma GCC unroll 4
                for (int k = 0; k < KS; ++k) quad_products<NT>(s[k], P, A, j + k);
        }
        if constexpr (JM < NQ)
            for (int j = JM; j < NQ; ++j) quad_products<NT>(s[0], P, A, j);
#pragma GCC unroll 4
        for (int k = 1; k < KS; ++k)
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h)
#pragma GCC unroll 6
                for (int t = 0; t < NT; ++t) s[0][h][t] = _mm512_add_epi32(s[0][h][t], s[k][h][t]);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            const __m512 d = _mm512_load_ps(P + 128 * NQ + 64 * h);
#pragma GCC unroll 6
            for (int t = 0; t < NT; ++t) {
                const __m512i isum = _mm512_sub_epi32(s[0][h][t], _mm512_set1_epi32(A[NQ * NT + t]));
                acc[h][t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc[h][t]);
            }
        }
        P += (NQ + 1) * 128;
        A += (NQ + 1) * NT;
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 6
        for (int t = 0; t < NT; ++t) _mm512_store_ps(acc_io + 16 * (h * NT + t), acc[h][t]);
}

using MicroFn = void (*)(const uint8_t*, const int32_t*, int64_t, float*);

template <int NQ>
MicroFn micro_fn(int64_t nt) {
    switch (nt) {
        case 1: return micro<NQ, 1>;
        case 2: return micro<NQ, 2>;
        case 3: return micro<NQ, 3>;
        case 4: return micro<NQ, 4>;
        case 5: return micro<NQ, 5>;
        default: return micro<NQ, 6>;
    }
}

// Token tiles: n tiles of near-equal size (at most kMaxTile), tile k = [first(k), first(k + 1)).
struct Tiles {
    int64_t n, base, extra;
    explicit Tiles(int64_t n_tokens)
        : n((n_tokens + kMaxTile - 1) / kMaxTile), base(n_tokens / n), extra(n_tokens % n) {}
    int64_t first(int64_t k) const { return k * base + std::min(k, extra); }
    int64_t size(int64_t k) const { return base + (k < extra ? 1 : 0); }
};

uint8_t* aligned_scratch(std::vector<uint8_t>& buf, size_t bytes) {
    if (buf.size() < bytes + 64) buf.resize(bytes + 64);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
    return reinterpret_cast<uint8_t*>((p + 63) / 64 * 64);
}

// Packs the tokens of tile k: per block, the live quads' activation dwords of its tokens side by
// side, then off * asum per token. The tile starts at int32 index first(k) * nb * (NQ + 1).
template <class K>
void pack_tile(const ActInt8& a, const Tiles& tiles, int64_t k, int32_t* packed) {
    constexpr int NQ = block_quads<K>(), QB = 16 / K::G;
    int16_t qoff[K::G][NQ];  // byte offset of each live quad inside the unit's slots
    for (int g = 0; g < K::G; ++g) {
        int j = 0;
        for (int q = 0; q < QB; ++q)
            for (int v = 0; v < K::C; ++v)
                if (K::live(q, v)) qoff[g][j++] = static_cast<int16_t>(64 * v + 4 * (g * QB + q));
    }
    const int64_t nb = a.n_blocks, nt = tiles.size(k), t0 = tiles.first(k);
    int32_t* tile = packed + t0 * nb * (NQ + 1);
    for (int64_t i = 0; i < nt; ++i) {
        const int8_t* st = a.slots + (t0 + i) * a.slot_bytes;
        const int32_t* asum = a.asum + (t0 + i) * nb;
        for (int64_t b = 0; b < nb; ++b) {
            const int8_t* unit = st + (b / K::G) * K::C * 64;
            const int16_t* qo = qoff[b % K::G];
            int32_t* dst = tile + b * (NQ + 1) * nt + i;
            for (int j = 0; j < NQ; ++j) std::memcpy(dst + j * nt, unit + qo[j], 4);
            dst[NQ * nt] = K::kOff * asum[b];
        }
    }
}

// One call's shared state: the weights, the packed activations and how the work is split.
struct GemmJob {
    const WeightView* w;
    const ActInt8* a;
    const int32_t* packed;
    float* y;
    Tiles tiles;
    int64_t groups;       // token-tile groups per panel (work item = panel x group)
    int64_t chunk_units;  // units unpacked at a time
};

// Work items [item_begin, item_end): unpack each panel chunk by chunk, run every tile of the
// item's group over the chunk, then scale and store the 16 rows of each token.
template <class K>
BONSAI_GEMM void run_items(const GemmJob& job, int64_t item_begin, int64_t item_end) {
    constexpr int NQ = block_quads<K>();
    constexpr int64_t block_panel = (NQ + 1) * 128;  // panel bytes of a block
    constexpr int64_t unit_bytes = static_cast<int64_t>(K::G) * K::kBytes;
    const WeightView& w = *job.w;
    const ActInt8& a = *job.a;
    const Tiles& tiles = job.tiles;
    const int64_t nb = a.n_blocks, nu = a.n_units, rows = w.rows, groups = job.groups;
    static thread_local std::vector<uint8_t> scratch_buf, rows_buf;
    const bool interleaved = rows_interleaved(w.type);
    const int64_t max_group_tiles = (tiles.n + groups - 1) / groups;
    const size_t panel_bytes = static_cast<size_t>(job.chunk_units * K::G * block_panel);
    constexpr int64_t tile_acc = 2 * kMaxTile * 16;  // floats of a tile's accumulators
    uint8_t* panel = aligned_scratch(scratch_buf, panel_bytes + sizeof(float) * max_group_tiles * tile_acc);
    float* acc = reinterpret_cast<float*>(panel + panel_bytes);
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    for (int64_t item = item_begin; item < item_end; ++item) {
        const int64_t r0 = item / groups * kPanelRows, grp = item % groups;
        const int64_t k0 = grp * tiles.n / groups, k1 = (grp + 1) * tiles.n / groups;
        const uint8_t* rp[kPanelRows];
        alignas(64) int32_t offs[kPanelRows];
        // interleaved rows (Q8_0_R4, PTQ1_0_R16) are read from a copy of the panel in the file's layout
        const uint8_t* rows_base = base + r0 * static_cast<int64_t>(w.row_bytes);
        if (interleaved) {
            const int64_t r1 = std::min(rows, r0 + kPanelRows);
            uint8_t* copy = aligned_scratch(rows_buf, static_cast<size_t>((r1 - r0) * w.row_bytes) + 64);
            unpack_rows(w, r0, r1, copy);
            rows_base = copy;
        }
        for (int i = 0; i < kPanelRows; ++i) {  // rows past the end repeat the last one
            rp[i] = rows_base + (std::min(r0 + i, rows - 1) - r0) * static_cast<int64_t>(w.row_bytes);
            offs[i] = static_cast<int32_t>(rp[i] - rp[i < kHalfRows ? 0 : kHalfRows]);
        }
        const __m512i vidx0 = _mm512_load_si512(offs), vidx1 = _mm512_load_si512(offs + kHalfRows);
        // The next panel's rows (one contiguous range) are prefetched in step with this one's units:
        // 16 interleaved row streams are more than the hardware prefetchers follow. Into L2 (prefetch.h).
        const char* next = reinterpret_cast<const char*>(base + (r0 + kPanelRows) * static_cast<int64_t>(w.row_bytes));
        const int64_t next_lines = r0 + 2 * kPanelRows <= rows ? kPanelRows * static_cast<int64_t>(w.row_bytes) / 64 : 0;
        std::fill(acc, acc + (k1 - k0) * tile_acc, 0.0f);
        for (int64_t u0 = 0; u0 < nu; u0 += job.chunk_units) {
            const int64_t u1 = std::min(nu, u0 + job.chunk_units);
            for (int64_t u = u0; u < u1; ++u) {
                for (int64_t l = u * next_lines / nu; l < (u + 1) * next_lines / nu; ++l)
                    _mm_prefetch(next + 64 * l, kStreamPrefetchHint);
                const int nin = static_cast<int>(std::min<int64_t>(K::G, nb - u * K::G));
                uint8_t* out = panel + (u - u0) * K::G * block_panel;
                unpack_unit<K>(rp, vidx0, u * unit_bytes, nin, u + 1 < nu, out);
                unpack_unit<K>(rp + kHalfRows, vidx1, u * unit_bytes, nin, u + 1 < nu, out + 64);
            }
            const int64_t b0 = u0 * K::G, nblk = std::min(nb, u1 * K::G) - b0;
            for (int64_t k = k0; k < k1; ++k) {
                const int64_t nt = tiles.size(k);
                const int32_t* at = job.packed + (tiles.first(k) * nb + b0 * nt) * (NQ + 1);
                micro_fn<NQ>(nt)(panel, at, nblk, acc + (k - k0) * tile_acc);
            }
        }
        for (int h = 0; h < 2; ++h) {
            const int64_t left = rows - r0 - h * kHalfRows;
            if (left <= 0) break;
            const __mmask16 mask = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
            for (int64_t k = k0; k < k1; ++k) {
                const int64_t t0 = tiles.first(k), nt = tiles.size(k);
                for (int64_t i = 0; i < nt; ++i) {
                    const __m512 v = _mm512_load_ps(acc + (k - k0) * tile_acc + 16 * (h * nt + i));
                    _mm512_mask_storeu_ps(job.y + (t0 + i) * rows + r0 + h * kHalfRows, mask,
                                          _mm512_mul_ps(v, _mm512_set1_ps(a.scale[t0 + i])));
                }
            }
        }
    }
}

template <class K>
void run_gemm(const WeightView& w, const ActInt8& a, float* y, ThreadPool& pool) {
    constexpr int NQ = block_quads<K>();
    const Tiles tiles(a.n_tokens);
    static thread_local std::vector<uint8_t> packed_buf;
    int32_t* packed = reinterpret_cast<int32_t*>(
        aligned_scratch(packed_buf, sizeof(int32_t) * static_cast<size_t>(a.n_tokens * a.n_blocks * (NQ + 1) + 4)));
    const ActInt8* ap = &a;
    const Tiles* tp = &tiles;
    pool.parallel_for(tiles.n, [ap, tp, packed](int64_t b, int64_t e, int) {
        for (int64_t k = b; k < e; ++k) pack_tile<K>(*ap, *tp, k, packed);
    });
    const int64_t n_panels = (w.rows + kPanelRows - 1) / kPanelRows, n_threads = pool.size();
    GemmJob job{&w, &a, packed, y, tiles, 1, std::max<int64_t>(1, kChunkBytes / (K::G * (NQ + 1) * 128))};
    if (n_panels < n_threads) job.groups = std::min(tiles.n, (n_threads + n_panels - 1) / n_panels);
    // Items are handed out in small chunks through a counter, so a thread slowed by other load
    // leaves its share to the others.
    const int64_t n_items = n_panels * job.groups;
    const int64_t chunk = std::max<int64_t>(1, n_items / (n_threads * kChunksPerThread));
    std::atomic<int64_t> next{0};
    const GemmJob* jp = &job;
    pool.parallel_for(std::min(n_threads, n_items), [jp, &next, chunk, n_items](int64_t, int64_t, int) {
        for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c * chunk < n_items;
             c = next.fetch_add(1, std::memory_order_relaxed))
            run_items<K>(*jp, c * chunk, std::min(n_items, (c + 1) * chunk));
    });
}

}  // namespace

void BONSAI_GEMM_ENTRY(const WeightView& w, const ActInt8& a, float* y, ThreadPool& pool) {
    switch (w.type) {
        case TYPE_PTQ1_0: run_gemm<GPtq1>(w, a, y, pool); break;
        case TYPE_PTQ1_0_R16:
        case TYPE_PTQ1_0_R16L: run_gemm<GPtq1>(w, a, y, pool); break;  // (interleaved: a panel's rows unpacked)
        case TYPE_TQ1_0: run_gemm<GTq1>(w, a, y, pool); break;
        case TYPE_TQ2_0: run_gemm<GTq2>(w, a, y, pool); break;
        case TYPE_Q2_0: run_gemm<GQ2g64>(w, a, y, pool); break;
        case TYPE_Q2_0_G128:
        case TYPE_PQ2_0: run_gemm<GQ2g128>(w, a, y, pool); break;
        case TYPE_Q4_0: run_gemm<GQ4>(w, a, y, pool); break;
        case TYPE_Q8_0:
        case TYPE_Q8_0_R4: run_gemm<GQ8>(w, a, y, pool); break;
        default: throw Error("INT8 GEMM: unsupported weight type " + ggml_type_label(w.type));
    }
}

}  // namespace bonsai::cpu

#undef BONSAI_GEMM
