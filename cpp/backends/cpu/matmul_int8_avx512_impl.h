// AVX-512 VNNI INT8 matmul kernel body, included by matmul_int8_avx512.cpp (base-3 bytes unpacked
// with 16-bit multiplies, AVX-512 F/BW/VL/VNNI) and matmul_int8_avx512_vbmi.cpp (base-3 bytes
// unpacked with byte-table lookups, + AVX-512 VBMI). Both give the same codes, hence the same results.
// The includer defines BONSAI_AVX512_TARGET (target attribute string), BONSAI_TRIT_LUT (0 or 1) and
// BONSAI_AVX512_ENTRY (name of the entry function).
//
// Weights are read one unit at a time (int8_layout.h): the unit's bytes go into a zmm, the codes are
// unpacked into C zmm vectors and multiplied with the token's slot-ordered activations by vpdpbusd
// (unsigned code x signed activation, exact int32). The unpacking (base-3 trits by multiplies or,
// with VBMI, byte-table lookups; 2-bit fields) is unpack_avx512.h's, shared with the GEMM; the
// one-token tiles unpack trit n of all four rows before n + 1 (trit_n), so only one trit's
// constants are live at a time.
// 2-bit and 4-bit codes are shifts and masks; Q8_0 codes have their top bit flipped (w + 128).
//
// Tiles: one token computes 4 consecutive rows x 1 token (one row pointer and the row stride, so the
// loop keeps its addresses in registers), sharing the activation loads and prefetching the rows of
// the following tiles (2 or more tokens use the GEMM of matmul_int8_gemm_impl.h). A thread's last,
// partial tile is computed as the full tile that ends at its last row (recomputed rows are not
// stored again). The four int32
// accumulators of a group are reduced together (an unpack/add transpose) to one int32 per
// (block, output), then acc = fma(d_b, isum_b - off * asum_b, acc) block after block, and
// y = acc * s: exactly the scalar kernel's operations, so the results are bit-identical to it.
#pragma once

// GCC 12 warns about the deliberately undefined pass-through operands inside its AVX-512 headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "block_unpack.h"
#include "bonsai/quants.h"
#include "matmul_kernels.h"
#include "prefetch.h"
#include "ptq1_0_r16.h"
#include "repack.h"

#define BONSAI_AVX512 __attribute__((target(BONSAI_AVX512_TARGET)))

namespace bonsai::cpu {

namespace {

// Decode prefetches the same unit kPrefetchRows rows ahead (the next tiles): a tile's rows are
// short and contiguous, so this runs ahead of the whole tile. Into L2 (prefetch.h).
constexpr int kPrefetchRows = 16;

}  // namespace
}  // namespace bonsai::cpu

#define BONSAI_UNPACK BONSAI_AVX512
#define BONSAI_UNPACK_LUT BONSAI_TRIT_LUT
#include "unpack_avx512.h"

