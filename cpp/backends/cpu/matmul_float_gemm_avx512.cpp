// AVX-512 multi-token FLOAT matmul of F16 weights (declared in matmul_float_gemm.h).
//
// Rows are taken 4 at a time (a tile) and tokens 4 at a time (1..3 for the last group): for every
// 16 columns, the 4 rows' F16 values are converted once (vcvtph2ps) and the 4 tokens' f32
// activations loaded once, and 16 FMAs update 16 accumulators of 16 lanes (row i, token t); the
// lanes are summed at the end of the row. Columns past a multiple of 16 are masked. The columns
// go in chunks of 512 that every token group runs in turn (accumulators parked in a buffer
// between chunks, exactly), so the chunk's rows and activations stay in L1; the first group reads
// the rows from memory, prefetched two tiles ahead line by line. The sums are f32 in a fixed order per (row, token), independent of the thread split,
// close to (not bit-identical with) the one-token dot products, as FLOAT mode allows.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)  // clang has no -Wmaybe-uninitialized
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>

#include "matmul_float_gemm.h"

#define BONSAI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace bonsai::cpu {

namespace {

constexpr int kRows = 4;    // rows of a tile
constexpr int kTokens = 4;  // tokens of a group
constexpr int64_t kChunk = 512;  // columns run by every token group in turn (their x stays in L1)

// Columns [k0, k1) of rows rows[0..4) (f16, the same row repeated past the matrix end) x tokens
// x[0..NT): acc[(i * NT + t) * 16 ..] += lanes of row i x token t (k1 - k0 a multiple of 16 but
// at the row's end, where the rest is masked). pf > 0: prefetch each row's line pf bytes ahead.
template <int NT>
BONSAI_AVX512 void tile_f16(const uint8_t* const* rows, const float* const* x, int64_t k0, int64_t k1, float* accbuf,
                            int64_t pf) {
    __m512 acc[kRows][NT];
    for (int i = 0; i < kRows; ++i)
        for (int t = 0; t < NT; ++t) acc[i][t] = _mm512_load_ps(accbuf + (i * NT + t) * 16);
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) {
        if (pf > 0 && (k & 31) == 0)
            for (int i = 0; i < kRows; ++i) _mm_prefetch(reinterpret_cast<const char*>(rows[i] + 2 * k + pf), _MM_HINT_T0);
        __m512 wv[kRows];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i)
            wv[i] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + 2 * k)));
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
            const __m512 xv = _mm512_loadu_ps(x[t] + k);
#pragma GCC unroll 4
            for (int i = 0; i < kRows; ++i) acc[i][t] = _mm512_fmadd_ps(wv[i], xv, acc[i][t]);
        }
    }
    if (k < k1) {
        const __mmask16 m = static_cast<__mmask16>((1u << (k1 - k)) - 1);
        __m512 wv[kRows];
        for (int i = 0; i < kRows; ++i) wv[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, rows[i] + 2 * k));
        for (int t = 0; t < NT; ++t) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x[t] + k);
            for (int i = 0; i < kRows; ++i) acc[i][t] = _mm512_fmadd_ps(wv[i], xv, acc[i][t]);
        }
    }
    for (int i = 0; i < kRows; ++i)
        for (int t = 0; t < NT; ++t) _mm512_store_ps(accbuf + (i * NT + t) * 16, acc[i][t]);
}

}  // namespace

BONSAI_AVX512 void matmul_f16_gemm_avx512(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0,
                                          int64_t r1, float* y) {
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const int64_t cols = w.cols;
    const int64_t tile_bytes = kRows * static_cast<int64_t>(w.row_bytes);
    alignas(64) float accbuf[kF16GemmMaxTokens * kRows * 16];
    for (int64_t r = r0; r < r1; r += kRows) {
        const int nr = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
        const uint8_t* rows[kRows];
        for (int i = 0; i < kRows; ++i) rows[i] = base + std::min<int64_t>(r + i, r1 - 1) * w.row_bytes;
        // rows two tiles ahead (each row may be its own page, past the hardware prefetchers)
        const int64_t pf = r + 3 * kRows <= r1 ? 2 * tile_bytes : 0;
        std::fill(accbuf, accbuf + n_tokens * kRows * 16, 0.0f);
        for (int64_t k0 = 0; k0 < cols; k0 += kChunk) {
            const int64_t k1 = std::min(cols, k0 + kChunk);
            for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokens) {
                const int nt = static_cast<int>(std::min<int64_t>(kTokens, n_tokens - t0));
                const float* xs[kTokens];
                for (int t = 0; t < kTokens; ++t) xs[t] = x + (t0 + std::min(t, nt - 1)) * cols;
                float* acc = accbuf + t0 * kRows * 16;
                const int64_t p = t0 == 0 ? pf : 0;
                switch (nt) {
                    case 1: tile_f16<1>(rows, xs, k0, k1, acc, p); break;
                    case 2: tile_f16<2>(rows, xs, k0, k1, acc, p); break;
                    case 3: tile_f16<3>(rows, xs, k0, k1, acc, p); break;
                    default: tile_f16<4>(rows, xs, k0, k1, acc, p); break;
                }
            }
        }
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokens) {
            const int nt = static_cast<int>(std::min<int64_t>(kTokens, n_tokens - t0));
            const float* acc = accbuf + t0 * kRows * 16;
            for (int i = 0; i < nr; ++i)
                for (int t = 0; t < nt; ++t)
                    y[(t0 + t) * w.rows + r + i] = _mm512_reduce_add_ps(_mm512_load_ps(acc + (i * nt + t) * 16));
        }
    }
}

}  // namespace bonsai::cpu
