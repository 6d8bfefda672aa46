// Device-agnostic matrix ops: validate shapes and types once, then dispatch to the CPU backend.
#include "bonsai/ops.h"

#include <string>

#include "../backends/cpu/cpu_features.h"
#include "../backends/cpu/hadamard.h"
#include "../backends/cpu/matmul.h"
#include "bonsai/error.h"

namespace bonsai {

namespace {

void validate_weight(const char* op, const WeightView& w) {
    const TypeTraits* t = type_traits(w.type);
    if (!t)
        throw Error(std::string(op) + ": unsupported weight type " + ggml_type_label(static_cast<uint32_t>(w.type)) +
                    " (supported: F32, F16, BF16, Q8_0, Q4_0, TQ1_0, TQ2_0, Q2_0, Q2_0_G128, PQ2_0, PTQ1_0)");
    if (w.rows < 0 || w.cols <= 0)
        throw Error(std::string(op) + ": bad weight shape " + std::to_string(w.rows) + " x " +
                    std::to_string(w.cols) + " (rows >= 0, cols > 0 required)");
    if (w.cols % t->block_size != 0)
        throw Error(std::string(op) + ": " + t->name + " weight has " + std::to_string(w.cols) +
                    " columns, not a multiple of its block size " + std::to_string(t->block_size));
    const size_t need = type_row_bytes(w.type, w.cols);
    if (w.row_bytes != need)
        throw Error(std::string(op) + ": " + t->name + " weight with " + std::to_string(w.cols) + " columns needs " +
                    std::to_string(need) + " bytes per row, got " + std::to_string(w.row_bytes) +
                    " (wrong type for this tensor?)");
    if (w.rows > 0 && !w.data) throw Error(std::string(op) + ": weight data is null");
}

}  // namespace

void matmul_on_path(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode,
                    ThreadPool& pool, CpuPath path) {
    validate_weight("matmul", w);
    if (n_tokens < 0) throw Error("matmul: n_tokens must be >= 0 (got " + std::to_string(n_tokens) + ")");
    if (n_tokens > 0 && w.rows > 0 && (!x || !y)) throw Error("matmul: null activation or output pointer");
    if (mode != ActMode::INT8 && mode != ActMode::FLOAT) throw Error("matmul: unknown activation mode");
    if (!cpu::cpu_path_available(path))
        throw Error(std::string("matmul: CPU path '") + cpu_path_name(path) + "' is not supported by this CPU");
    cpu::matmul_cpu(w, x, n_tokens, y, mode, pool, path);
}

void matmul_shared_input_on_path(const WeightView* const* ws, float* const* ys, int n, const float* x,
                                 int64_t n_tokens, ActMode mode, ThreadPool& pool, CpuPath path) {
    if (n < 1 || !ws || !ys) throw Error("matmul_shared_input: needs at least one weight and output");
    for (int i = 0; i < n; ++i) {
        if (!ws[i]) throw Error("matmul_shared_input: weight " + std::to_string(i) + " is null");
        validate_weight("matmul_shared_input", *ws[i]);
        if (ws[i]->cols != ws[0]->cols)
            throw Error("matmul_shared_input: weight " + std::to_string(i) + " has " + std::to_string(ws[i]->cols) +
                        " columns, weight 0 has " + std::to_string(ws[0]->cols) + " (they must share one input)");
        if (n_tokens > 0 && ws[i]->rows > 0 && !ys[i])
            throw Error("matmul_shared_input: null output pointer for weight " + std::to_string(i));
    }
    if (n_tokens < 0) throw Error("matmul_shared_input: n_tokens must be >= 0 (got " + std::to_string(n_tokens) + ")");
    if (n_tokens > 0 && !x) throw Error("matmul_shared_input: null activation pointer");
    if (mode != ActMode::INT8 && mode != ActMode::FLOAT) throw Error("matmul_shared_input: unknown activation mode");
    if (!cpu::cpu_path_available(path))
        throw Error(std::string("matmul_shared_input: CPU path '") + cpu_path_name(path) +
                    "' is not supported by this CPU");
    cpu::matmul_shared_input_cpu(ws, ys, n, x, n_tokens, mode, pool, path);
}

void matmul_shared_input(const WeightView* const* ws, float* const* ys, int n, const float* x, int64_t n_tokens,
                         ActMode mode, ThreadPool& pool) {
    matmul_shared_input_on_path(ws, ys, n, x, n_tokens, mode, pool, active_cpu_path());
}

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode, ThreadPool& pool) {
    matmul_on_path(w, x, n_tokens, y, mode, pool, active_cpu_path());
}