namespace bonsai::cpu {
namespace {


// Per type: load() reads a unit into a zmm (first: the row's first unit; more: another unit
// follows in the row), codes() unpacks it. kDWord >= 0: the fp16 scale of the unit's block 0 (1)
// is 16-bit word kDWord (kDWord1) of the loaded zmm (its codes meet zero activations).
// PTQ1_0 uses the one-token variant of its layout (int8_layout.h): one 64-byte load from 4 bytes
// before the unit puts block 0 at bytes 4..31 and block 1 at 32..59. The bytes around them (the
// neighbouring units or rows, or a missing second block) meet zero activations; only bytes
// outside the weight [lo, hi) are masked off (the first unit of its first row, the last unit of its
// last row): tiles that hold neither (kEdge false) make every load a plain one.
struct KPtq1 {
    static constexpr int G = 2, C = 5, kOff = 1, kBytes = 28, kDOff = 26, kDWord = 15, kDWord1 = 29;
    static constexpr bool kTrits = true, kWide = false, kRaw = false;
    // Whether a tile's loads may reach outside [lo, hi): its first row's first unit or its last
    // row's last unit (a load ends up to 32 bytes past a row whose last unit holds one block).
    static bool edge(const uint8_t* p0, int64_t rb, int64_t nu, const uint8_t* lo, const uint8_t* hi) {
        return p0 - 4 < lo || p0 + 3 * rb + (nu - 1) * G * kBytes + 60 > hi;
    }
    template <bool kEdge>
    BONSAI_AVX512 static __m512i load(const uint8_t* p, const uint8_t* lo, const uint8_t* hi) {
        const uint8_t* q = p - 4;
        if (!kEdge || (q >= lo && q + 64 <= hi)) return _mm512_loadu_si512(q);
        uint64_t m = ~uint64_t{0};
        if (q < lo) m <<= lo - q;
        if (q + 64 > hi) m &= ~uint64_t{0} >> (q + 64 - hi);
        return _mm512_maskz_loadu_epi8(m, q);
    }
    BONSAI_AVX512 static void codes(__m512i src, __m512i* c) { trits5(src, c); }
};

struct KTq1 {
    static constexpr int G = 1, C = 5, kOff = 1, kBytes = 54, kDOff = 52, kDWord = 26, kDWord1 = 26;
    static constexpr bool kTrits = true, kWide = false, kRaw = false;
    BONSAI_AVX512 static __m512i load(const uint8_t* p, int, bool more) {
        if (more) return _mm512_loadu_si512(p);  // runs 10 bytes into the next block (zero activations)
        return join256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                       _mm256_maskz_loadu_epi8((1u << 22) - 1, p + 32));  // qs[32..47], qh, d
    }
    BONSAI_AVX512 static void codes(__m512i src, __m512i* c) { trits5(src, c); }
};

struct KTq2 {
    static constexpr int G = 1, C = 4, kOff = 1, kBytes = 66, kDOff = 64, kDWord = -1;
    static constexpr bool kTrits = false, kWide = false, kRaw = false;
    BONSAI_AVX512 static __m512i load(const uint8_t* p, int, bool) { return _mm512_loadu_si512(p); }
    BONSAI_AVX512 static void codes(__m512i src, __m512i* c) { fields2(src, c); }
};

// kWide: 18-byte blocks read by load4x18 (codes, and the raw vector holding the scales).
struct KQ2g64 {
    static constexpr int G = 4, C = 4, kOff = 1, kBytes = 18, kDOff = 0, kDWord = -1;
    static constexpr bool kTrits = false, kWide = true, kRaw = false;
    BONSAI_AVX512 static void codes(__m512i src, __m512i* c) { fields2(src, c); }
};

struct KQ2g128 {
    static constexpr int G = 2, C = 4, kOff = 1, kBytes = 34, kDOff = 0, kDWord = -1;
    static constexpr bool kTrits = false, kWide = false, kRaw = false;
    BONSAI_AVX512 static __m512i load(const uint8_t* p, int nin, bool) { return load2x32(p, 2, kBytes, nin); }
    BONSAI_AVX512 static void codes(__m512i src, __m512i* c) { fields2(src, c); }
};

struct KQ4 {
    static constexpr int G = 4, C = 2, kOff = 8, kBytes = 18, kDOff = 0, kDWord = -1;
    static constexpr bool kTrits = false, kWide = true, kRaw = false;
    BONSAI_AVX512 static void codes(__m512i src, __m512i* c) {
        const __m512i m4 = _mm512_set1_epi8(15);
        c[0] = _mm512_and_si512(src, m4);
        c[1] = _mm512_and_si512(_mm512_srli_epi16(src, 4), m4);
    }
};

// Q8_0 codes are signed: flipping the top bit gives w + 128 as an unsigned byte for vpdpbusd, and
// the block's sum over 128 x a is taken off afterwards (kOff = 128: isum - 128 asum), exact in int32.
// kRaw: the unit's 68 bytes are read as p[0, 64) (raw, which holds both scales: words 0 and 17) and
// p[4, 68), and one byte permute gathers the codes of block 0 (bytes 2..33) and block 1 (36..67);
// a unit with one block (the row's last, odd one) is read as its 34 bytes.
struct KQ8 {
    static constexpr int G = 2, C = 1, kOff = 128, kBytes = 34, kDOff = 0, kDWord = 0, kDWord1 = 17;
    static constexpr bool kTrits = false, kWide = false, kRaw = true;
    BONSAI_AVX512 static __m512i load(const uint8_t* p, int nin, __m512i& raw) {
        alignas(64) static constexpr uint8_t kGather[64] = {
            2,   3,   4,   5,   6,   7,   8,   9,   10,  11,  12,  13,  14,  15,  16,  17,
            18,  19,  20,  21,  22,  23,  24,  25,  26,  27,  28,  29,  30,  31,  32,  33,
            96,  97,  98,  99,  100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
            112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127};
        __m512i rest;
        if (nin == 2) {
            raw = _mm512_loadu_si512(p);
            rest = _mm512_loadu_si512(p + 4);
        } else {
            raw = _mm512_maskz_loadu_epi8((uint64_t{1} << kBytes) - 1, p);
            rest = _mm512_setzero_si512();
        }
        return _mm512_permutex2var_epi8(raw, _mm512_load_si512(kGather), rest);
    }
    BONSAI_AVX512 static void codes(__m512i src, __m512i* c) { c[0] = _mm512_xor_si512(src, _mm512_set1_epi8(-128)); }
};

template <class K>
BONSAI_AVX512 inline __m512i dot_unit(const __m512i* c, const int8_t* act) {
    __m512i s = _mm512_setzero_si512();
    for (int v = 0; v < K::C; ++v) {
        s = _mm512_dpbusd_epi32(s, c[v], _mm512_load_si512(act + 64 * v));
    }
    return s;
}

// Four accumulators -> per 128-bit chunk [sum s0, sum s1, sum s2, sum s3] over that chunk.
BONSAI_AVX512 inline __m512i reduce4(const __m512i* s) {
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]), _mm512_unpackhi_epi32(s[2], s[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

// The four outputs' int32 dot products of block g of the unit.
template <class K>
BONSAI_AVX512 inline __m128i block_isum(__m512i u, int g) {
    if constexpr (K::G == 1) {
        const __m512i x = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, 0x4E));
        return _mm_add_epi32(_mm512_castsi512_si128(x), _mm512_extracti32x4_epi32(x, 1));
    } else if constexpr (K::G == 2) {
        const __m512i x = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, 0xB1));
        return g == 0 ? _mm512_castsi512_si128(x) : _mm512_extracti32x4_epi32(x, 2);
    } else {
        switch (g) {
            case 0: return _mm512_castsi512_si128(u);
            case 1: return _mm512_extracti32x4_epi32(u, 1);
            case 2: return _mm512_extracti32x4_epi32(u, 2);
            default: return _mm512_extracti32x4_epi32(u, 3);
        }
    }
}

