// CPU matmul dispatch: quantizes the activations once per token (INT8 mode; once per distinct
// unit layout when several weights share one input), then splits the output rows of every weight
// over the thread pool in tiles of 4 rows and runs the kernel of the chosen path.
//
// One token (decode): the tiles of all weights form one list, handed out through an atomic
// counter in guided chunks (each a fixed fraction of what is left, down to a minimum size), so a
// thread that was descheduled or slowed by other load leaves its chunks to the others, the threads
// finish close together, and the whole step is one pool dispatch. With a pool whose weights
// outlive it (a Context's), that dispatch is a detached task that also takes over the chunk of a
// worker descheduled in the middle of it (matmul_one_token.cpp). On the AVX-512 path the weights of
// a batch of up to tile_batch_tokens(type) tokens (int8_layout.h) are split the same way (one pool
// dispatch, not a task), the tiles computing every token. More tokens: INT8 weights go to the
// AVX-512 GEMM (matmul_int8_gemm.h) when it applies; otherwise each thread takes one contiguous
// range of each weight's tiles.
// Scratch memory is thread-local (or owned by a recycled task) and only grows, so steady-state
// calls do not allocate.
#include "matmul.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "act_quant.h"
#include "cpu_features.h"
#include "hadamard.h"
#include "matmul_float_gemm.h"
#include "matmul_int8_gemm.h"
#include "matmul_jobs.h"
#include "matmul_kernels.h"
#include "repack.h"

