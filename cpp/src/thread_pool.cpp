// ThreadPool: one job at a time, its parts claimed by whoever comes first.
//
// A job is fn, n and `parts` contiguous chunks. Publishing stores the job fields, then one 64-bit
// atomic word `claim` = generation << 32 | parts << 16 | next part (release). Every participant
// (the caller and the workers) claims parts by a compare-and-swap that increments `next` only
// while the generation is still the one it saw and next < parts, so a claim always refers to the
// job whose fields it then reads (acquire); a worker that wakes up late sees an exhausted or newer
// word and claims nothing stale. The caller claims parts too, so a worker that the OS has not
// scheduled does not hold the caller back: the caller only waits for parts already claimed, and
// job fields are not overwritten before every claimed part has finished (`done` == parts).
// A detached job (run_detached; flag bit in the parts field) has one part per worker and a task
// pointer instead of fn: a worker that claims a part takes its own reference to the task
// (atomic shared_ptr load) and runs it once; nobody counts detached parts in `done` and the caller
// does not wait for them, so a late worker only ever touches the task it holds.
// Workers spin briefly on the generation, then sleep on a condition variable; the caller wakes
// them only when some sleep. While waiting for claimed parts the caller spins, then yields
// (kPauseIterations, thread_pool.h).
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
// Waiting (a worker for the next job, the caller for claimed parts): kPauseIterations (thread_pool.h) pause
// instructions, then sched_yield() up to kSpinIterations in all, then (a worker) sleep. Yielding
// early matters when the machine is shared: if the thread being waited for was put on the same
// CPU, a spinning waiter would hold it off for the rest of its time slice; on an otherwise idle
// CPU the yield returns at once.
constexpr int kSpinIterations = 4000;  // pauses + yields before a worker sleeps
constexpr int kMaxThreads = 0x7FFF;  // parts (<= threads) are 15 bits of the claim word
constexpr uint64_t kDetached = uint64_t{1} << 31;  // bit 15 of the parts field: a detached job
thread_local bool t_inside_pool = false;

inline uint32_t word_gen(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
inline int word_parts(uint64_t w) { return static_cast<int>((w >> 16) & 0x7FFF); }
inline int word_next(uint64_t w) { return static_cast<int>(w & 0xFFFF); }
}  // namespace

struct ThreadPool::State {
    int n_threads = 1;
    std::vector<std::thread> workers;
    std::mutex m;
    std::condition_variable cv_work;
    std::atomic<uint64_t> claim{0};  // generation << 32 | parts << 16 | next part
    std::atomic<int> done{0};        // finished parts of the current job
    std::atomic<int> sleepers{0};    // workers waiting on cv_work
    std::atomic<bool> stop{false};

    const std::function<void(int64_t, int64_t, int)>* fn = nullptr;  // job of the current generation
    int64_t n = 0;
    std::shared_ptr<PoolTask> task;  // detached job of the current generation (atomic loads/stores)

    std::mutex call_m;  // one parallel_for at a time
    std::mutex err_m;
    std::exception_ptr err;

