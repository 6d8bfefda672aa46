// Chooses the multi-token INT8 GEMM variant for the CPU path (see matmul_int8_gemm.h).
#include "matmul_int8_gemm.h"

#include "cpu_features.h"

namespace bonsai::cpu {

bool matmul_int8_gemm(const WeightView& w, const ActInt8& a, float* y, ThreadPool& pool, CpuPath path) {
    if (a.n_tokens < 2 || path != CpuPath::AVX512 || !a.slots) return false;
    if (avx512_vbmi_enabled())
        matmul_int8_gemm_avx512_vbmi(w, a, y, pool);
    else
        matmul_int8_gemm_avx512(w, a, y, pool);
    return true;
}

}  // namespace bonsai::cpu
