// AVX-512 VNNI INT8 matmul (compiled for that target by function attributes, chosen at run time).
//
// Weights are read one unit at a time (int8_layout.h): the unit's bytes go into a zmm, the codes are
// unpacked into C zmm vectors and multiplied with the token's slot-ordered activations by vpdpbusd
// (unsigned code x signed activation, exact int32). Base-3 bytes are unpacked without division:
// for trit n, the 16-bit multiply by 3^n (shifted into the high byte) keeps (b * 3^n) mod 256 in
// the high byte, and the high half of that times 3 is the trit. 2-bit and 4-bit codes are shifts
// and masks; Q8_0 uses |w| and the activation negated where w < 0.
//
// Tiles: decode (fewer than 4 tokens) computes 4 rows x 1 token, sharing the activation loads;
// prefill computes 1 row x up to 16 tokens, unpacking each unit once for all of them. The four
// int32 accumulators of a group are reduced together (an unpack/add transpose) to one int32 per
// (block, output), then acc = fma(d_b, isum_b - off * asum_b, acc) block after block, and
// y = acc * s: exactly the scalar kernel's operations, so the results are bit-identical.
// GCC 12 warns about the deliberately undefined pass-through operands inside its AVX-512 headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "fp16.h"
#include "matmul_kernels.h"

#define BONSAI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace bonsai::cpu {

namespace {

constexpr int kPrefetchBytes = 512;

BONSAI_AVX512 inline void trits5(__m512i src, __m512i* c) {
    const __m512i hi_mask = _mm512_set1_epi16(static_cast<short>(0xFF00));
    const __m512i three = _mm512_set1_epi16(3);
    const __m512i three_hi = _mm512_set1_epi16(3 << 8);
    const __m512i odd = _mm512_and_si512(src, hi_mask);
    constexpr short pow3[5] = {1, 3, 9, 27, 81};
    for (int n = 0; n < 5; ++n) {
        const __m512i pe = n == 0 ? _mm512_slli_epi16(src, 8)
                                  : _mm512_mullo_epi16(src, _mm512_set1_epi16(static_cast<short>(pow3[n] << 8)));
        const __m512i po = n == 0 ? odd : _mm512_mullo_epi16(odd, _mm512_set1_epi16(pow3[n]));
        const __m512i te = _mm512_mulhi_epu16(pe, three);
        const __m512i to = _mm512_mulhi_epu16(po, three_hi);
        c[n] = _mm512_ternarylogic_epi32(te, to, hi_mask, 0xF8);  // te | (to & hi_mask)
    }
}

BONSAI_AVX512 inline void fields2(__m512i src, __m512i* c) {
    const __m512i m3 = _mm512_set1_epi8(3);
    c[0] = _mm512_and_si512(src, m3);
    c[1] = _mm512_and_si512(_mm512_srli_epi16(src, 2), m3);
    c[2] = _mm512_and_si512(_mm512_srli_epi16(src, 4), m3);
    c[3] = _mm512_and_si512(_mm512_srli_epi16(src, 6), m3);
}

BONSAI_AVX512 inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Four 16-byte pieces at p + 2 + i * stride (i < nin), zeros for the others.
BONSAI_AVX512 inline __m512i load4x16(const uint8_t* p, int stride, int nin) {
    const __m128i z = _mm_setzero_si128();
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    const __m128i b = nin > 1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + stride)) : z;
    const __m128i c = nin > 2 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + 2 * stride)) : z;
    const __m128i d = nin > 3 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + 3 * stride)) : z;
    return join256(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1),
                   _mm256_inserti128_si256(_mm256_castsi128_si256(c), d, 1));
}

// Two 32-byte pieces at p + off and p + off + stride (the second only if nin > 1).
BONSAI_AVX512 inline __m512i load2x32(const uint8_t* p, int off, int stride, int nin) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off));
    const __m256i hi = nin > 1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off + stride))
                               : _mm256_setzero_si256();
    return join256(lo, hi);
}

struct KPtq1 {
    static constexpr int G = 2, C = 5, kOff = 1, kBytes = 28, kDOff = 26;
    static constexpr bool kSigned = false;
    BONSAI_AVX512 static void codes(const uint8_t* p, int nin, __m512i* c) {
        const __mmask32 m = (1u << 26) - 1;  // qs + qh of one block
        const __m256i lo = _mm256_maskz_loadu_epi8(m, p);
        const __m256i hi = nin > 1 ? _mm256_maskz_loadu_epi8(m, p + kBytes) : _mm256_setzero_si256();
        trits5(join256(lo, hi), c);
    }
};

