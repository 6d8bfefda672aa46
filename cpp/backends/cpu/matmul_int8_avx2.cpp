// AVX2 INT8 matmul (AVX2 + FMA + F16C by function attributes, chosen at run time).
//
// The same algorithm as matmul_int8_avx512_impl.h on ymm registers: 4-row tiles for 1-2 tokens,
// 1 row x 8 token tiles from 3 tokens on, base-3 bytes unpacked with byte adds and compares
// (trits5), each 64-byte code vector of a unit (int8_layout.h) handled as two ymm halves. Codes times activations go through vpmaddubsw
// (unsigned code x signed activation into int16 pairs; the code ranges keep every int16 sum below
// 32767, see the bounds below) and vpmaddwd with ones into int32, so every block's dot product is
// exact and the float combination acc = fma(d_b, isum_b, acc), y = acc * s matches the scalar
// kernel bit for bit.
//   int16 bound per lane: 2 products x max code x 127 x C vectors: trits 2*2*127*5 = 2540,
//   2-bit 2*3*127*4 = 3048, Q4_0 2*15*127*2 = 7620, Q8_0 2*128*127 = 32512.
#include <immintrin.h>

#include <algorithm>

#include "block_unpack.h"
#include "bonsai/quants.h"
#include "matmul_kernels.h"
#include "prefetch.h"

#define BONSAI_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace bonsai::cpu {

namespace {

// Decode prefetches the same unit kPrefetchRows rows ahead (the next tiles), since a tile's rows
// are short and contiguous, into L2 (prefetch.h).
constexpr int kPrefetchRows = 16;

// Trit n of every byte, without multiplies: with m = (b * 3^n) mod 256 the trit is
// (m > 85) + (m > 170). The kernel tracks m' = m ^ 0x80 (signed bytes, so the tests are signed
// compares with -43 and 42); m' follows the same recurrence m'_{n+1} = 3 m'_n mod 256.
BONSAI_AVX2 inline void trits5(__m256i src, __m256i* c, int stride) {
    const __m256i lo = _mm256_set1_epi8(-43), hi = _mm256_set1_epi8(42);
    __m256i m = _mm256_xor_si256(src, _mm256_set1_epi8(static_cast<char>(0x80)));
    for (int n = 0; n < 5; ++n) {
        const __m256i neg = _mm256_add_epi8(_mm256_cmpgt_epi8(m, lo), _mm256_cmpgt_epi8(m, hi));  // -trit
        c[n * stride] = _mm256_abs_epi8(neg);
        if (n < 4) m = _mm256_add_epi8(m, _mm256_add_epi8(m, m));
    }
}

BONSAI_AVX2 inline void fields2(__m256i src, __m256i* c, int stride) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int l = 0; l < 4; ++l) c[l * stride] = _mm256_and_si256(_mm256_srli_epi16(src, 2 * l), m3);
}

BONSAI_AVX2 inline __m256i join128(__m128i lo, __m128i hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

BONSAI_AVX2 inline __m128i load16_or_zero(const uint8_t* p, bool ok) {
    return ok ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)) : _mm_setzero_si128();
}

BONSAI_AVX2 inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Code vectors are stored as c[2v] (bytes 0..31) and c[2v + 1] (bytes 32..63).
struct KPtq1 {
    static constexpr int G = 2, C = 5, kOff = 1, kBytes = 28, kDOff = 26;
    static constexpr bool kSigned = false;
    // more: another unit follows in the row, so 32-byte loads may run 4 bytes into it (those
    // bytes meet zero activations); the row's last unit uses masked loads of the 28-byte blocks.
    BONSAI_AVX2 static void codes(const uint8_t* p, int nin, bool more, __m256i* c) {
        if (more) {
            trits5(load32(p), c, 2);
            trits5(load32(p + kBytes), c + 1, 2);
            return;
        }
        const __m256i m7 = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, -1, 0);
        trits5(_mm256_maskload_epi32(reinterpret_cast<const int*>(p), m7), c, 2);
        trits5(nin > 1 ? _mm256_maskload_epi32(reinterpret_cast<const int*>(p + kBytes), m7) : _mm256_setzero_si256(),
               c + 1, 2);
    }
};

