// A persistent pool of worker threads for the CPU kernels.
//
// parallel_for(n, fn) splits [0, n) into size() contiguous chunks (fewer when n is small) and runs
// fn(begin, end, thread_index) on them; each chunk is claimed by whichever thread comes first,
// the caller included (so a worker the OS has not scheduled yet does not hold the call back, and
// one thread may run several chunks; thread_index is unique per running thread, 0 the caller).
// A pool of one thread runs everything inline. Workers spin briefly on a generation counter
// before sleeping on a condition variable, which keeps the hand-off cheap for the many short
// matmuls of a decode step.
// Calls from several threads are serialized; a parallel_for issued from inside a running chunk
// runs inline (no deadlock). The first exception thrown by a chunk is rethrown to the caller.
//
// run_detached(task) is the variant for work that tracks its own completion: the caller runs
// task->run(0) and returns when that returns, without waiting for the workers that joined; each
// worker that picks the task up runs task->run(its index) once, holding its own reference, so a
// worker the OS descheduled in the middle of it may still be inside run() after the caller moved
// on (the task must make that harmless, e.g. by letting the caller take over unfinished work and
// by never touching memory it does not own). run() must not throw.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace bonsai {

// A thread waiting on another (a pool worker for the next job, a caller for claimed parts) issues
// this many pause instructions, then yields its CPU (thread_pool.cpp says why).
inline constexpr int kPauseIterations = 200;

struct PoolTask {
    virtual ~PoolTask() = default;
    virtual void run(int thread_index) = 0;  // thread_index: 0 the caller, 1.. the workers
};

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);  // n_threads >= 1 (1 = no extra threads)
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const;
    // Runs fn(begin, end, thread_index) over [0, n) split into contiguous chunks; returns when all
    // are done.
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);
    // Runs task on the caller and on every worker that picks it up; returns when the caller's
    // task->run(0) returns (see above).
    void run_detached(const std::shared_ptr<PoolTask>& task);
    // Whether callers may hand this pool detached tasks that read memory they do not own (model
    // weights): the owner sets it when that memory outlives the pool (a Context's model does,
    // since the pool is destroyed, joining every worker, before the model is released).
    void set_inputs_outlive_pool(bool v) { inputs_outlive_pool_ = v; }
    bool inputs_outlive_pool() const { return inputs_outlive_pool_; }

private:
    struct State;
    std::unique_ptr<State> st_;
    bool inputs_outlive_pool_ = false;
};

}  // namespace bonsai
