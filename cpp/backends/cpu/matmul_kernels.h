// Per-path CPU matmul kernels called by the dispatcher (matmul.cpp). Each computes
// y[t*w.rows + r] for the rows [r0, r1) and every token; the dispatcher splits rows over threads.
// scratch is per-thread memory of at least kernel_scratch_bytes(cols) bytes, 64-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>

#include "act_quant.h"
#include "bonsai/ops.h"

namespace bonsai::cpu {

inline size_t kernel_scratch_bytes(int64_t cols) { return static_cast<size_t>(cols) * 8 + 256; }

// INT8 activations (a was filled by quantize_act_token; the SIMD kernels need its slots).
void matmul_int8_scalar(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y, void* scratch);
void matmul_int8_avx2(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y);
void matmul_int8_avx512(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y);
void matmul_int8_avx512_vbmi(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y);

// f32 activations, any weight type.
void matmul_float_scalar(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0, int64_t r1,
                         float* y, void* scratch);
void matmul_float_avx2(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0, int64_t r1,
                       float* y, void* scratch);
void matmul_float_avx512(const WeightView& w, const float* x, int64_t n_tokens, int64_t r0, int64_t r1,
                         float* y, void* scratch);

}  // namespace bonsai::cpu
