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
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace bonsai {

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

private:
    struct State;
    std::unique_ptr<State> st_;
};

}  // namespace bonsai
