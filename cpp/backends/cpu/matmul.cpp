// CPU matmul dispatch: quantizes the activations once per token (INT8 mode), then splits the
// output rows over the thread pool in tiles of 4 rows and runs the kernel of the chosen path.
// Scratch memory is thread-local and only grows, so steady-state calls do not allocate.
#include "matmul.h"

#include <vector>

#include "act_quant.h"
#include "cpu_features.h"
#include "matmul_float_gemm.h"
#include "matmul_int8_gemm.h"
#include "matmul_kernels.h"

namespace bonsai::cpu {

namespace {

constexpr int64_t kRowTile = 4;

void* grow_scratch(std::vector<uint8_t>& buf, size_t bytes) {
    if (buf.size() < bytes + 64) buf.resize(bytes + 64);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
    return reinterpret_cast<void*>((p + 63) / 64 * 64);
}

void* thread_scratch(size_t bytes) {
    static thread_local std::vector<uint8_t> buf;
    return grow_scratch(buf, bytes);
}

struct Job {
    const WeightView* w;
    const float* x;
    int64_t n_tokens;
    float* y;
    CpuPath path;
    const ActInt8* act;  // nullptr in FLOAT mode
};

void run_rows(const Job& j, int64_t tile_begin, int64_t tile_end) {
    const WeightView& w = *j.w;
    const int64_t r0 = tile_begin * kRowTile;
    const int64_t r1 = tile_end * kRowTile < w.rows ? tile_end * kRowTile : w.rows;
    if (j.act) {
        switch (j.path) {
            case CpuPath::SCALAR: matmul_int8_scalar(w, *j.act, r0, r1, j.y, thread_scratch(kernel_scratch_bytes(w.cols))); break;
            case CpuPath::AVX2: matmul_int8_avx2(w, *j.act, r0, r1, j.y); break;
            case CpuPath::AVX512:
                if (avx512_vbmi_enabled())
                    matmul_int8_avx512_vbmi(w, *j.act, r0, r1, j.y);
                else
                    matmul_int8_avx512(w, *j.act, r0, r1, j.y);
                break;
        }
        return;
    }
    void* scratch = thread_scratch(kernel_scratch_bytes(w.cols));
    switch (j.path) {
        case CpuPath::SCALAR: matmul_float_scalar(w, j.x, j.n_tokens, r0, r1, j.y, scratch); break;
        case CpuPath::AVX2: matmul_float_avx2(w, j.x, j.n_tokens, r0, r1, j.y, scratch); break;
        case CpuPath::AVX512:
            if (w.type == TYPE_F16 && j.n_tokens >= 2 && j.n_tokens <= kF16GemmMaxTokens)
                matmul_f16_gemm_avx512(w, j.x, j.n_tokens, r0, r1, j.y);
            else
                matmul_float_avx512(w, j.x, j.n_tokens, r0, r1, j.y, scratch);
            break;
    }
}

}  // namespace

void matmul_cpu(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode, ThreadPool& pool,
                CpuPath path) {
    if (w.rows == 0 || n_tokens == 0) return;
    const Int8Layout* layout = int8_layout(w.type);
    Job job{&w, x, n_tokens, y, path, nullptr};
    ActInt8 act;
    if (mode == ActMode::INT8 && layout) {
        static thread_local std::vector<uint8_t> act_buf;
        const bool slots = path != CpuPath::SCALAR;
        act = act_int8_setup(layout, w.cols, n_tokens, slots,
                             grow_scratch(act_buf, act_int8_bytes(layout, w.cols, n_tokens, slots)));
        const ActInt8* ap = &act;
        if (n_tokens >= 4 * pool.size()) {
            pool.parallel_for(n_tokens, [ap, x](int64_t b, int64_t e, int) {
                for (int64_t t = b; t < e; ++t) quantize_act_token(*ap, x + t * ap->cols, t);
            });
        } else {
            for (int64_t t = 0; t < n_tokens; ++t) quantize_act_token(act, x + t * w.cols, t);
        }
        job.act = &act;
        if (matmul_int8_gemm(w, act, y, pool, path)) return;  // two or more tokens on AVX-512
    }
    const Job* jp = &job;
    pool.parallel_for((w.rows + kRowTile - 1) / kRowTile,
                      [jp](int64_t b, int64_t e, int) { run_rows(*jp, b, e); });
}

}  // namespace bonsai::cpu