struct KTq1 {
    static constexpr int G = 1, C = 5, kOff = 1, kBytes = 54, kDOff = 52;
    static constexpr bool kSigned = false;
    BONSAI_AVX512 static void codes(const uint8_t* p, int, __m512i* c) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        const __m256i hi = _mm256_maskz_loadu_epi8((1u << 20) - 1, p + 32);  // qs[32..47], qh[0..3]
        trits5(join256(lo, hi), c);
    }
};

struct KTq2 {
    static constexpr int G = 1, C = 4, kOff = 1, kBytes = 66, kDOff = 64;
    static constexpr bool kSigned = false;
    BONSAI_AVX512 static void codes(const uint8_t* p, int, __m512i* c) { fields2(_mm512_loadu_si512(p), c); }
};

struct KQ2g64 {
    static constexpr int G = 4, C = 4, kOff = 1, kBytes = 18, kDOff = 0;
    static constexpr bool kSigned = false;
    BONSAI_AVX512 static void codes(const uint8_t* p, int nin, __m512i* c) { fields2(load4x16(p, kBytes, nin), c); }
};

struct KQ2g128 {
    static constexpr int G = 2, C = 4, kOff = 1, kBytes = 34, kDOff = 0;
    static constexpr bool kSigned = false;
    BONSAI_AVX512 static void codes(const uint8_t* p, int nin, __m512i* c) { fields2(load2x32(p, 2, kBytes, nin), c); }
};

struct KQ4 {
    static constexpr int G = 4, C = 2, kOff = 8, kBytes = 18, kDOff = 0;
    static constexpr bool kSigned = false;
    BONSAI_AVX512 static void codes(const uint8_t* p, int nin, __m512i* c) {
        const __m512i src = load4x16(p, kBytes, nin);
        const __m512i m4 = _mm512_set1_epi8(15);
        c[0] = _mm512_and_si512(src, m4);
        c[1] = _mm512_and_si512(_mm512_srli_epi16(src, 4), m4);
    }
};

struct KQ8 {
    static constexpr int G = 2, C = 1, kOff = 0, kBytes = 34, kDOff = 0;
    static constexpr bool kSigned = true;
    BONSAI_AVX512 static void codes(const uint8_t* p, int nin, __m512i* c) { c[0] = load2x32(p, 2, kBytes, nin); }
};

