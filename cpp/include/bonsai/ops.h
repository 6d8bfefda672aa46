// Device-agnostic entry points of the matrix ops. Each validates shapes once and dispatches to the
// backend (cpp/backends/cpu/ for now).
//
// matmul computes y[t*rows + r] = sum_k W[r,k] * x[t*cols + k] for t < n_tokens.
//   ActMode::INT8 (quantized weight types): every token row of x is quantized once to int8 with
//     its own absmax scale (s = amax/127, q = round-half-away(x * 127/amax), amax 0 -> zeros; the
//     W1.58A8 scheme), each weight block gives an exact int32 dot product isum_b, and the output is
//     (sum over blocks in order of d_b * isum_b, one fused multiply-add per block) * s. All CPU
//     paths (scalar, AVX2, AVX-512 VNNI) give bit-identical results.
//   ActMode::FLOAT: weights are dequantized block by block and dotted with f32 activations.
//   F32 / F16 / BF16 weights always use float math, whatever the mode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bonsai/thread_pool.h"
#include "bonsai/types.h"

namespace bonsai {

enum class ActMode { INT8, FLOAT };  // INT8: per-token absmax int8 activations; FLOAT: f32 activations

struct WeightView {  // a 2-D weight as stored in the file (GGUF ne0 = cols)
    GgmlType type;
    const void* data;
    int64_t rows;
    int64_t cols;
    size_t row_bytes;
};

// y[t*rows + r] = sum_k W[r,k] * x[t*cols + k], t < n_tokens. F32/F16/BF16 weights always use float
// math. Throws bonsai::Error for an unknown type or inconsistent shapes.
void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode, ThreadPool& pool);

// Several weights that read the same input x [n_tokens, cols] (q/k/v, gate/up): ys[i] (of
// [n_tokens, ws[i]->rows]) gets exactly what matmul(*ws[i], x, ...) gives, bit for bit. In INT8
// mode x is quantized once per distinct weight layout instead of once per weight, and for one
// token all weights' rows are computed in one thread-pool dispatch. Throws as matmul does, and
// when a weight's cols differ from the first's.
void matmul_shared_input(const WeightView* const* ws, float* const* ys, int n, const float* x, int64_t n_tokens,
                         ActMode mode, ThreadPool& pool);

// The prism.hadamard activation rotation of one folded input width (SPEC §4a): a folded weight
// stores rows WHT_B(s ⊙ w) blockwise along its input, so its matmul must read x' = WHT_B(s ⊙ x),
// with H_B[r][c] = (-1)^popcount(r & c) / sqrt(B). The kernels are in backends/cpu/hadamard.h.
struct Rotation {
    int64_t block = 0;             // B, a power of two dividing the width; 0 = no rotation
    const float* signs = nullptr;  // [width] of +-1 (explicit sign mode), nullptr = identity
    bool active() const { return block > 0; }
};

// In place over n_tokens rows of cols: x = WHT_B(s ⊙ x) (rotate) or x = s ⊙ WHT_B(x) (unrotate, the
// inverse, applied after a rotated token_embd lookup). Throws unless cols is a multiple of B.
void hadamard_rotate(float* x, int64_t n_tokens, int64_t cols, const Rotation& r, ThreadPool& pool);
void hadamard_unrotate(float* x, int64_t n_tokens, int64_t cols, const Rotation& r, ThreadPool& pool);

// Folded weights sharing one input: ys[i] = W_i x'_t for every token row, x' = WHT_B(s ⊙ x), the
// rotation computed once for all of them. x is scratch: afterwards it holds either the input or
// the rotated rows. In INT8 mode, when every weight takes the same INT8 layout, the rotation is
// fused into the activation quantization (each rotated row only lives in a per-thread row
// buffer); otherwise x is rotated in place and matmul_shared_input runs on it.
void matmul_rotated(const WeightView* const* ws, float* const* ys, int n, float* x, int64_t n_tokens,
                    const Rotation& r, ActMode mode, ThreadPool& pool);

// Embedding gather from any type: out[i*cols + k] = W[ids[i], k] (dequantized). Throws for an id
// outside [0, rows).
void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out);

// CPU kernel paths. The default is the best one the running CPU supports; the environment variable
// BONSAI_CPU_PATH=scalar|avx2|avx512 or set_cpu_path() forces one (tests, benchmarks).
enum class CpuPath { SCALAR, AVX2, AVX512 };

const char* cpu_path_name(CpuPath path);
CpuPath parse_cpu_path(const std::string& name);      // throws for an unknown name
std::vector<CpuPath> available_cpu_paths();           // always contains SCALAR
CpuPath active_cpu_path();
void set_cpu_path(CpuPath path);                      // throws if the CPU lacks the features

// matmul on an explicit CPU path (throws if the CPU lacks its features).
void matmul_on_path(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode,
                    ThreadPool& pool, CpuPath path);
void matmul_shared_input_on_path(const WeightView* const* ws, float* const* ys, int n, const float* x,
                                 int64_t n_tokens, ActMode mode, ThreadPool& pool, CpuPath path);

// The rotation ops on an explicit CPU path (throws if the CPU lacks its features).
void hadamard_rotate_on_path(float* x, int64_t n_tokens, int64_t cols, const Rotation& r, bool inverse,
                             ThreadPool& pool, CpuPath path);
void matmul_rotated_on_path(const WeightView* const* ws, float* const* ys, int n, float* x, int64_t n_tokens,
                            const Rotation& r, ActMode mode, ThreadPool& pool, CpuPath path);

}  // namespace bonsai