namespace {

void validate_rotation(const char* op, const Rotation& r, int64_t cols) {
    if (r.block < 2 || (r.block & (r.block - 1)) != 0)
        throw Error(std::string(op) + ": Hadamard block " + std::to_string(r.block) + " is not a power of two >= 2");
    if (cols % r.block != 0)
        throw Error(std::string(op) + ": width " + std::to_string(cols) + " is not a multiple of the Hadamard block " +
                    std::to_string(r.block));
}

}  // namespace

void hadamard_rotate_on_path(float* x, int64_t n_tokens, int64_t cols, const Rotation& r, bool inverse,
                             ThreadPool& pool, CpuPath path) {
    validate_rotation("hadamard_rotate", r, cols);
    if (n_tokens < 0) throw Error("hadamard_rotate: n_tokens must be >= 0");
    if (n_tokens > 0 && !x) throw Error("hadamard_rotate: null activation pointer");
    if (!cpu::cpu_path_available(path))
        throw Error(std::string("hadamard_rotate: CPU path '") + cpu_path_name(path) + "' is not supported by this CPU");
    cpu::rotate_rows(x, n_tokens, cols, r, inverse, pool, path);
}

void hadamard_rotate(float* x, int64_t n_tokens, int64_t cols, const Rotation& r, ThreadPool& pool) {
    hadamard_rotate_on_path(x, n_tokens, cols, r, false, pool, active_cpu_path());
}

void hadamard_unrotate(float* x, int64_t n_tokens, int64_t cols, const Rotation& r, ThreadPool& pool) {
    hadamard_rotate_on_path(x, n_tokens, cols, r, true, pool, active_cpu_path());
}

void matmul_rotated_on_path(const WeightView* const* ws, float* const* ys, int n, float* x, int64_t n_tokens,
                            const Rotation& r, ActMode mode, ThreadPool& pool, CpuPath path) {
    if (n < 1 || !ws) throw Error("matmul_rotated: needs at least one weight and output");
    for (int i = 0; i < n; ++i)
        if (!ws[i]) throw Error("matmul_rotated: weight " + std::to_string(i) + " is null");
    validate_rotation("matmul_rotated", r, ws[0]->cols);
    // the same checks as the unrotated call (shapes, pointers, mode, path), before x is touched
    matmul_shared_input_on_path(ws, ys, n, x, 0, mode, pool, path);
    if (n_tokens < 0) throw Error("matmul_rotated: n_tokens must be >= 0 (got " + std::to_string(n_tokens) + ")");
    if (n_tokens > 0 && !x) throw Error("matmul_rotated: null activation pointer");
    for (int i = 0; i < n; ++i)
        if (n_tokens > 0 && ws[i]->rows > 0 && !ys[i])
            throw Error("matmul_rotated: null output pointer for weight " + std::to_string(i));
    cpu::matmul_rotated_cpu(ws, ys, n, x, n_tokens, r, mode, pool, path);
}

void matmul_rotated(const WeightView* const* ws, float* const* ys, int n, float* x, int64_t n_tokens,
                    const Rotation& r, ActMode mode, ThreadPool& pool) {
    matmul_rotated_on_path(ws, ys, n, x, n_tokens, r, mode, pool, active_cpu_path());
}

void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) {
    validate_weight("get_rows", w);
    if (n < 0) throw Error("get_rows: n must be >= 0");
    if (n > 0 && (!ids || !out)) throw Error("get_rows: null ids or output pointer");
    for (int64_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= w.rows)
            throw Error("get_rows: row id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                        " is outside [0, " + std::to_string(w.rows) + ")");
    cpu::get_rows_cpu(w, ids, n, out);
}

}  // namespace bonsai