template <class K>
BONSAI_AVX512 inline __m128 block_fma(__m128 acc, __m128i isum, __m128i asum4, __m128 d4) {
    if constexpr (K::kOff == 1) isum = _mm_sub_epi32(isum, asum4);
    if constexpr (K::kOff == 8) isum = _mm_sub_epi32(isum, _mm_slli_epi32(asum4, 3));
    if constexpr (K::kOff == 128) isum = _mm_sub_epi32(isum, _mm_slli_epi32(asum4, 7));
    return _mm_fmadd_ps(d4, _mm_cvtepi32_ps(isum), acc);
}

// Scales of the unit's blocks for the four rows: [block 0 rows 0..3, block 1 rows 0..3].
template <class K>
BONSAI_AVX512 inline __m256 unit_scales(const __m512i* src, const uint8_t* const* p, int nin) {
    if constexpr (K::kDWord >= 0) {
        constexpr short w0 = K::kDWord, w1 = K::kDWord1;
        alignas(64) static constexpr int16_t kPick[32] = {w0, 32 + w0, w1, 32 + w1};
        alignas(64) static constexpr int16_t kOrder[32] = {0, 1, 32, 33, 2, 3, 34, 35};
        const __m512i pick = _mm512_load_si512(kPick);
        const __m512i order = _mm512_load_si512(kOrder);
        const __m512i a = _mm512_permutex2var_epi16(src[0], pick, src[1]);  // r0b0 r1b0 r0b1 r1b1
        const __m512i b = _mm512_permutex2var_epi16(src[2], pick, src[3]);  // r2b0 r3b0 r2b1 r3b1
        return _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(a, order, b)));
    } else {
        static_assert(K::G <= 2 || K::kDWord < 0, "scale extraction covers at most two blocks");
        // Built in registers (vpinsrw): eight 2-byte stores read back as one vector would stall
        // on store forwarding.
        auto h = [&](int g, int i) { return static_cast<short>(load_u16(p[i] + g * K::kBytes + K::kDOff)); };
        if (K::G == 1 || nin < 2)
            return _mm256_cvtph_ps(_mm_setr_epi16(h(0, 0), h(0, 1), h(0, 2), h(0, 3), 0, 0, 0, 0));
        return _mm256_cvtph_ps(_mm_setr_epi16(h(0, 0), h(0, 1), h(0, 2), h(0, 3), h(1, 0), h(1, 1), h(1, 2), h(1, 3)));
    }
}

BONSAI_AVX512 inline __m128 extract4(__m512 v, int g) {
    switch (g) {
        case 0: return _mm512_castps512_ps128(v);
        case 1: return _mm512_extractf32x4_ps(v, 1);
        case 2: return _mm512_extractf32x4_ps(v, 2);
        default: return _mm512_extractf32x4_ps(v, 3);
    }
}