namespace bonsai::cpu {

void* grow_scratch(std::vector<uint8_t>& buf, size_t bytes) {
    if (buf.size() < bytes + 64) buf.resize(bytes + 64);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
    return reinterpret_cast<void*>((p + 63) / 64 * 64);
}

namespace {

void* thread_scratch(size_t bytes) {
    static thread_local std::vector<uint8_t> buf;
    return grow_scratch(buf, bytes);
}

// Runs tiles [begin, end) of the concatenated tile list of jobs[0..n).
void run_tile_range(const Job* jobs, const int64_t* first_tile, int n, int64_t begin, int64_t end) {
    for (int i = 0; i < n && begin < end; ++i) {
        const int64_t lo = std::max(begin, first_tile[i]), hi = std::min(end, first_tile[i + 1]);
        if (lo < hi) run_rows(jobs[i], lo - first_tile[i], hi - first_tile[i], jobs[i].y);
    }
}

// Quantizes the n_tokens rows of x for one layout into buf (scalar kernels need no slots). With a
// rotation, each row is first rotated into a per-thread row buffer (x' = WHT_B(s ⊙ x), see
// hadamard.h) and quantized from there, so the rotated activations never make a round trip
// through a full-size buffer.
ActInt8 quantize_input(const Int8Layout* layout, const float* x, int64_t cols, int64_t n_tokens, CpuPath path,
                       std::vector<uint8_t>& buf, ThreadPool& pool, const Rotation* rot = nullptr) {
    const bool slots = path != CpuPath::SCALAR;
    ActInt8 act = act_int8_setup(layout, cols, n_tokens, slots,
                                 grow_scratch(buf, act_int8_bytes(layout, cols, n_tokens, slots)));
    const ActInt8* ap = &act;
    auto run = [ap, x, rot, path](int64_t b, int64_t e) {
        if (!rot) {
            for (int64_t t = b; t < e; ++t) quantize_act_token(*ap, x + t * ap->cols, t);
            return;
        }
        static thread_local std::vector<uint8_t> row_buf;
        float* row = static_cast<float*>(grow_scratch(row_buf, sizeof(float) * ap->cols));
        for (int64_t t = b; t < e; ++t) {
            rotate_row(x + t * ap->cols, rot->signs, ap->cols, rot->block, row, path);
            quantize_act_token(*ap, row, t);
        }
    };
    if (n_tokens >= 4 * pool.size())
        pool.parallel_for(n_tokens, [&run](int64_t b, int64_t e, int) { run(b, e); });
    else
        run(0, n_tokens);
    return act;
}

void dispatch(const JobSet& set, ThreadPool& pool) {
    const Job* jobs = set.jobs;
    int n = set.n;
    Job tiled[kMaxJobs];  // of two or more tokens: the jobs the one-token tiles run
    if (jobs[0].n_tokens >= 2) {
        int n_tiled = 0;
        for (int i = 0; i < n; ++i) {
            const Job* jp = &jobs[i];
            if (jp->path == CpuPath::AVX512 && jp->n_tokens <= tile_batch_tokens(jp->w.type)) {
                tiled[n_tiled++] = *jp;
                continue;
            }
            if (jp->act && matmul_int8_gemm(jp->w, *jp->act, jp->y, pool, jp->path)) continue;  // AVX-512 GEMM
            pool.parallel_for(job_tiles(*jp), [jp](int64_t b, int64_t e, int) { run_rows(*jp, b, e, jp->y); });
        }
        jobs = tiled;
        n = n_tiled;
    }
    int64_t first_tile[kMaxJobs + 1];
    first_tile[0] = 0;
    for (int i = 0; i < n; ++i) first_tile[i + 1] = first_tile[i] + job_tiles(jobs[i]);
    const int64_t total = first_tile[n];
    if (total == 0) return;
    const int64_t threads = pool.size();
    size_t bytes = 0;
    for (int i = 0; i < n; ++i) bytes += static_cast<size_t>(jobs[i].w.rows) * jobs[i].w.row_bytes;
    const int64_t min_chunk = std::max<int64_t>(1, static_cast<int64_t>(kMinChunkBytes * total / std::max<size_t>(bytes, 1)));
    std::atomic<int64_t> next{0};
    pool.parallel_for(std::min(threads, (total + min_chunk - 1) / min_chunk), [&](int64_t, int64_t, int) {
        int64_t c = next.load(std::memory_order_relaxed);
        for (;;) {
            int64_t end;
            do {
                if (c >= total) return;
                end = std::min(total, c + std::max(min_chunk, (total - c) / (threads * kGuidedSplit)));
            } while (!next.compare_exchange_weak(c, end, std::memory_order_relaxed));
            run_tile_range(jobs, first_tile, n, c, end);
            c = next.load(std::memory_order_relaxed);
        }
    });
}

// Where the jobs of one dispatch are collected: a one-token task's set, or this thread's set.
struct Collector {
    ThreadPool& pool;
    int64_t n_tokens;
    OneTokenTask* task = nullptr;
    JobSet* set = nullptr;
    Collector(ThreadPool& p, int64_t nt) : pool(p), n_tokens(nt) { begin(); }
    void begin() {
        static thread_local JobSet own;
        task = n_tokens == 1 ? acquire_one_token_task(pool) : nullptr;
        set = task ? &one_token_task_set(task) : &own;
        set->clear();
    }
    // The input a FLOAT-mode job reads: a task owns a copy of it (a descheduled worker may still
    // read it after the caller has moved on).
    const float* input(const float* x, int64_t cols) {
        if (!task) return x;
        if (set->x_own.empty()) set->x_own.assign(x, x + cols);
        return set->x_own.data();
    }
    void run() {
        if (set->n == 0) return;
        if (task)
            run_one_token_task(task, pool);
        else
            dispatch(*set, pool);
    }
    void flush() {  // runs what is collected and starts a new set
        run();
        begin();
    }
};

// Repacked rows (repack.h) for a kernel that reads the file's layout only (every kernel but the
// AVX-512 ones): converted back, kConvertTiles tiles at a time, into a thread-local buffer seen
// through a view that puts row r at the same index (with 64 bytes to spare on either side, as loads
// near a row's ends may reach past them), then run as the file's type.
void run_rows_converted(const Job& j, int64_t tile_begin, int64_t tile_end, float* y) {
    constexpr int64_t kConvertTiles = 64;
    static thread_local std::vector<uint8_t> rows_buf;
    const int64_t rb = static_cast<int64_t>(j.w.row_bytes);
    for (int64_t t0 = tile_begin; t0 < tile_end; t0 += kConvertTiles) {
        const int64_t t1 = std::min(tile_end, t0 + kConvertTiles);
        const int64_t r0 = t0 * job_tile_rows(j), r1 = std::min(t1 * job_tile_rows(j), j.w.rows);
        uint8_t* buf = static_cast<uint8_t*>(grow_scratch(rows_buf, static_cast<size_t>((r1 - r0) * rb + 128))) + 64;
        unpack_rows(j.w, r0, r1, buf);
        Job c = j;
        c.w.type = file_type(j.w.type);
        c.w.data = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(buf) - static_cast<uintptr_t>(r0 * rb));
        run_rows(c, r0 / job_tile_rows(c), (r1 + job_tile_rows(c) - 1) / job_tile_rows(c), y);
    }
}

}  // namespace

