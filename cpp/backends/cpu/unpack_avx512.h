// AVX-512 unpacking of packed weight codes into one code byte per weight, shared by the one-token
// INT8 tiles (matmul_int8_avx512_impl.h) and the multi-token GEMM (matmul_int8_gemm_impl.h).
// The including header defines BONSAI_UNPACK (the function attribute with its target) and
// BONSAI_UNPACK_LUT (1: AVX-512 VBMI byte-table lookups; 0: 16-bit multiplies); each translation
// unit includes it once, inside no namespace.
//
// Base-3 bytes hold five trits: trit n of byte b is ((b * 3^n mod 256) * 3) >> 8.
//   trit_n: trit n of every byte, so tiles can unpack trit n of several rows before n + 1.
//     LUT: trit 0 by two vpermi2b lookups into the halves of its 256-byte table and a blend on
//     the byte's top bit; trits 1..4 by one lookup each of a shared key (trit_key: one merge-masked
//     lookup maps every byte >= 128 to a stand-in below 128 with the same trits 1..4).
//     Multiplies: a 16-bit multiply by 3^n << 8 leaves (b * 3^n mod 256) of the even byte in the
//     high byte (the odd byte is masked to the high byte and multiplied by 3^n), and vpmulhuw by 3
//     (or 3 << 8) takes the trit.
//   trits5: all five trit vectors at once.
// fields2: the four 2-bit fields of every byte (TQ2_0, Q2_0, PQ2_0). join256 / load4x16 / load4x18 /
// load2x32: a unit's bytes gathered from the blocks of a row (scales4x18: the scales of load4x18).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace bonsai::cpu {
namespace {

#if BONSAI_UNPACK_LUT
struct TritTables {
    alignas(64) uint8_t t0[256];  // t0[b] = trit 0 of byte b (0, 1, 2)
    // lo[n][i] = trit n of byte i < 128 (n >= 1). key[b - 128] = an index i < 128 whose trits 1..4
    // all equal those of byte b >= 128. One exists for every byte (for the 243 codes of a base-3
    // byte it is the code of b's value less its leading trit; the constructor searches all 256),
    // so one lookup maps every byte to a stand-in below 128 for all of trits 1..4, and each of
    // those then needs a single 128-entry lookup.
    alignas(64) uint8_t lo[5][128];
    alignas(64) uint8_t key[128];
    static int trit(int b, int n) {
        constexpr int pow3[5] = {1, 3, 9, 27, 81};
        return (static_cast<uint8_t>(b * pow3[n]) * 3) >> 8;
    }
    static bool same_high_trits(int a, int b) {
        for (int n = 1; n < 5; ++n)
            if (trit(a, n) != trit(b, n)) return false;
        return true;
    }
    TritTables() {
        for (int b = 0; b < 256; ++b) t0[b] = static_cast<uint8_t>(trit(b, 0));
        for (int n = 1; n < 5; ++n)
            for (int i = 0; i < 128; ++i) lo[n][i] = static_cast<uint8_t>(trit(i, n));
        for (int b = 128; b < 256; ++b) {
            int i = 0;
            while (!same_high_trits(i, b)) ++i;  // ends below 128 for every b (see above)
            key[b - 128] = static_cast<uint8_t>(i);
        }
    }
};
const TritTables kTrits;

// Every byte of src below 128 as itself, the others as their stand-in TritTables::key.
// top: the bytes' top bits.
BONSAI_UNPACK inline __m512i trit_key(__m512i src, __mmask64 top) {
    const __m512i* k = reinterpret_cast<const __m512i*>(kTrits.key);
    return _mm512_mask2_permutex2var_epi8(_mm512_load_si512(k), src, top, _mm512_load_si512(k + 1));
}

// Trit n of every byte of src; key = trit_key(src, top). Trit 0: lookups in both halves of t0
// and a blend on the top bit; trits 1..4: one lookup of the key.
BONSAI_UNPACK inline __m512i trit_n(__m512i src, __m512i key, __mmask64 top, int n) {
    if (n == 0) {
        const __m512i* t = reinterpret_cast<const __m512i*>(kTrits.t0);
        const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(t), src, _mm512_load_si512(t + 1));
        const __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(t + 2), src, _mm512_load_si512(t + 3));
        return _mm512_mask_blend_epi8(top, lo, hi);
    }
    const __m512i* lo = reinterpret_cast<const __m512i*>(kTrits.lo[n]);
    return _mm512_permutex2var_epi8(_mm512_load_si512(lo), key, _mm512_load_si512(lo + 1));
}
#else
BONSAI_UNPACK inline __m512i trit_key(__m512i src, __mmask64) { return src; }

