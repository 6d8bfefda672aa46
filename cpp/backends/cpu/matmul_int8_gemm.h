// Multi-token INT8 matmul (prefill, batched decode) on AVX-512 VNNI: a register-blocked GEMM whose
// results are bit-identical to the scalar kernel (matmul_int8_gemm_impl.h describes the algorithm).
// The CPU dispatcher (matmul.cpp) offers it every INT8 call; it splits the work over the pool itself.
#pragma once

#include "act_quant.h"
#include "bonsai/ops.h"
#include "bonsai/thread_pool.h"

namespace bonsai::cpu {

// Runs the whole matmul y[t * w.rows + r] (every row and token) and returns true when it applies:
// two or more tokens on the AVX-512 path (a quantized with slots). Otherwise returns false and the
// caller runs its per-row kernels.
bool matmul_int8_gemm(const WeightView& w, const ActInt8& a, float* y, ThreadPool& pool, CpuPath path);

// y[t * w.rows + r] for every row and token of a (a filled by quantize_act_token, with slots).
// The _vbmi variant unpacks base-3 bytes with AVX-512 VBMI table lookups (same results).
void matmul_int8_gemm_avx512(const WeightView& w, const ActInt8& a, float* y, ThreadPool& pool);
void matmul_int8_gemm_avx512_vbmi(const WeightView& w, const ActInt8& a, float* y, ThreadPool& pool);

}  // namespace bonsai::cpu