// Trit 0 of base-3 bytes b against activations a, from zb = sum b a and zm = sum (3 b mod 256) a
// (two vpdpbusd, trit0_products): 3 b = 256 t0 + (3 b mod 256) for every byte, so sum t0 a =
// (3 zb - zm) / 256, exact in every dword lane. On Zen 4 the thresholds' saturating subtractions share vpdpbusd's
// port and the byte permutes half of it; the extra vpdpbusd and two byte adds cost less there
// (one-thread harness over 1024 rows of a gate weight: 0.92x the time).
BONSAI_AVX512 inline void trit0_products(__m512i& zb, __m512i& zm, __m512i src, __m512i a) {
    zb = _mm512_dpbusd_epi32(zb, src, a);
    zm = _mm512_dpbusd_epi32(zm, _mm512_add_epi8(_mm512_add_epi8(src, src), src), a);  // 3 b mod 256
}
BONSAI_AVX512 inline __m512i trit0_sum(__m512i zb, __m512i zm) {
    return _mm512_srai_epi32(_mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(zb, zb), zb), zm), 8);
}

// Prefetches the unit at q: its first byte's line and, for units longer than a line, its last
// byte's line too (one prefetch per unit would skip a line every 64 / (unit_bytes - 64) units).
template <class K>
BONSAI_AVX512 inline void prefetch_unit(const uint8_t* q) {
    _mm_prefetch(reinterpret_cast<const char*>(q), kStreamPrefetchHint);
    if constexpr (K::G * K::kBytes > 64) _mm_prefetch(reinterpret_cast<const char*>(q + K::G * K::kBytes - 1), kStreamPrefetchHint);
}

// 4 rows x 1 token: rows p0, p0 + rb, p0 + 2 rb, p0 + 3 rb.
// acc: the sum of the blocks before p0's (a Q8_0_R4 tile's groups), zero for a whole row. ustride:
// bytes from a row's unit to its next (0: the unit's size; a Q8_0_R4 tile: four units).
template <class K, bool kEdge>
BONSAI_AVX512 __m128 tile_rows(const uint8_t* p0, int64_t rb, const int8_t* act, const int32_t* asum, int64_t nb,
                               int64_t prefetch_stride, const uint8_t* lo, const uint8_t* hi,
                               __m128 acc = _mm_setzero_ps(), int64_t ustride = 0) {
    static_assert(K::G <= 2 || K::kWide, "scales are read for units of at most two blocks or by load4x18");
    const int64_t nu = (nb + K::G - 1) / K::G;
    constexpr int64_t unit_bytes = static_cast<int64_t>(K::G) * K::kBytes;
    const int64_t us = ustride ? ustride : unit_bytes;
    for (int64_t u = 0; u < nu; ++u) {
        const int nin = static_cast<int>(std::min<int64_t>(K::G, nb - u * K::G));
        const int8_t* au = act + u * K::C * 64;
        const uint8_t* p[4];
        __m512i src[4], s[4], raw[4];
        if constexpr (K::kTrits) {
            __mmask64 top[4];
            __m512i key[4];
            for (int i = 0; i < 4; ++i) {
                p[i] = p0 + i * rb + u * us;
                prefetch_unit<K>(p[i] + prefetch_stride);
                if constexpr (std::is_same_v<K, KPtq1>) src[i] = K::template load<kEdge>(p[i], lo, hi);
                else src[i] = K::load(p[i], nin, u + 1 < nu);
                top[i] = _mm512_movepi8_mask(src[i]);
                key[i] = trit_key(src[i], top[i]);
                s[i] = _mm512_setzero_si512();
            }
            __m512i zb[4], zm[4];
            const __m512i a0 = _mm512_load_si512(au);
            for (int i = 0; i < 4; ++i) {
                zb[i] = zm[i] = _mm512_setzero_si512();
                trit0_products(zb[i], zm[i], src[i], a0);
            }
            for (int n = 1; n < 5; ++n) {
                const __m512i a = _mm512_load_si512(au + 64 * n);
                for (int i = 0; i < 4; ++i) s[i] = _mm512_dpbusd_epi32(s[i], trit_n(src[i], key[i], top[i], n), a);
            }
            for (int i = 0; i < 4; ++i) s[i] = _mm512_add_epi32(s[i], trit0_sum(zb[i], zm[i]));
        } else {
            for (int i = 0; i < 4; ++i) {
                p[i] = p0 + i * rb + u * us;
                prefetch_unit<K>(p[i] + prefetch_stride);
                if constexpr (K::kWide) src[i] = load4x18(p[i], nin, raw[i]);
                else if constexpr (K::kRaw) src[i] = K::load(p[i], nin, raw[i]);
                else src[i] = K::load(p[i], nin, u + 1 < nu);
                __m512i c[K::C];
                K::codes(src[i], c);
                s[i] = dot_unit<K>(c, au);
            }
        }
        const __m512i red = reduce4(s);
        if constexpr (K::kWide) {
            const __m512 d16 = scales4x18(raw);
            for (int g = 0; g < nin; ++g) {
                const int64_t b = u * K::G + g;
                acc = block_fma<K>(acc, block_isum<K>(red, g), _mm_set1_epi32(asum[b]), extract4(d16, g));
            }
        } else {
            const __m256 d8 = unit_scales<K>(K::kRaw ? raw : src, p, nin);
            const int64_t b = u * K::G;
            acc = block_fma<K>(acc, block_isum<K>(red, 0), _mm_set1_epi32(asum[b]), _mm256_castps256_ps128(d8));
            if (K::G == 2 && nin > 1)
                acc = block_fma<K>(acc, block_isum<K>(red, 1), _mm_set1_epi32(asum[b + 1]), _mm256_extractf128_ps(d8, 1));
        }
    }
    return acc;
}

