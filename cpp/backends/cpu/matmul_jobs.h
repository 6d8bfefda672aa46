// Internal to the CPU matmul dispatch: the work items of one dispatch and the row runner shared by
// matmul.cpp (entry points, activation quantization, multi-token dispatch) and
// matmul_one_token.cpp (the one-token dispatch as a detached pool task).
//
// A JobSet holds the weights that read one input in one dispatch (at most kMaxJobs) and owns the
// quantized activations they read (one ActInt8 per distinct INT8 layout), so whoever owns the
// set owns everything a kernel reads besides the weights themselves.
#pragma once

#include <cstdint>
#include <vector>

#include "act_quant.h"
#include "bonsai/ops.h"
#include "repack.h"

namespace bonsai::cpu {

constexpr int kMaxLayouts = 4;   // distinct INT8 layouts among the weights of one dispatch
constexpr int kMaxJobs = kMaxLayouts * 4;
// One token: a claim takes 1 / (threads * kGuidedSplit) of the tiles still unclaimed, but at least
// kMinChunkBytes of weights, so claims shrink towards the end of the op and the threads finish
// together (fixed chunks of 1/16 left one thread alone with up to a whole chunk of the output head).
constexpr int64_t kGuidedSplit = 2;
constexpr size_t kMinChunkBytes = 64 << 10;

struct Job {
    WeightView w;
    const float* x;      // FLOAT mode input [n_tokens, w.cols]
    int64_t n_tokens;
    float* y;            // [n_tokens, w.rows]
    CpuPath path;
    const ActInt8* act;  // nullptr in FLOAT mode
};

struct JobSet {
    Job jobs[kMaxJobs];
    int n = 0;
    const Int8Layout* layouts[kMaxLayouts];
    ActInt8 acts[kMaxLayouts];
    std::vector<uint8_t> act_buf[kMaxLayouts];
    int n_layouts = 0;
    std::vector<float> x_own;  // a copy of the FLOAT-mode input, when the set must own it
    void clear() {
        n = 0;
        n_layouts = 0;
        x_own.clear();
    }
};

// 64-byte aligned start of at least `bytes` bytes of buf (grown as needed).
void* grow_scratch(std::vector<uint8_t>& buf, size_t bytes);

// Rows per tile, the unit of work handed to a thread: repack.h's tile_rows of the weight's type (4;
// the 16 rows of a PTQ1_0_R16 tile).
inline int64_t job_tile_rows(const Job& j) { return tile_rows(j.w.type); }
inline int64_t job_tiles(const Job& j) { return (j.w.rows + job_tile_rows(j) - 1) / job_tile_rows(j); }

// Rows of tiles [tile_begin, tile_end) of job j into y, which receives row r of token t at
// y[t * j.w.rows + r] (j.y itself, or a buffer laid out the same way).
void run_rows(const Job& j, int64_t tile_begin, int64_t tile_end, float* y);

// The one-token dispatch as a detached task (matmul_one_token.cpp), used unless the pool has one
// thread or its owner has not declared the weights longer-lived than the pool;
// the caller then dispatches the set itself. acquire returns a task (nullptr when it does not
// apply) whose set the caller fills, the inputs copied in (see JobSet), then runs it.
struct OneTokenTask;
OneTokenTask* acquire_one_token_task(ThreadPool& pool);
JobSet& one_token_task_set(OneTokenTask* task);
void run_one_token_task(OneTokenTask* task, ThreadPool& pool);

// Test seam: workers of one-token tasks sleep this long before committing each chunk (0: never),
// so that the caller takes their chunks over; the count of takeovers so far.
void set_one_token_worker_delay_for_tests(int64_t ns);
int64_t one_token_takeovers_for_tests();

}  // namespace bonsai::cpu