struct KTq1 {
    static constexpr int G = 1, C = 5, kOff = 1, kBytes = 54, kDOff = 52;
    static constexpr bool kSigned = false;
    BONSAI_AVX2 static void codes(const uint8_t* p, int, bool more, __m256i* c) {
        const __m256i m5 = _mm256_setr_epi32(-1, -1, -1, -1, -1, 0, 0, 0);  // qs[32..47], qh[0..3]
        trits5(load32(p), c, 2);
        trits5(more ? load32(p + 32) : _mm256_maskload_epi32(reinterpret_cast<const int*>(p + 32), m5), c + 1, 2);
    }
};

struct KTq2 {
    static constexpr int G = 1, C = 4, kOff = 1, kBytes = 66, kDOff = 64;
    static constexpr bool kSigned = false;
    BONSAI_AVX2 static void codes(const uint8_t* p, int, bool, __m256i* c) {
        fields2(load32(p), c, 2);
        fields2(load32(p + 32), c + 1, 2);
    }
};

struct KQ2g64 {
    static constexpr int G = 4, C = 4, kOff = 1, kBytes = 18, kDOff = 0;
    static constexpr bool kSigned = false;
    BONSAI_AVX2 static void codes(const uint8_t* p, int nin, bool, __m256i* c) {
        fields2(join128(load16_or_zero(p + 2, true), load16_or_zero(p + 2 + kBytes, nin > 1)), c, 2);
        fields2(join128(load16_or_zero(p + 2 + 2 * kBytes, nin > 2), load16_or_zero(p + 2 + 3 * kBytes, nin > 3)),
                c + 1, 2);
    }
};

struct KQ2g128 {
    static constexpr int G = 2, C = 4, kOff = 1, kBytes = 34, kDOff = 0;
    static constexpr bool kSigned = false;
    BONSAI_AVX2 static void codes(const uint8_t* p, int nin, bool, __m256i* c) {
        fields2(load32(p + 2), c, 2);
        fields2(nin > 1 ? load32(p + 2 + kBytes) : _mm256_setzero_si256(), c + 1, 2);
    }
};

struct KQ4 {
    static constexpr int G = 4, C = 2, kOff = 8, kBytes = 18, kDOff = 0;
    static constexpr bool kSigned = false;
    BONSAI_AVX2 static void codes(const uint8_t* p, int nin, bool, __m256i* c) {
        const __m256i m4 = _mm256_set1_epi8(15);
        const __m256i lo = join128(load16_or_zero(p + 2, true), load16_or_zero(p + 2 + kBytes, nin > 1));
        const __m256i hi = join128(load16_or_zero(p + 2 + 2 * kBytes, nin > 2), load16_or_zero(p + 2 + 3 * kBytes, nin > 3));
        c[0] = _mm256_and_si256(lo, m4);
        c[1] = _mm256_and_si256(hi, m4);
        c[2] = _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
        c[3] = _mm256_and_si256(_mm256_srli_epi16(hi, 4), m4);
    }
};

struct KQ8 {
    static constexpr int G = 2, C = 1, kOff = 0, kBytes = 34, kDOff = 0;
    static constexpr bool kSigned = true;
    BONSAI_AVX2 static void codes(const uint8_t* p, int nin, bool, __m256i* c) {
        c[0] = load32(p + 2);
        c[1] = nin > 1 ? load32(p + 2 + kBytes) : _mm256_setzero_si256();
    }
};

// Dot product of the unit's codes with the activations: s[0] for bytes 0..31, s[1] for 32..63.
template <class K>
BONSAI_AVX2 inline void dot_unit(const __m256i* c, const int8_t* act, __m256i* s) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; ++h) {
        __m256i s16 = _mm256_setzero_si256();
        for (int v = 0; v < K::C; ++v) {
            const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(act + 64 * v + 32 * h));
            const __m256i w = c[2 * v + h];
            if constexpr (K::kSigned)
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)));
            else
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w, a));
        }
        s[h] = _mm256_madd_epi16(s16, ones);
    }
}

// Four accumulators -> per 128-bit chunk [sum s0, sum s1, sum s2, sum s3] over that chunk.
BONSAI_AVX2 inline __m256i reduce4(__m256i s0, __m256i s1, __m256i s2, __m256i s3) {
    const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(s0, s1), _mm256_unpackhi_epi32(s0, s1));
    const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(s2, s3), _mm256_unpackhi_epi32(s2, s3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}

