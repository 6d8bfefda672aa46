// ThreadPool: workers wait on a generation counter (spin, then a condition variable); the caller
// publishes a job, bumps the generation, runs chunk 0 itself and waits until every worker has
// acknowledged the generation, so job fields are never overwritten while a worker still reads them.
#include "bonsai/thread_pool.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "bonsai/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BONSAI_CPU_RELAX() _mm_pause()
#else
#define BONSAI_CPU_RELAX() std::this_thread::yield()
#endif

namespace bonsai {

namespace {
constexpr int kSpinIterations = 4000;  // ~tens of microseconds before a worker goes to sleep
thread_local bool t_inside_pool = false;
}  // namespace

struct ThreadPool::State {
    int n_threads = 1;
    std::vector<std::thread> workers;
    std::mutex m;
    std::condition_variable cv_work, cv_done;
    std::atomic<uint64_t> generation{0};
    std::atomic<int> pending{0};
    bool stop = false;

    const std::function<void(int64_t, int64_t, int)>* fn = nullptr;  // job of the current generation
    int64_t n = 0;
    int parts = 0;

    std::mutex call_m;  // one parallel_for at a time
    std::mutex err_m;
    std::exception_ptr err;

    void run_chunk(int i) {
        const int64_t begin = n * i / parts, end = n * (i + 1) / parts;
        if (begin >= end) return;
        try {
            (*fn)(begin, end, i);
        } catch (...) {
            std::lock_guard<std::mutex> lk(err_m);
            if (!err) err = std::current_exception();
        }
    }

    void worker_loop(int index) {
        t_inside_pool = true;
        uint64_t seen = 0;
        for (;;) {
            for (int s = 0; s < kSpinIterations && generation.load(std::memory_order_acquire) == seen; ++s)
                BONSAI_CPU_RELAX();
            if (generation.load(std::memory_order_acquire) == seen) {
                std::unique_lock<std::mutex> lk(m);
                cv_work.wait(lk, [&] { return stop || generation.load(std::memory_order_acquire) != seen; });
            }
            {
                std::lock_guard<std::mutex> lk(m);
                if (stop) return;
            }
            seen = generation.load(std::memory_order_acquire);
            if (index < parts) run_chunk(index);
            if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                std::lock_guard<std::mutex> lk(m);
                cv_done.notify_one();
            }
        }
    }
};

ThreadPool::ThreadPool(int n_threads) : st_(new State) {
    if (n_threads < 1)
        throw Error("ThreadPool: n_threads must be >= 1 (got " + std::to_string(n_threads) + ")");
    st_->n_threads = n_threads;
    st_->workers.reserve(n_threads - 1);
    for (int i = 1; i < n_threads; ++i) st_->workers.emplace_back([s = st_.get(), i] { s->worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(st_->m);
        st_->stop = true;
        st_->generation.fetch_add(1, std::memory_order_acq_rel);
    }
    st_->cv_work.notify_all();
    for (auto& t : st_->workers) t.join();
}

int ThreadPool::size() const { return st_->n_threads; }

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    State& s = *st_;
    if (s.n_threads == 1 || n == 1 || t_inside_pool) {
        fn(0, n, 0);
        return;
    }
    std::lock_guard<std::mutex> call_lock(s.call_m);
    s.fn = &fn;
    s.n = n;
    s.parts = static_cast<int>(n < s.n_threads ? n : s.n_threads);
    s.err = nullptr;
    s.pending.store(s.n_threads - 1, std::memory_order_release);
    {
        std::lock_guard<std::mutex> lk(s.m);
        s.generation.fetch_add(1, std::memory_order_acq_rel);
    }
    s.cv_work.notify_all();
    t_inside_pool = true;
    s.run_chunk(0);
    t_inside_pool = false;
    for (int i = 0; i < kSpinIterations && s.pending.load(std::memory_order_acquire) != 0; ++i)
        BONSAI_CPU_RELAX();
    if (s.pending.load(std::memory_order_acquire) != 0) {
        std::unique_lock<std::mutex> lk(s.m);
        s.cv_done.wait(lk, [&] { return s.pending.load(std::memory_order_acquire) == 0; });
    }
    s.fn = nullptr;
    if (s.err) std::rethrow_exception(s.err);
}

}  // namespace bonsai