// Q8_0_R4, 4 rows x 1 token, the groups of four blocks (repack.h, int8_layout.h). kTile: p0 is a
// full tile; otherwise row p0 in the file's layout, read as four copies (the group's codes
// gathered by load4x16). Each row's two vectors (codes 0..15, then 16..31, of the four blocks,
// block j in chunk j) meet the token's two activation vectors in one accumulator per row; reduce4
// leaves lane 4 j + c = block j of row c, 128 asum is taken off, and acc = fma(d_b, isum_b, acc)
// block after block. No software prefetches: the tile reads its bytes strictly front to back and
// the hardware prefetchers keep up (prefetches into L2 kPrefetchRows ahead made the cold head read
// 0.7x as fast on one Zen 4 core, 0.8x on two).
template <bool kTile>
BONSAI_AVX512 __m128 tile_q8r4(const uint8_t* p0, int64_t nb, const int8_t* act, const int32_t* asum) {
    alignas(64) static constexpr int32_t kExpand[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    constexpr int64_t bb = sizeof(block_q8_0);
    const int64_t ng = nb / kQ8R4Blocks;
    const __m512i flip = _mm512_set1_epi8(-128);
    __m128 acc = _mm_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
        const __m512i a0 = _mm512_load_si512(act + 128 * g), a1 = _mm512_load_si512(act + 128 * g + 64);
        __m512i s[4];
        __m256i d16;
        if constexpr (kTile) {
            const uint8_t* q = p0 + q8r4_codes_offset(g);
            const uint8_t* scales = p0 + q8r4_scales_offset(nb, g);
            for (int c = 0; c < 4; ++c) {
                const __m512i lo = _mm512_xor_si512(_mm512_loadu_si512(q + 128 * c), flip);
                const __m512i hi = _mm512_xor_si512(_mm512_loadu_si512(q + 128 * c + 64), flip);
                s[c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, a0), hi, a1);
            }
            d16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales));
        } else {
            const uint8_t* q = p0 + kQ8R4Blocks * bb * g;
            const __m512i lo = _mm512_xor_si512(load4x16(q, bb, 4), flip);
            const __m512i hi = _mm512_xor_si512(load4x16(q + 16, bb, 4), flip);
            s[0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, a0), hi, a1);
            s[1] = s[2] = s[3] = s[0];
            const short h0 = static_cast<short>(load_u16(q)), h1 = static_cast<short>(load_u16(q + bb)),
                        h2 = static_cast<short>(load_u16(q + 2 * bb)), h3 = static_cast<short>(load_u16(q + 3 * bb));
            d16 = _mm256_setr_epi16(h0, h0, h0, h0, h1, h1, h1, h1, h2, h2, h2, h2, h3, h3, h3, h3);
        }
        const __m128i as = _mm_slli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(asum + kQ8R4Blocks * g)), 7);
        const __m512i as16 = _mm512_permutexvar_epi32(_mm512_load_si512(kExpand), _mm512_castsi128_si512(as));
        const __m512i isum = _mm512_sub_epi32(reduce4(s), as16);
        const __m512 f = _mm512_cvtepi32_ps(isum);
        const __m512 d = _mm512_cvtph_ps(d16);
        for (int j = 0; j < 4; ++j) acc = _mm_fmadd_ps(extract4(d, j), extract4(f, j), acc);
    }
    return acc;
}

