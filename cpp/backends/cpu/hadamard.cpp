// Blockwise FWHT kernels (see hadamard.h for the algorithm and the bit-exactness rule).
//
// Scalar: sign pass, log2(B) butterfly stages over the block, scale pass (the reference).
// SIMD (AVX2: W = 8 floats, AVX-512: W = 16): pass A loads W values (times the signs when
// rotating), runs the stages h < W inside the register (a lane permute by i ^ h, then u + v in the
// lanes with (i & h) == 0 and u - v in the others) and stores; pass B runs the stages h >= W as
// vector butterflies between registers h apart, the last stage scaling (and applying the signs
// when unrotating) before its store. A block of B <= 2048 floats (8 KiB) stays in L1 throughout.
#include "hadamard.h"

#include <cmath>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace bonsai::cpu {

namespace {

void butterflies_scalar(float* a, int64_t block) {
    for (int64_t h = 1; h < block; h <<= 1) {
        for (int64_t i = 0; i < block; i += 2 * h) {
            for (int64_t j = i; j < i + h; ++j) {
                const float u = a[j], v = a[j + h];
                a[j] = u + v;
                a[j + h] = u - v;
            }
        }
    }
}

void rotate_scalar(const float* x, const float* s, int64_t n, int64_t block, float* out) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(block));
    for (int64_t b = 0; b < n; b += block) {
        float* a = out + b;
        for (int64_t i = 0; i < block; ++i) a[i] = s ? x[b + i] * s[b + i] : x[b + i];
        butterflies_scalar(a, block);
        for (int64_t i = 0; i < block; ++i) a[i] = a[i] * scale;
    }
}

void unrotate_scalar(const float* x, const float* s, int64_t n, int64_t block, float* out) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(block));
    for (int64_t b = 0; b < n; b += block) {
        float* a = out + b;
        for (int64_t i = 0; i < block; ++i) a[i] = x[b + i];
        butterflies_scalar(a, block);
        for (int64_t i = 0; i < block; ++i) a[i] = s ? (a[i] * scale) * s[b + i] : a[i] * scale;
    }
}

#if defined(__x86_64__) || defined(__i386__)
#define BONSAI_FWHT_AVX2 __attribute__((target("avx2,fma")))
#define BONSAI_FWHT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

// --- AVX2, W = 8 ---
template <int H, int MASK>
BONSAI_FWHT_AVX2 inline __m256 stage_in_reg_avx2(__m256 a) {
    const __m256i idx = _mm256_setr_epi32(0 ^ H, 1 ^ H, 2 ^ H, 3 ^ H, 4 ^ H, 5 ^ H, 6 ^ H, 7 ^ H);
    const __m256 v = _mm256_permutevar8x32_ps(a, idx);
    return _mm256_blend_ps(_mm256_add_ps(a, v), _mm256_sub_ps(v, a), MASK);
}

// Runs the stages h >= W of one block in place; the last one multiplies by scale (and by s).
BONSAI_FWHT_AVX2 void stages_avx2(float* a, int64_t block, float scale, const float* s) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (int64_t h = 8; h < block; h <<= 1) {
        const bool last = 2 * h == block;
        for (int64_t i = 0; i < block; i += 2 * h) {
            for (int64_t j = i; j < i + h; j += 8) {
                const __m256 u = _mm256_loadu_ps(a + j), v = _mm256_loadu_ps(a + j + h);
                __m256 lo = _mm256_add_ps(u, v), hi = _mm256_sub_ps(u, v);
                if (last) {
                    lo = _mm256_mul_ps(lo, sc);
                    hi = _mm256_mul_ps(hi, sc);
                    if (s) {
                        lo = _mm256_mul_ps(lo, _mm256_loadu_ps(s + j));
                        hi = _mm256_mul_ps(hi, _mm256_loadu_ps(s + j + h));
                    }
                }
                _mm256_storeu_ps(a + j, lo);
                _mm256_storeu_ps(a + j + h, hi);
            }
        }
    }
}

BONSAI_FWHT_AVX2 void fwht_avx2(const float* x, const float* s_in, const float* s_out, int64_t n, int64_t block,
                                float* out) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(block));
    for (int64_t b = 0; b < n; b += block) {
        float* a = out + b;
        for (int64_t i = 0; i < block; i += 8) {
            __m256 r = _mm256_loadu_ps(x + b + i);
            if (s_in) r = _mm256_mul_ps(r, _mm256_loadu_ps(s_in + b + i));
            r = stage_in_reg_avx2<1, 0xAA>(r);
            r = stage_in_reg_avx2<2, 0xCC>(r);
            r = stage_in_reg_avx2<4, 0xF0>(r);
            _mm256_storeu_ps(a + i, r);
        }
        stages_avx2(a, block, scale, s_out ? s_out + b : nullptr);
    }
}

