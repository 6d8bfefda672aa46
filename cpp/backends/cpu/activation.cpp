// SwiGLU on the CPU: out = silu(gate) * up with silu(g) = g / (1 + exp(-g)). The AVX-512 path
// (active CPU path avx512) evaluates exp with vec_exp.h's polynomial, 16 values at a time; the
// others use std::exp. The two agree to a few float ulps.
#include <cmath>

#include "bonsai/ops.h"
#include "layers_cpu.h"
#include "vec_exp.h"

namespace bonsai::cpu {

namespace {

BONSAI_AVX512_MATH void swiglu_avx512(const float* gate, const float* up, int64_t n, float* out) {
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        const __m512 e = exp512(_mm512_xor_ps(g, sign));
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

}  // namespace

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
    if (active_cpu_path() == CpuPath::AVX512) {
        swiglu_avx512(gate, up, n, out);
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

}  // namespace bonsai::cpu
