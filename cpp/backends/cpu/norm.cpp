// RMSNorm on the CPU: y = x * w / sqrt(mean(x^2) + eps). The sum of squares is accumulated in
// double so that long rows (hidden 5120+) keep full float precision; the AVX-512 path (active CPU
// path avx512) keeps 16 double partial sums in two vectors, the others one serial sum.
#include <cmath>

#include "bonsai/ops.h"
#include "layers_cpu.h"
#include "vec_exp.h"

namespace bonsai::cpu {

namespace {

BONSAI_AVX512_MATH double sum_squares_avx512(const float* x, int64_t n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        const __m512d b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        s0 = _mm512_fmadd_pd(a, a, s0);
        s1 = _mm512_fmadd_pd(b, b, s1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    return ss;
}

}  // namespace

void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
    double ss = 0.0;
    if (active_cpu_path() == CpuPath::AVX512) {
        ss = sum_squares_avx512(x, n);
    } else {
        for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    }
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

}  // namespace bonsai::cpu