// The four outputs' int32 dot products of block g of the unit (lo = chunks 0, 1; hi = chunks 2, 3).
template <class K>
BONSAI_AVX2 inline __m128i block_isum(__m256i lo, __m256i hi, int g) {
    if constexpr (K::G == 1) {
        const __m256i x = _mm256_add_epi32(lo, hi);
        return _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    } else if constexpr (K::G == 2) {
        const __m256i x = g == 0 ? lo : hi;
        return _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    } else {
        switch (g) {
            case 0: return _mm256_castsi256_si128(lo);
            case 1: return _mm256_extracti128_si256(lo, 1);
            case 2: return _mm256_castsi256_si128(hi);
            default: return _mm256_extracti128_si256(hi, 1);
        }
    }
}

template <class K>
BONSAI_AVX2 inline __m128 block_fma(__m128 acc, __m128i isum, __m128i asum4, __m128 d4) {
    if constexpr (K::kOff == 1) isum = _mm_sub_epi32(isum, asum4);
    if constexpr (K::kOff == 8) isum = _mm_sub_epi32(isum, _mm_slli_epi32(asum4, 3));
    return _mm_fmadd_ps(d4, _mm_cvtepi32_ps(isum), acc);
}

BONSAI_AVX2 inline __m128 load_d4(const uint8_t* const* rows, int64_t off) {
    const __m128i h = _mm_setr_epi16(static_cast<short>(load_u16(rows[0] + off)), static_cast<short>(load_u16(rows[1] + off)),
                                     static_cast<short>(load_u16(rows[2] + off)), static_cast<short>(load_u16(rows[3] + off)),
                                     0, 0, 0, 0);
    return _mm_cvtph_ps(h);
}

// 4 rows x 1 token.
template <class K>
BONSAI_AVX2 __m128 tile_rows(const uint8_t* const* rows, const int8_t* act, const int32_t* asum, int64_t nb,
                                  int64_t prefetch_stride) {
    const int64_t nu = (nb + K::G - 1) / K::G;
    constexpr int64_t unit_bytes = static_cast<int64_t>(K::G) * K::kBytes;
    __m128 acc = _mm_setzero_ps();
    for (int64_t u = 0; u < nu; ++u) {
        const int nin = static_cast<int>(std::min<int64_t>(K::G, nb - u * K::G));
        const int8_t* au = act + u * K::C * 64;
        __m256i s[4][2];
        for (int i = 0; i < 4; ++i) {
            const uint8_t* p = rows[i] + u * unit_bytes;
            _mm_prefetch(reinterpret_cast<const char*>(p + prefetch_stride), kStreamPrefetchHint);
            __m256i c[2 * K::C];
            K::codes(p, nin, u + 1 < nu, c);
            dot_unit<K>(c, au, s[i]);
        }
        const __m256i lo = reduce4(s[0][0], s[1][0], s[2][0], s[3][0]);
        const __m256i hi = reduce4(s[0][1], s[1][1], s[2][1], s[3][1]);
        for (int g = 0; g < nin; ++g) {
            const int64_t b = u * K::G + g;
            acc = block_fma<K>(acc, block_isum<K>(lo, hi, g), _mm_set1_epi32(asum[b]),
                               load_d4(rows, b * K::kBytes + K::kDOff));
        }
    }
    return acc;
}