// Tag of Q8_0_R4 (repack.h) in run_int8.
struct KQ8R4 {};

// acc + the products of each lane's four code bytes with the activation dword at a, broadcast to
// every lane: vpdpbusd with an embedded-broadcast memory operand (written out because GCC may load
// the dword into a register and broadcast it there, an extra operation on the vector pipes).
BONSAI_AVX512 inline __m512i dpbusd_bcast(__m512i acc, __m512i codes, const int8_t* a) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(*reinterpret_cast<const int32_t*>(a)));
    return acc;
}

struct KPtq1R16 {};

// PTQ1_0_R16 / R16L, one tile of n rows (16, or the weight's last n < 16) x 1 token (ptq1_0_r16.h,
// int8_layout.h): lane r of every vector is row r. Per block, each of the six qs vectors gives its
// five trits, each multiplied with its activation dword broadcast:
//   R16 (base-3 bytes): trit 0 by trit0_products (its bytes and 3 b mod 256 into zb, zm), trits
//     1..4 by lookups of its stand-in key;
//   R16L (kCode, VBMI only: the R16 code): vpermb lookups of the codes' low six bits give trits 0
//     and 1, and of (key ^ code >> 2) trits 2..4 (no trit-0 products, masks or stand-in keys).
// The tail vector's 2-bit qh fields add four more; two accumulators alternate so the dependent chain
// is half as long. Then isum_b = s (+ trit0_sum) - asum_b, exact in every lane, and acc =
// fma(d_b, isum_b, acc) block after block: the scalar kernel's operations, so the results are
// bit-identical to it. The next tile's block is prefetched (kPrefetchRows = 16 rows ahead). A
// partial tile loads its n lanes masked.
template <bool kFull, bool kCode>
BONSAI_AVX512 __m512 tile_r16(const uint8_t* p0, int n, const int8_t* act, const int32_t* asum, int64_t nb,
                              int64_t prefetch_stride) {
    const int64_t bb = static_cast<int64_t>(sizeof(block_ptq1_0)) * n;  // bytes of a block of the tile
    const __mmask16 lanes = static_cast<__mmask16>((1u << n) - 1);
    const __m512i m3 = _mm512_set1_epi8(3);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* q = p0 + b * bb;
        const int8_t* ab = act + b * kR16ActVectors * 64;
        if constexpr (kFull)
            for (int l = 0; l < kR16Bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(q + prefetch_stride + l), kStreamPrefetchHint);
        __m512i s[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        if constexpr (kCode) {
            const __m512i t0 = _mm512_load_si512(kR16Qs.t0), t1 = _mm512_load_si512(kR16Qs.t1);
            const __m512i key = _mm512_load_si512(kR16Qs.key), t2 = _mm512_load_si512(kR16Qs.t2);
            const __m512i t3 = _mm512_load_si512(kR16Qs.t3), t4 = _mm512_load_si512(kR16Qs.t4);
            for (int k = 0; k < 6; ++k) {
                const __m512i src = kFull ? _mm512_loadu_si512(q + 64 * k) : _mm512_maskz_loadu_epi32(lanes, q + 4 * n * k);
                const int8_t* ak = ab + 4 * (5 * k);
                // every byte's code >> 2 in its low six bits (the bits shifted in from the next byte
                // land in bits 6 and 7, which vpermb ignores)
                const __m512i idx = _mm512_xor_si512(_mm512_permutexvar_epi8(src, key), _mm512_srli_epi16(src, 2));
                s[0] = dpbusd_bcast(s[0], _mm512_permutexvar_epi8(src, t0), ak);
                s[1] = dpbusd_bcast(s[1], _mm512_permutexvar_epi8(src, t1), ak + 4);
                s[0] = dpbusd_bcast(s[0], _mm512_permutexvar_epi8(idx, t2), ak + 8);
                s[1] = dpbusd_bcast(s[1], _mm512_permutexvar_epi8(idx, t3), ak + 12);
                s[0] = dpbusd_bcast(s[0], _mm512_permutexvar_epi8(idx, t4), ak + 16);
            }
        } else {
            __m512i zb = _mm512_setzero_si512(), zm = _mm512_setzero_si512();
            for (int k = 0; k < 6; ++k) {
                const __m512i src = kFull ? _mm512_loadu_si512(q + 64 * k) : _mm512_maskz_loadu_epi32(lanes, q + 4 * n * k);
                const __mmask64 top = _mm512_movepi8_mask(src);
                const __m512i key = trit_key(src, top);
                const int8_t* ak = ab + 4 * (5 * k);
                zb = dpbusd_bcast(zb, src, ak);
                zm = dpbusd_bcast(zm, _mm512_add_epi8(_mm512_add_epi8(src, src), src), ak);  // 3 b mod 256
                for (int t = 1; t < 5; ++t) s[t % 2] = dpbusd_bcast(s[t % 2], trit_n(src, key, top, t), ak + 4 * t);
            }
            s[0] = _mm512_add_epi32(s[0], trit0_sum(zb, zm));
        }
        const __m512i tail = kFull ? _mm512_loadu_si512(q + 64 * 6) : _mm512_maskz_loadu_epi32(lanes, q + 4 * n * 6);
        for (int f = 0; f < 4; ++f)
            s[f % 2] = dpbusd_bcast(s[f % 2], _mm512_and_si512(f == 0 ? tail : _mm512_srli_epi16(tail, 2 * f), m3),
                                    ab + 4 * (30 + f));
        const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_set1_epi32(asum[b]));
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(tail, 16)));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc);
    }
    return acc;
}