template <class K>
BONSAI_AVX512 inline __m512i dot_unit(const __m512i* c, const int8_t* act) {
    __m512i s = _mm512_setzero_si512();
    for (int v = 0; v < K::C; ++v) {
        const __m512i a = _mm512_load_si512(act + 64 * v);
        if constexpr (K::kSigned) {
            const __mmask64 neg = _mm512_movepi8_mask(c[v]);
            const __m512i sa = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
            s = _mm512_dpbusd_epi32(s, _mm512_abs_epi8(c[v]), sa);
        } else {
            s = _mm512_dpbusd_epi32(s, c[v], a);
        }
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
    return _mm_fmadd_ps(d4, _mm_cvtepi32_ps(isum), acc);
}

BONSAI_AVX512 inline __m128 load_d4(const uint8_t* const* rows, int64_t off) {
    const __m128i h = _mm_setr_epi16(static_cast<short>(load_u16(rows[0] + off)), static_cast<short>(load_u16(rows[1] + off)),
                                     static_cast<short>(load_u16(rows[2] + off)), static_cast<short>(load_u16(rows[3] + off)),
                                     0, 0, 0, 0);
    return _mm_cvtph_ps(h);
}

// 4 rows x 1 token.
template <class K>
BONSAI_AVX512 __m128 tile_rows(const uint8_t* const* rows, const int8_t* act, const int32_t* asum, int64_t nb) {
    const int64_t nu = (nb + K::G - 1) / K::G;
    constexpr int64_t unit_bytes = static_cast<int64_t>(K::G) * K::kBytes;
    __m128 acc = _mm_setzero_ps();
    for (int64_t u = 0; u < nu; ++u) {
        const int nin = static_cast<int>(std::min<int64_t>(K::G, nb - u * K::G));
        const int8_t* au = act + u * K::C * 64;
        __m512i s[4];
        for (int i = 0; i < 4; ++i) {
            const uint8_t* p = rows[i] + u * unit_bytes;
            _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
            __m512i c[K::C];
            K::codes(p, nin, c);
            s[i] = dot_unit<K>(c, au);
        }
        const __m512i red = reduce4(s);
        for (int g = 0; g < nin; ++g) {
            const int64_t b = u * K::G + g;
            acc = block_fma<K>(acc, block_isum<K>(red, g), _mm_set1_epi32(asum[b]),
                               load_d4(rows, b * K::kBytes + K::kDOff));
        }
    }
    return acc;
}

// 1 row x 4*kGroups tokens.
template <class K, int kGroups>
BONSAI_AVX512 void tile_tokens(const uint8_t* row, const int8_t* const* act, const int32_t* const* asum,
                               int64_t nb, __m128* acc) {
    const int64_t nu = (nb + K::G - 1) / K::G;
    constexpr int64_t unit_bytes = static_cast<int64_t>(K::G) * K::kBytes;
    for (int grp = 0; grp < kGroups; ++grp) acc[grp] = _mm_setzero_ps();
    for (int64_t u = 0; u < nu; ++u) {
        const int nin = static_cast<int>(std::min<int64_t>(K::G, nb - u * K::G));
        const uint8_t* p = row + u * unit_bytes;
        __m512i c[K::C];
        K::codes(p, nin, c);
        const int64_t aoff = u * K::C * 64;
        for (int grp = 0; grp < kGroups; ++grp) {
            __m512i s[4];
            for (int i = 0; i < 4; ++i) s[i] = dot_unit<K>(c, act[4 * grp + i] + aoff);
            const __m512i red = reduce4(s);
            const int32_t* const* as = asum + 4 * grp;
            for (int g = 0; g < nin; ++g) {
                const int64_t b = u * K::G + g;
                const __m128 d4 = _mm_set1_ps(half_to_float(load_u16(p + g * K::kBytes + K::kDOff)));
                acc[grp] = block_fma<K>(acc[grp], block_isum<K>(red, g),
                                        _mm_setr_epi32(as[0][b], as[1][b], as[2][b], as[3][b]), d4);
            }
        }
    }
}

template <class K>
BONSAI_AVX512 void run_int8(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y) {
    const int64_t nb = a.n_blocks, rows = w.rows;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    if (a.n_tokens < 4) {
        for (int64_t t = 0; t < a.n_tokens; ++t) {
            const int8_t* act = a.slots + t * a.slot_bytes;
            const int32_t* asum = a.asum + t * nb;
            for (int64_t r = r0; r < r1; r += 4) {
                const uint8_t* rp[4];
                for (int i = 0; i < 4; ++i) rp[i] = base + std::min(r + i, r1 - 1) * w.row_bytes;
                alignas(16) float out[4];
                _mm_store_ps(out, _mm_mul_ps(tile_rows<K>(rp, act, asum, nb), _mm_set1_ps(a.scale[t])));
                for (int i = 0; i < 4 && r + i < r1; ++i) y[t * rows + r + i] = out[i];
            }
        }
        return;
    }
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = base + r * w.row_bytes;
        for (int64_t t0 = 0; t0 < a.n_tokens; t0 += 16) {
            const int count = static_cast<int>(std::min<int64_t>(16, a.n_tokens - t0));
            const int groups = (count + 3) / 4;
            const int8_t* act[16];
            const int32_t* asum[16];
            alignas(16) float sc[16];
            for (int i = 0; i < 16; ++i) {
                const int64_t t = t0 + std::min(i, count - 1);
                act[i] = a.slots + t * a.slot_bytes;
                asum[i] = a.asum + t * nb;
                sc[i] = a.scale[t];
            }
            __m128 acc[4];
            switch (groups) {
                case 1: tile_tokens<K, 1>(row, act, asum, nb, acc); break;
                case 2: tile_tokens<K, 2>(row, act, asum, nb, acc); break;
                case 3: tile_tokens<K, 3>(row, act, asum, nb, acc); break;
                default: tile_tokens<K, 4>(row, act, asum, nb, acc); break;
            }
            alignas(16) float out[16];
            for (int grp = 0; grp < groups; ++grp)
                _mm_store_ps(out + 4 * grp, _mm_mul_ps(acc[grp], _mm_load_ps(sc + 4 * grp)));
            for (int i = 0; i < count; ++i) y[(t0 + i) * rows + r] = out[i];
        }
    }
}

}  // namespace

BONSAI_AVX512 void matmul_int8_avx512(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y) {
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