    // Claims and runs parts of generation `gen` until none is left; returns when it got none.
    void run_parts(uint32_t gen, int thread) {
        uint64_t w = claim.load(std::memory_order_acquire);
        for (;;) {
            if (word_gen(w) != gen || word_next(w) >= word_parts(w)) return;
            if (!claim.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
            if (w & kDetached) {
                const std::shared_ptr<PoolTask> t = std::atomic_load(&task);
                if (t) t->run(thread);
                return;
            }
            const int parts = word_parts(w), i = word_next(w);
            const int64_t begin = n * i / parts, end = n * (i + 1) / parts;
            if (begin < end) {
                try {
                    (*fn)(begin, end, thread);
                } catch (...) {
                    std::lock_guard<std::mutex> lk(err_m);
                    if (!err) err = std::current_exception();
                }
            }
            done.fetch_add(1, std::memory_order_acq_rel);
            w = claim.load(std::memory_order_acquire);
        }
    }

    void worker_loop(int index) {
        t_inside_pool = true;
        uint32_t seen = 0;
        for (;;) {
            uint32_t gen = word_gen(claim.load(std::memory_order_acquire));
            for (int s = 0; s < kSpinIterations && gen == seen && !stop.load(std::memory_order_relaxed); ++s) {
                if (s < kPauseIterations)
                    BONSAI_CPU_RELAX();
                else
                    std::this_thread::yield();
                gen = word_gen(claim.load(std::memory_order_acquire));
            }
            if (gen == seen) {
                std::unique_lock<std::mutex> lk(m);
                sleepers.fetch_add(1, std::memory_order_seq_cst);
                cv_work.wait(lk, [&] {
                    return stop.load(std::memory_order_acquire) ||
                           word_gen(claim.load(std::memory_order_seq_cst)) != seen;
                });
                sleepers.fetch_sub(1, std::memory_order_relaxed);
                gen = word_gen(claim.load(std::memory_order_acquire));
            }
            if (stop.load(std::memory_order_acquire)) return;
            seen = gen;
            run_parts(gen, index);
        }
    }
};

ThreadPool::ThreadPool(int n_threads) : st_(new State) {
    if (n_threads < 1 || n_threads > kMaxThreads)
        throw Error("ThreadPool: n_threads must be between 1 and " + std::to_string(kMaxThreads) + " (got " +
                    std::to_string(n_threads) + ")");
    st_->n_threads = n_threads;
    st_->workers.reserve(n_threads - 1);
    for (int i = 1; i < n_threads; ++i) st_->workers.emplace_back([s = st_.get(), i] { s->worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(st_->m);
        st_->stop.store(true, std::memory_order_release);
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
    const int parts = static_cast<int>(n < s.n_threads ? n : s.n_threads);
    std::atomic_store(&s.task, std::shared_ptr<PoolTask>());
    s.fn = &fn;
    s.n = n;
    s.err = nullptr;
    s.done.store(0, std::memory_order_relaxed);
    const uint32_t gen = word_gen(s.claim.load(std::memory_order_relaxed)) + 1;
    s.claim.store(static_cast<uint64_t>(gen) << 32 | static_cast<uint64_t>(parts) << 16, std::memory_order_seq_cst);
    if (s.sleepers.load(std::memory_order_seq_cst) > 0) {
        std::lock_guard<std::mutex> lk(s.m);  // a worker between its check and its wait sees the new word
        s.cv_work.notify_all();
    }
    t_inside_pool = true;
    s.run_parts(gen, 0);
    t_inside_pool = false;
    for (int i = 0; s.done.load(std::memory_order_acquire) != parts; ++i) {
        if (i < kPauseIterations)
            BONSAI_CPU_RELAX();
        else
            std::this_thread::yield();
    }
    s.fn = nullptr;
    if (s.err) std::rethrow_exception(s.err);
}

void ThreadPool::run_detached(const std::shared_ptr<PoolTask>& task) {
    State& s = *st_;
    if (s.n_threads == 1 || t_inside_pool) {
        task->run(0);
        return;
    }
    std::lock_guard<std::mutex> call_lock(s.call_m);
    std::atomic_store(&s.task, task);
    const uint32_t gen = word_gen(s.claim.load(std::memory_order_relaxed)) + 1;
    const uint64_t parts = static_cast<uint64_t>(s.n_threads - 1);  // one per worker; the caller runs its own
    s.claim.store(static_cast<uint64_t>(gen) << 32 | kDetached | parts << 16, std::memory_order_seq_cst);
    if (s.sleepers.load(std::memory_order_seq_cst) > 0) {
        std::lock_guard<std::mutex> lk(s.m);
        s.cv_work.notify_all();
    }
    t_inside_pool = true;
    task->run(0);
    t_inside_pool = false;
}

}  // namespace bonsai