// 1 row x 4*kGroups tokens (kGroups <= 2), one float lane per token: acc[i] is token t0 + i.
template <class K, int kGroups>
BONSAI_AVX2 __m256 tile_tokens(const uint8_t* row, const int8_t* const* act, const int32_t* asum_t, int64_t t_pad,
                               int64_t nb) {
    const int64_t nu = (nb + K::G - 1) / K::G;
    constexpr int64_t unit_bytes = static_cast<int64_t>(K::G) * K::kBytes;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t u = 0; u < nu; ++u) {
        const int nin = static_cast<int>(std::min<int64_t>(K::G, nb - u * K::G));
        const uint8_t* p = row + u * unit_bytes;
        __m256i c[2 * K::C];
        K::codes(p, nin, u + 1 < nu, c);
        const int64_t aoff = u * K::C * 64;
        __m256i lo[kGroups], hi[kGroups];
#pragma GCC unroll 2
        for (int grp = 0; grp < kGroups; ++grp) {
            __m256i s[4][2];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) dot_unit<K>(c, act[4 * grp + i] + aoff, s[i]);
            lo[grp] = reduce4(s[0][0], s[1][0], s[2][0], s[3][0]);
            hi[grp] = reduce4(s[0][1], s[1][1], s[2][1], s[3][1]);
        }
        for (int g = 0; g < nin; ++g) {
            const int64_t b = u * K::G + g;
            __m256i isum = _mm256_castsi128_si256(block_isum<K>(lo[0], hi[0], g));
            if constexpr (kGroups > 1) isum = _mm256_inserti128_si256(isum, block_isum<K>(lo[1], hi[1], g), 1);
            const __m256i as = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(asum_t + b * t_pad));
            if constexpr (K::kOff == 1) isum = _mm256_sub_epi32(isum, as);
            if constexpr (K::kOff == 8) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(as, 3));
            const __m256 d = _mm256_set1_ps(fp16_to_fp32(load_u16(p + g * K::kBytes + K::kDOff)));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
        }
    }
    return acc;
}

template <class K>
BONSAI_AVX2 void run_int8(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y) {
    const int64_t nb = a.n_blocks, rows = w.rows;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    if (a.n_tokens < 3) {  // (two tokens: each tile for both while its rows are in L1)
        for (int64_t r = r0; r < r1; r += 4) {
            const uint8_t* rp[4];
            for (int i = 0; i < 4; ++i) rp[i] = base + std::min(r + i, r1 - 1) * w.row_bytes;
            for (int64_t t = 0; t < a.n_tokens; ++t) {
                const int8_t* act = a.slots + t * a.slot_bytes;
                const int32_t* asum = a.asum + t * nb;
                alignas(16) float out[4];
                _mm_store_ps(out, _mm_mul_ps(tile_rows<K>(rp, act, asum, nb, kPrefetchRows * static_cast<int64_t>(w.row_bytes)), _mm_set1_ps(a.scale[t])));
                for (int i = 0; i < 4 && r + i < r1; ++i) y[t * rows + r + i] = out[i];
            }
        }
        return;
    }
    // Token tiles outside, rows inside: a tile's activations stay in cache while the rows stream.
    for (int64_t t0 = 0; t0 < a.n_tokens; t0 += 8) {
        const int count = static_cast<int>(std::min<int64_t>(8, a.n_tokens - t0));
        const int8_t* act[8];
        for (int i = 0; i < 8; ++i) act[i] = a.slots + (t0 + std::min(i, count - 1)) * a.slot_bytes;
        const __m256 sc = _mm256_loadu_ps(a.scale + t0);
        const int32_t* asum_t = a.asum_t + t0;
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t* row = base + r * w.row_bytes;
            const __m256 acc = count > 4 ? tile_tokens<K, 2>(row, act, asum_t, a.t_pad, nb)
                                         : tile_tokens<K, 1>(row, act, asum_t, a.t_pad, nb);
            alignas(32) float out[8];
            _mm256_store_ps(out, _mm256_mul_ps(acc, sc));
            for (int i = 0; i < count; ++i) y[(t0 + i) * rows + r] = out[i];
        }
    }
}

}  // namespace

BONSAI_AVX2 void matmul_int8_avx2(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y) {
    switch (w.type) {
        case TYPE_PTQ1_0: run_int8<KPtq1>(w, a, r0, r1, y); break;
        case TYPE_TQ1_0: run_int8<KTq1>(w, a, r0, r1, y); break;
        case TYPE_TQ2_0: run_int8<KTq2>(w, a, r0, r1, y); break;
        case TYPE_Q2_0: run_int8<KQ2g64>(w, a, r0, r1, y); break;
        case TYPE_Q2_0_G128:
        case TYPE_PQ2_0: run_int8<KQ2g128>(w, a, r0, r1, y); break;
        case TYPE_Q4_0: run_int8<KQ4>(w, a, r0, r1, y); break;
        case TYPE_Q8_0: run_int8<KQ8>(w, a, r0, r1, y); break;
        default: break;
    }
}

}  // namespace bonsai::cpu