void run_rows(const Job& j, int64_t tile_begin, int64_t tile_end, float* y) {
    const WeightView& w = j.w;
    // AVX-512 reads repacked rows itself with their one-token layouts (two or more tokens go to the
    // GEMM before this)
    const bool native = j.act && j.path == CpuPath::AVX512 && reads_repacked(j.act->layout);
    if (is_repacked(w.type) && !native) {
        run_rows_converted(j, tile_begin, tile_end, y);
        return;
    }
    const int64_t r0 = tile_begin * job_tile_rows(j);
    const int64_t r1 = std::min(tile_end * job_tile_rows(j), w.rows);
    if (j.act) {
        switch (j.path) {
            case CpuPath::SCALAR: matmul_int8_scalar(w, *j.act, r0, r1, y, thread_scratch(kernel_scratch_bytes(w.cols))); break;
            case CpuPath::AVX2: matmul_int8_avx2(w, *j.act, r0, r1, y); break;
            case CpuPath::AVX512:
                if (avx512_vbmi_enabled())
                    matmul_int8_avx512_vbmi(w, *j.act, r0, r1, y);
                else
                    matmul_int8_avx512(w, *j.act, r0, r1, y);
                break;
        }
        return;
    }
    void* scratch = thread_scratch(kernel_scratch_bytes(w.cols));
    switch (j.path) {
        case CpuPath::SCALAR: matmul_float_scalar(w, j.x, j.n_tokens, r0, r1, y, scratch); break;
        case CpuPath::AVX2: matmul_float_avx2(w, j.x, j.n_tokens, r0, r1, y, scratch); break;
        case CpuPath::AVX512:
            if (w.type == TYPE_F16 && j.n_tokens >= 2 && j.n_tokens <= kF16GemmMaxTokens)
                matmul_f16_gemm_avx512(w, j.x, j.n_tokens, r0, r1, y);
            else
                matmul_float_avx512(w, j.x, j.n_tokens, r0, r1, y, scratch);
            break;
    }
}

void matmul_cpu(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode, ThreadPool& pool,
                CpuPath path) {
    const WeightView* ws[1] = {&w};
    float* ys[1] = {y};
    matmul_shared_input_cpu(ws, ys, 1, x, n_tokens, mode, pool, path);
}

void matmul_shared_input_cpu(const WeightView* const* ws, float* const* ys, int n, const float* x, int64_t n_tokens,
                             ActMode mode, ThreadPool& pool, CpuPath path) {
    if (n_tokens == 0) return;
    Collector col(pool, n_tokens);
    for (int i = 0; i < n; ++i) {
        if (col.set->n == kMaxJobs) col.flush();  // more weights than one dispatch holds: run what is queued
        JobSet& set = *col.set;
        const WeightView& w = *ws[i];
        Job job{w, x, n_tokens, ys[i], path, nullptr};
        const Int8Layout* layout = int8_layout_for(w.type, path, n_tokens);
        if (mode == ActMode::INT8 && layout) {
            int k = 0;
            while (k < set.n_layouts && set.layouts[k] != layout) ++k;
            if (k == set.n_layouts) {
                if (set.n_layouts == kMaxLayouts) {
                    col.flush();
                    i -= 1;  // this weight goes into the next dispatch
                    continue;
                }
                set.layouts[k] = layout;
                set.acts[k] = quantize_input(layout, x, w.cols, n_tokens, path, set.act_buf[k], pool);
                ++set.n_layouts;
            }
            job.act = &set.acts[k];
        } else {
            job.x = col.input(x, w.cols);
        }
        if (w.rows > 0) set.jobs[set.n++] = job;
    }
    col.run();
}

void matmul_rotated_cpu(const WeightView* const* ws, float* const* ys, int n, float* x, int64_t n_tokens,
                        const Rotation& r, ActMode mode, ThreadPool& pool, CpuPath path) {
    if (n_tokens == 0) return;
    const Int8Layout* layout = mode == ActMode::INT8 ? int8_layout_for(ws[0]->type, path, n_tokens) : nullptr;
    for (int i = 1; i < n && layout; ++i)
        if (int8_layout_for(ws[i]->type, path, n_tokens) != layout) layout = nullptr;
    if (!layout || n > 4) {  // float activations, mixed layouts: rotate once, then the plain matmuls
        rotate_rows(x, n_tokens, ws[0]->cols, r, false, pool, path);
        matmul_shared_input_cpu(ws, ys, n, x, n_tokens, mode, pool, path);
        return;
    }
    Collector col(pool, n_tokens);
    JobSet& set = *col.set;
    set.layouts[0] = layout;
    set.acts[0] = quantize_input(layout, x, ws[0]->cols, n_tokens, path, set.act_buf[0], pool, &r);
    set.n_layouts = 1;
    for (int i = 0; i < n; ++i)
        if (ws[i]->rows > 0) set.jobs[set.n++] = Job{*ws[i], x, n_tokens, ys[i], path, &set.acts[0]};
    col.run();
}

}  // namespace bonsai::cpu
