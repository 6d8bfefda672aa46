// CPU backend entry points of the matrix ops (called by src/ops.cpp after shape validation).
#pragma once

#include "bonsai/ops.h"

namespace bonsai::cpu {

void matmul_cpu(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode, ThreadPool& pool,
                CpuPath path);

// ys[i] = matmul of *ws[i] with the shared input x; every weight has x's cols.
void matmul_shared_input_cpu(const WeightView* const* ws, float* const* ys, int n, const float* x, int64_t n_tokens,
                             ActMode mode, ThreadPool& pool, CpuPath path);

// ys[i] = *ws[i] times the rotated input WHT_B(s ⊙ x) (see matmul_rotated in bonsai/ops.h); x is scratch.
void matmul_rotated_cpu(const WeightView* const* ws, float* const* ys, int n, float* x, int64_t n_tokens,
                        const Rotation& r, ActMode mode, ThreadPool& pool, CpuPath path);

void get_rows_cpu(const WeightView& w, const int32_t* ids, int64_t n, float* out);

}  // namespace bonsai::cpu
