// Vector exp for the AVX-512 paths of softmax-like code (attention, SwiGLU), and the target
// attribute those AVX-512 paths share (BONSAI_AVX512_MATH).
//
// exp(x) = 2^n * P(r) with n = round(x / ln2), r = x - n ln2 (ln2 split in a high part exact in
// float and a low correction, so r is accurate), |r| <= ln2 / 2, P the degree-6 Taylor polynomial
// (relative error ~2e-7), 2^n applied by vscalefps. x is clamped to [-88, 88] first (NaN stays
// NaN), so the result is finite and positive for every finite x.
#pragma once

// GCC 12 warns about the deliberately undefined pass-through operands inside its AVX-512 headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#define BONSAI_AVX512_MATH __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace bonsai::cpu {

BONSAI_AVX512_MATH inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-88.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

}  // namespace bonsai::cpu