template <class K>
BONSAI_AVX512 void run_int8(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y) {
    const int64_t nb = a.n_blocks, rows = w.rows, rb = static_cast<int64_t>(w.row_bytes);
    // R4: Q8_0 units after the groups (R16 returns before KU is used)
    using KU = std::conditional_t<std::is_same_v<K, KPtq1R16>, KPtq1, std::conditional_t<std::is_same_v<K, KQ8R4>, KQ8, K>>;
    const int64_t nu = (nb + KU::G - 1) / KU::G;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const uint8_t* end = base + rows * rb;
    // Tile after tile, each for every token while its rows are in L1: up to tile_batch_tokens tokens
    // (int8_layout.h); more normally go to the GEMM (matmul_int8_gemm_impl.h), which unpacks each
    // weight once for all of them, and this loop is its exact (slower) equivalent.
    const int64_t prefetch_stride = kPrefetchRows * rb;
    // The tiles prefetch kPrefetchRows rows ahead, so a range starts cold: its first rows (one
    // contiguous span) are prefetched at once, their fetches overlapping instead of queueing behind
    // the first tile's misses.
    {
        const uint8_t* p = base + r0 * rb;
        const uint8_t* e = base + std::min(r1, r0 + kPrefetchRows) * rb;
        for (; p < e; p += 64) _mm_prefetch(reinterpret_cast<const char*>(p), kStreamPrefetchHint);
    }
    if constexpr (std::is_same_v<K, KPtq1R16>) {  // R16 / R16L: tiles of 16 rows, the weight's last one of rows % 16
        for (int64_t t0 = r0 / kR16Rows * kR16Rows; t0 < r1; t0 += kR16Rows) {
            const int n = static_cast<int>(std::min<int64_t>(kR16Rows, rows - t0));
            const uint8_t* p0 = base + t0 * rb;
            for (int64_t t = 0; t < a.n_tokens; ++t) {
                const int8_t* act = a.slots + t * a.slot_bytes;
                const int32_t* asum = a.asum + t * nb;
                __m512 v;
#if BONSAI_TRIT_LUT
                if (w.type == TYPE_PTQ1_0_R16L)
                    v = n == kR16Rows ? tile_r16<true, true>(p0, n, act, asum, nb, prefetch_stride)
                                      : tile_r16<false, true>(p0, n, act, asum, nb, prefetch_stride);
                else
#endif
                    v = n == kR16Rows ? tile_r16<true, false>(p0, n, act, asum, nb, prefetch_stride)
                                      : tile_r16<false, false>(p0, n, act, asum, nb, prefetch_stride);
                alignas(64) float out[kR16Rows];
                _mm512_store_ps(out, _mm512_mul_ps(v, _mm512_set1_ps(a.scale[t])));
                for (int64_t i = std::max(r0, t0); i < std::min(t0 + n, r1); ++i) y[t * rows + i] = out[i - t0];
            }
        }
        return;
    }
    if constexpr (std::is_same_v<K, KQ8R4>) {  // full tiles interleaved, the rows after them one at a time
        const int64_t full = rows / 4 * 4, ng = nb / kQ8R4Blocks, rest = nb - ng * kQ8R4Blocks;
        constexpr int64_t bb = sizeof(block_q8_0);
        for (int64_t r = r0; r < r1;) {
            const uint8_t* p0 = base + r * rb;
            const int64_t n_out = r + 4 <= full ? 4 : 1;
            for (int64_t t = 0; t < a.n_tokens; ++t) {
                const int8_t* act = a.slots + t * a.slot_bytes;
                const int32_t* asum = a.asum + t * nb;
                // a full tile, or a row in the file's layout read as four copies; then the blocks after
                // the groups (a tile's rows after one another, or the row's own)
                __m128 v = n_out == 4 ? tile_q8r4<true>(p0, nb, act, asum) : tile_q8r4<false>(p0, nb, act, asum);
                if (rest)
                    v = tile_rows<KQ8, false>(p0 + (n_out == 4 ? q8r4_rest_offset(nb) : ng * kQ8R4Blocks * bb),
                                              n_out == 4 ? rest * bb : 0, act + ng * 2 * 64, asum + ng * kQ8R4Blocks,
                                              rest, prefetch_stride, base, end, v);
                alignas(16) float out[4];
                _mm_store_ps(out, _mm_mul_ps(v, _mm_set1_ps(a.scale[t])));
                for (int64_t i = 0; i < n_out; ++i) y[t * rows + r + i] = out[i];
            }
            r += n_out;
        }
        return;
    }
    // A weight of fewer than 4 rows runs one row at a time (stride 0: four copies of the row).
    const int64_t step = rows < 4 ? 1 : 4, stride = rows < 4 ? 0 : rb;
    for (int64_t r = r0; r < r1; r += step) {
        // The tile's first row: r, or the full tile ending at r1 - 1 when fewer than 4 rows
        // are left (its rows before r were stored already).
        const int64_t t0 = step == 1 ? r : std::max<int64_t>(0, std::min(r, r1 - 4));
        const uint8_t* p0 = base + t0 * rb;
        bool edge = false;  // whether the tile's PTQ1_0 unit loads may reach outside the weight
        if constexpr (std::is_same_v<K, KPtq1>) edge = K::edge(p0, stride, nu, base, end);
        for (int64_t t = 0; t < a.n_tokens; ++t) {
            const int8_t* act = a.slots + t * a.slot_bytes;
            const int32_t* asum = a.asum + t * nb;
            __m128 v;
            if constexpr (std::is_same_v<K, KPtq1>) {
                v = edge ? tile_rows<K, true>(p0, stride, act, asum, nb, prefetch_stride, base, end)
                         : tile_rows<K, false>(p0, stride, act, asum, nb, prefetch_stride, base, end);
            } else {  // (KU: R4 returned above)
                v = tile_rows<KU, false>(p0, stride, act, asum, nb, prefetch_stride, base, end);
            }
            alignas(16) float out[4];
            _mm_store_ps(out, _mm_mul_ps(v, _mm_set1_ps(a.scale[t])));
            for (int64_t i = std::max(r, t0); i < std::min(t0 + step, r1); ++i) y[t * rows + i] = out[i - t0];
        }
    }
}

}  // namespace

