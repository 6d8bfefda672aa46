// FLOAT-mode matmul kernels for every weight type, one per CPU path.
//
// F32 rows are used in place; F16 rows are converted on the fly (F16C) when there is one token
// (row after row, so the weights stream sequentially from memory) and converted once into scratch
// otherwise; BF16 and quantized rows are dequantized once per row into scratch (block by block,
// block_unpack) and reused for every token. The dot products accumulate
// in f32 with several independent vector accumulators; results are close to, not bit-identical
// with, the scalar path.
// GCC 12 warns about the deliberately undefined pass-through operands inside its AVX-512 headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "block_unpack.h"
#include "bonsai/quants.h"
#include "matmul_kernels.h"

#define BONSAI_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BONSAI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace bonsai::cpu {

namespace {

float dot_scalar(const float* a, const float* b, int64_t n) {
    float s = 0.0f;
    for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
    return s;
}

BONSAI_AVX2 float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

BONSAI_AVX2 float dot_avx2(const float* a, const float* b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 16), _mm256_loadu_ps(b + k + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 24), _mm256_loadu_ps(b + k + 24), s3);
    }
    for (; k + 8 <= n; k += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; k < n; ++k) s += a[k] * b[k];
    return s;
}

BONSAI_AVX2 float dot_f16_avx2(const uint8_t* h, const float* b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * k)));
        const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * k + 16)));
        s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b + k), s0);
        s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(b + k + 8), s1);
    }
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; k < n; ++k) s += fp16_to_fp32(load_u16(h + 2 * k)) * b[k];
    return s;
}

BONSAI_AVX2 void f16_to_f32_avx2(const uint8_t* h, float* out, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * k))));
    for (; k < n; ++k) out[k] = fp16_to_fp32(load_u16(h + 2 * k));
}

BONSAI_AVX512 float dot_avx512(const float* a, const float* b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= n; k += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 16), _mm512_loadu_ps(b + k + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 32), _mm512_loadu_ps(b + k + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 48), _mm512_loadu_ps(b + k + 48), s3);
    }
    for (; k + 16 <= n; k += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), s0);
    if (k < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - k)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

// One F16 row dotted with one f32 vector, one row at a time: consecutive rows are adjacent in
// memory, so a range of rows is one sequential stream that the hardware prefetchers follow across
// rows and pages (tiles of 4 rows read in lockstep were 4 streams of 4 KiB each at hidden 2048 and
// reached ~25 GB/s from memory on Zen 4 against ~33 for this one). 128 bytes of the row per step into
// four independent accumulators; the activations are re-read from L1 for every row.
BONSAI_AVX512 float dot_f16_avx512(const uint8_t* h, const float* b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= n; k += 64) {
        const uint8_t* r = h + 2 * k;
        s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r))),
                             _mm512_loadu_ps(b + k), s0);
        s1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 32))),
                             _mm512_loadu_ps(b + k + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 64))),
                             _mm512_loadu_ps(b + k + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 96))),
                             _mm512_loadu_ps(b + k + 48), s3);
    }
    for (; k < n; k += 16) {
        const int64_t left = n - k < 16 ? n - k : 16;
        const __mmask16 m = static_cast<__mmask16>((1u << left) - 1);
        const __m512 w = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + 2 * k));
        s0 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, b + k), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

BONSAI_AVX512 void f16_to_f32_avx512(const uint8_t* h, float* out, int64_t n) {
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(out + k, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + 2 * k))));
    for (; k < n; ++k) out[k] = fp16_to_fp32(load_u16(h + 2 * k));
}

using DotFn = float (*)(const float*, const float*, int64_t);
using DotF16Fn = float (*)(const uint8_t*, const float*, int64_t);
using ConvF16Fn = void (*)(const uint8_t*, float*, int64_t);

void f16_to_f32_scalar(const uint8_t* h, float* out, int64_t n) {
    for (int64_t k = 0; k < n; ++k) out[k] = fp16_to_fp32(load_u16(h + 2 * k));
}

void run_float(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0, int64_t r1, float* y,
               void* scratch, DotFn dot, DotF16Fn dot_f16, ConvF16Fn conv_f16) {
    const int64_t cols = w.cols;
    float* buf = static_cast<float*>(scratch);
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
        if (w.type == TYPE_F16 && n_tokens == 1 && dot_f16) {
            y[r] = dot_f16(row, x, cols);
            continue;
        }
        const float* wr;
        if (w.type == TYPE_F32) {
            wr = reinterpret_cast<const float*>(row);
        } else if (w.type == TYPE_F16) {
            conv_f16(row, buf, cols);
            wr = buf;
        } else {
            dequantize_row_cpu(w.type, row, cols, buf);
            wr = buf;
        }
        for (int64_t t = 0; t < n_tokens; ++t) y[t * w.rows + r] = dot(wr, x + t * cols, cols);
    }
}

}  // namespace

void matmul_float_scalar(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0, int64_t r1,
                         float* y, void* scratch) {
    run_float(w, x, n_tokens, r0, r1, y, scratch, dot_scalar, nullptr, f16_to_f32_scalar);
}

void matmul_float_avx2(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0, int64_t r1,
                       float* y, void* scratch) {
    run_float(w, x, n_tokens, r0, r1, y, scratch, dot_avx2, dot_f16_avx2, f16_to_f32_avx2);
}

void matmul_float_avx512(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0, int64_t r1,
                         float* y, void* scratch) {
    run_float(w, x, n_tokens, r0, r1, y, scratch, dot_avx512, dot_f16_avx512, f16_to_f32_avx512);
}

}  // namespace bonsai::cpu
