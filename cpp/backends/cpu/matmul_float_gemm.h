// Multi-token FLOAT matmul of F16 weights on AVX-512 (the output head of a batched decode step):
// register-blocked 4 rows x 4 tokens, so each converted weight vector serves 4 tokens and each
// activation vector 4 rows (see matmul_float_gemm_avx512.cpp).
#pragma once

#include <cstdint>

#include "bonsai/ops.h"

namespace bonsai::cpu {

// Token counts the blocked F16 kernel takes (every token's activations stay in L2 across a tile).
constexpr int64_t kF16GemmMaxTokens = 64;

// y[t * w.rows + r] for rows [r0, r1) and n_tokens (2..kF16GemmMaxTokens) tokens of x, F16 w.
void matmul_f16_gemm_avx512(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0, int64_t r1, float* y);

}  // namespace bonsai::cpu