BONSAI_AVX512 void BONSAI_AVX512_ENTRY(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y) {
    switch (w.type) {
        case TYPE_PTQ1_0: run_int8<KPtq1>(w, a, r0, r1, y); break;
        case TYPE_PTQ1_0_R16: run_int8<KPtq1R16>(w, a, r0, r1, y); break;
#if BONSAI_TRIT_LUT
        case TYPE_PTQ1_0_R16L: run_int8<KPtq1R16>(w, a, r0, r1, y); break;  // (without VBMI: read converted)
#endif
        case TYPE_TQ1_0: run_int8<KTq1>(w, a, r0, r1, y); break;
        case TYPE_TQ2_0: run_int8<KTq2>(w, a, r0, r1, y); break;
        case TYPE_Q2_0: run_int8<KQ2g64>(w, a, r0, r1, y); break;
        case TYPE_Q2_0_G128:
        case TYPE_PQ2_0: run_int8<KQ2g128>(w, a, r0, r1, y); break;
        case TYPE_Q4_0: run_int8<KQ4>(w, a, r0, r1, y); break;
        case TYPE_Q8_0: run_int8<KQ8>(w, a, r0, r1, y); break;
        case TYPE_Q8_0_R4: run_int8<KQ8R4>(w, a, r0, r1, y); break;
        default: break;
    }
}

}  // namespace bonsai::cpu

#undef BONSAI_AVX512
