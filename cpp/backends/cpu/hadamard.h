// Blockwise fast Walsh-Hadamard transform (the prism.hadamard activation rotation, SPEC §4a).
//
// WHT_B applies H_B[r][c] = (-1)^popcount(r & c) / sqrt(B) (natural Sylvester order, symmetric,
// self-inverse) to every consecutive block of B values of a row. The FWHT computes it in log2(B)
// in-place butterfly stages: at stage h = 1, 2, 4, ..., B/2 every pair (i, i + h) with (i & h) == 0
// becomes (u + v, u - v); a final multiply by 1/sqrt(B) normalizes. Both the sign multiply and
// the normalization are fused into the passes over the block:
//   rotate_row:   out = WHT_B(s ⊙ x)  (the input of a folded matmul; signs applied on load)
//   unrotate_row: out = s ⊙ WHT_B(x)  (after the token_embd lookup; signs applied on store)
// s is the ±1 sign vector of the row's width (nullptr: identity sign mode).
//
// Every path performs the same float operations in the same order (the sign multiply is exact,
// each butterfly output is one add or subtract of the same two values, then one multiply by the
// same scale), so the scalar, AVX2 and AVX-512 paths give bit-identical results. The SIMD paths
// need B >= two of their vectors (16 / 32 floats); smaller blocks run the scalar code.
#pragma once

#include <cstdint>

#include "bonsai/ops.h"

namespace bonsai::cpu {

// out[0..n) = WHT_block(signs ⊙ x) blockwise; n a multiple of block (a power of two); out may alias x.
void rotate_row(const float* x, const float* signs, int64_t n, int64_t block, float* out, CpuPath path);
// out[0..n) = signs ⊙ WHT_block(x) blockwise; out may alias x.
void unrotate_row(const float* x, const float* signs, int64_t n, int64_t block, float* out, CpuPath path);
// rotate_row (or unrotate_row when inverse) in place over n_tokens rows of cols, split over the
// pool when there are enough rows.
void rotate_rows(float* x, int64_t n_tokens, int64_t cols, const Rotation& r, bool inverse, ThreadPool& pool,
                 CpuPath path);

}  // namespace bonsai::cpu