// --- AVX-512, W = 16 ---
BONSAI_FWHT_AVX512 inline __m512 stage_in_reg_avx512(__m512 a, int h) {
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i hv = _mm512_set1_epi32(h);
    const __m512 v = _mm512_mask_permutexvar_ps(a, 0xFFFF, _mm512_xor_si512(lanes, hv), a);
    const __mmask16 upper = _mm512_test_epi32_mask(lanes, hv);  // lanes with (i & h) != 0
    return _mm512_mask_sub_ps(_mm512_add_ps(a, v), upper, v, a);
}

BONSAI_FWHT_AVX512 void stages_avx512(float* a, int64_t block, float scale, const float* s) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t h = 16; h < block; h <<= 1) {
        const bool last = 2 * h == block;
        for (int64_t i = 0; i < block; i += 2 * h) {
            for (int64_t j = i; j < i + h; j += 16) {
                const __m512 u = _mm512_loadu_ps(a + j), v = _mm512_loadu_ps(a + j + h);
                __m512 lo = _mm512_add_ps(u, v), hi = _mm512_sub_ps(u, v);
                if (last) {
                    lo = _mm512_mul_ps(lo, sc);
                    hi = _mm512_mul_ps(hi, sc);
                    if (s) {
                        lo = _mm512_mul_ps(lo, _mm512_loadu_ps(s + j));
                        hi = _mm512_mul_ps(hi, _mm512_loadu_ps(s + j + h));
                    }
                }
                _mm512_storeu_ps(a + j, lo);
                _mm512_storeu_ps(a + j + h, hi);
            }
        }
    }
}

BONSAI_FWHT_AVX512 void fwht_avx512(const float* x, const float* s_in, const float* s_out, int64_t n,
                                    int64_t block, float* out) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(block));
    for (int64_t b = 0; b < n; b += block) {
        float* a = out + b;
        for (int64_t i = 0; i < block; i += 16) {
            __m512 r = _mm512_loadu_ps(x + b + i);
            if (s_in) r = _mm512_mul_ps(r, _mm512_loadu_ps(s_in + b + i));
            r = stage_in_reg_avx512(r, 1);
            r = stage_in_reg_avx512(r, 2);
            r = stage_in_reg_avx512(r, 4);
            r = stage_in_reg_avx512(r, 8);
            _mm512_storeu_ps(a + i, r);
        }
        stages_avx512(a, block, scale, s_out ? s_out + b : nullptr);
    }
}
#endif

// Runs a SIMD variant when the path has one and the block holds at least two of its vectors (pass
// B must run at least one stage to apply the scale); returns false otherwise.
bool fwht_simd(const float* x, const float* s_in, const float* s_out, int64_t n, int64_t block, float* out,
               CpuPath path) {
#if defined(__x86_64__) || defined(__i386__)
    if (path == CpuPath::AVX512 && block >= 32) {
        fwht_avx512(x, s_in, s_out, n, block, out);
        return true;
    }
    if (path != CpuPath::SCALAR && block >= 16) {
        fwht_avx2(x, s_in, s_out, n, block, out);
        return true;
    }
#else
    (void)x, (void)s_in, (void)s_out, (void)n, (void)block, (void)out, (void)path;
#endif
    return false;
}

}  // namespace

void rotate_row(const float* x, const float* signs, int64_t n, int64_t block, float* out, CpuPath path) {
    if (!fwht_simd(x, signs, nullptr, n, block, out, path)) rotate_scalar(x, signs, n, block, out);
}

void unrotate_row(const float* x, const float* signs, int64_t n, int64_t block, float* out, CpuPath path) {
    if (!fwht_simd(x, nullptr, signs, n, block, out, path)) unrotate_scalar(x, signs, n, block, out);
}

void rotate_rows(float* x, int64_t n_tokens, int64_t cols, const Rotation& r, bool inverse, ThreadPool& pool,
                 CpuPath path) {
    auto run = [x, cols, &r, inverse, path](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
            float* row = x + t * cols;
            if (inverse)
                unrotate_row(row, r.signs, cols, r.block, row, path);
            else
                rotate_row(row, r.signs, cols, r.block, row, path);
        }
    };
    if (n_tokens >= 4 * pool.size())
        pool.parallel_for(n_tokens, [&run](int64_t b, int64_t e, int) { run(b, e); });
    else
        run(0, n_tokens);
}

}  // namespace bonsai::cpu