// Trit n of every byte of src by 16-bit multiplies (key and top are not needed).
BONSAI_UNPACK inline __m512i trit_n(__m512i src, __m512i, __mmask64, int n) {
    constexpr short pow3[5] = {1, 3, 9, 27, 81};
    const __m512i hi_mask = _mm512_set1_epi16(static_cast<short>(0xFF00));
    const __m512i odd = _mm512_and_si512(src, hi_mask);
    const __m512i pe = n == 0 ? _mm512_slli_epi16(src, 8)
                              : _mm512_mullo_epi16(src, _mm512_set1_epi16(static_cast<short>(pow3[n] << 8)));
    const __m512i po = n == 0 ? odd : _mm512_mullo_epi16(odd, _mm512_set1_epi16(pow3[n]));
    const __m512i te = _mm512_mulhi_epu16(pe, _mm512_set1_epi16(3));
    const __m512i to = _mm512_mulhi_epu16(po, _mm512_set1_epi16(3 << 8));
    return _mm512_ternarylogic_epi32(te, to, hi_mask, 0xF8);  // te | (to & hi_mask)
}
#endif

// All five trit vectors of src.
BONSAI_UNPACK inline void trits5(__m512i src, __m512i* c) {
    const __mmask64 top = _mm512_movepi8_mask(src);
    const __m512i key = trit_key(src, top);
    for (int n = 0; n < 5; ++n) c[n] = trit_n(src, key, top, n);
}

BONSAI_UNPACK inline void fields2(__m512i src, __m512i* c) {
    const __m512i m3 = _mm512_set1_epi8(3);
    c[0] = _mm512_and_si512(src, m3);
#if BONSAI_UNPACK_LUT
    // GFNI: one affine bit-matrix transform per field; output bits 0 and 1 (matrix bytes 7 and 6)
    // take input bits 2l and 2l + 1, the other output bits are zero.
    for (int l = 1; l < 4; ++l) {
        const long long m = static_cast<long long>((uint64_t{1} << (2 * l)) << 56 | (uint64_t{1} << (2 * l + 1)) << 48);
        c[l] = _mm512_gf2p8affine_epi64_epi8(src, _mm512_set1_epi64(m), 0);
    }
#else
    c[1] = _mm512_and_si512(_mm512_srli_epi16(src, 2), m3);
    c[2] = _mm512_and_si512(_mm512_srli_epi16(src, 4), m3);
    c[3] = _mm512_and_si512(_mm512_srli_epi16(src, 6), m3);
#endif
}

BONSAI_UNPACK inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Four 16-byte pieces at p + 2 + i * stride (i < nin), zeros for the others.
BONSAI_UNPACK inline __m512i load4x16(const uint8_t* p, int stride, int nin) {
    const __m128i z = _mm_setzero_si128();
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    const __m128i b = nin > 1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + stride)) : z;
    const __m128i c = nin > 2 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + 2 * stride)) : z;
    const __m128i d = nin > 3 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + 3 * stride)) : z;
    return join256(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1),
                   _mm256_inserti128_si256(_mm256_castsi128_si256(c), d, 1));
}

// The same four 16-byte pieces for 18-byte blocks (Q2_0, Q4_0: fp16 d, then 16 code bytes), from
// one 64-byte load of the unit's start (returned in raw: it holds the four d, words 0, 9, 18, 27)
// and one 8-byte load of its end, gathered by a word permute (every piece starts at an even byte).
// Blocks past nin (a row's last, partial unit) read as zeros and are not touched in memory.
BONSAI_UNPACK inline __m512i load4x18(const uint8_t* p, int nin, __m512i& raw) {
    alignas(64) static constexpr int16_t kGather[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12,
                                                        13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24,
                                                        25, 26, 28, 29, 30, 31, 32, 33, 34, 35};
    __m512i tail;
    if (nin == 4) {
        raw = _mm512_loadu_si512(p);
        tail = _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 64)));
    } else {
        raw = _mm512_maskz_loadu_epi8((uint64_t{1} << (18 * nin)) - 1, p);
        tail = _mm512_setzero_si512();
    }
    return _mm512_permutex2var_epi16(raw, _mm512_load_si512(kGather), tail);
}

// The 16 fp16 scales of load4x18's raw vectors of four rows as f32, block-major: lanes 4g + i =
// block g of row i.
BONSAI_UNPACK inline __m512 scales4x18(const __m512i* raw) {
    alignas(64) static constexpr int16_t kPick[32] = {0, 32, 9, 41, 18, 50, 27, 59};  // r0/r1 (r2/r3) of b0..b3
    alignas(64) static constexpr int16_t kOrder[32] = {0, 1, 32, 33, 2, 3, 34, 35, 4, 5, 36, 37, 6, 7, 38, 39};
    const __m512i pick = _mm512_load_si512(kPick);
    const __m512i a = _mm512_permutex2var_epi16(raw[0], pick, raw[1]);
    const __m512i b = _mm512_permutex2var_epi16(raw[2], pick, raw[3]);
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(a, _mm512_load_si512(kOrder), b)));
}

// Two 32-byte pieces at p + off and p + off + stride (the second only if nin > 1).
BONSAI_UNPACK inline __m512i load2x32(const uint8_t* p, int off, int stride, int nin) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off));
    const __m256i hi = nin > 1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off + stride))
                               : _mm256_setzero_si256();
    return join256(lo, hi);
}

}  // namespace
}  // namespace bonsai::cpu
