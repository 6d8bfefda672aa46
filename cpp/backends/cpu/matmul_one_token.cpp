// One-token matmul dispatch as a detached pool task (ThreadPool::run_detached), for pools whose
// weights outlive them (a Context's).
//
// The tiles of the set's weights form one list handed out through an atomic counter in guided
// chunks (a fixed fraction of what is left, between kMinChunkBytes (matmul_jobs.h) and
// kMaxChunkBytes of weights).
// The caller computes its chunks straight into the outputs. A worker computes a chunk into its own
// buffer and then commits it: a compare-and-swap moves its slot from RUNNING to COMMITTING, it
// copies the rows into the outputs and adds them to `done`. When nothing is left to claim, the
// caller waits for `done` to reach the total, and takes over a worker chunk still RUNNING after a
// grace period (twice the time the caller itself needs for that many bytes, at least
// kStealAfterNs): a compare-and-swap moves the slot to STOLEN and the caller computes the rows.
// A worker the OS deschedules in the middle of a chunk thus costs the caller about one chunk of
// work instead of the rest of the worker's time slice (on a machine shared with other CPU-bound
// processes that happens every few tokens); when it runs again its commit fails and its rows are
// dropped. Since it may still be computing after the caller has returned, everything it reads is
// owned by the task (the job list, the activations, a FLOAT-mode input copy) or outlives the pool
// (the weights), and a task is reused only when no worker holds it any more. Results do not
// depend on who computes a chunk: the same kernel runs the same rows either way.
//
// Slot word: status (2 bits) | claim sequence number (14 bits) | first tile (24 bits) | end tile
// (24 bits), so one compare-and-swap checks that the slot still holds the same claim.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "matmul_jobs.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BONSAI_SPIN_PAUSE() _mm_pause()
#else
#define BONSAI_SPIN_PAUSE() ((void)0)
#endif

namespace bonsai::cpu {

namespace {

constexpr size_t kMaxChunkBytes = 1 << 20;         // guided chunks at most this big (bounds a takeover)
constexpr int64_t kStealAfterNs = 20000;           // the shortest grace before a takeover
constexpr int kMaxTasks = 8;                       // recycled tasks per calling thread
constexpr int64_t kMaxTiles = int64_t{1} << 24;    // tile indices fit the slot word

enum : uint64_t { IDLE = 0, RUNNING = 1, COMMITTING = 2, STOLEN = 3 };

uint64_t pack(uint64_t status, uint64_t seq, int64_t c, int64_t e) {
    return status << 62 | (seq & 0x3FFF) << 48 | static_cast<uint64_t>(c) << 24 | static_cast<uint64_t>(e);
}
uint64_t word_status(uint64_t w) { return w >> 62; }
int64_t word_first(uint64_t w) { return static_cast<int64_t>((w >> 24) & 0xFFFFFF); }
int64_t word_end(uint64_t w) { return static_cast<int64_t>(w & 0xFFFFFF); }

std::atomic<int64_t> g_test_delay_ns{0};
std::atomic<int64_t> g_takeovers{0};

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

struct OneTokenTask final : PoolTask {
    JobSet set;
    std::shared_ptr<OneTokenTask>* holder = nullptr;  // this task's entry in the caller's ring
    int64_t first_tile[kMaxJobs + 1] = {};
    int64_t total = 0, min_chunk = 1, max_chunk = 1, threads = 1;
    double bytes_per_tile = 1.0;
    std::atomic<int64_t> next{0}, done{0};
    struct alignas(64) Slot {
        std::atomic<uint64_t> word{0};
        uint64_t seq = 0;        // the owner's claim counter
        std::vector<float> out;  // the owner's rows of its current chunk
    };
    std::unique_ptr<Slot[]> slots;
    int64_t n_slots = 0;

    // Called by the owning thread while no worker holds the task.
    void prepare(int64_t n_threads) {
        threads = n_threads;
        if (n_slots < threads) {
            slots = std::make_unique<Slot[]>(static_cast<size_t>(threads));
            n_slots = threads;
        }
        for (int64_t t = 0; t < n_slots; ++t) slots[t].word.store(pack(IDLE, 0, 0, 0), std::memory_order_relaxed);
        first_tile[0] = 0;
        size_t bytes = 0;
        for (int i = 0; i < set.n; ++i) {
            first_tile[i + 1] = first_tile[i] + job_tiles(set.jobs[i]);
            bytes += static_cast<size_t>(set.jobs[i].w.rows) * set.jobs[i].w.row_bytes;
        }
        total = first_tile[set.n];
        bytes_per_tile = total > 0 ? static_cast<double>(bytes) / static_cast<double>(total) : 1.0;
        min_chunk = std::max<int64_t>(1, static_cast<int64_t>(kMinChunkBytes / bytes_per_tile));
        max_chunk = std::max<int64_t>(min_chunk, static_cast<int64_t>(kMaxChunkBytes / bytes_per_tile));
        next.store(0, std::memory_order_relaxed);
        done.store(0, std::memory_order_relaxed);
    }

    bool claim(int64_t& c, int64_t& e) {
        c = next.load(std::memory_order_relaxed);
        do {
            if (c >= total) return false;
            const int64_t size = std::clamp((total - c) / (threads * kGuidedSplit), min_chunk, max_chunk);
            e = std::min(total, c + size);
        } while (!next.compare_exchange_weak(c, e, std::memory_order_relaxed));
        return true;
    }

    // Tiles [c, e) into the outputs.
    void run_range(int64_t c, int64_t e) const {
        for (int i = 0; i < set.n && c < e; ++i) {
            const int64_t lo = std::max(c, first_tile[i]), hi = std::min(e, first_tile[i + 1]);
            if (lo < hi) run_rows(set.jobs[i], lo - first_tile[i], hi - first_tile[i], set.jobs[i].y);
        }
    }

    // Calls f(job, first row, row count, offset into a chunk buffer) for the rows of tiles [c, e).
    template <class F>
    void for_segments(int64_t c, int64_t e, F f) const {
        int64_t off = 0;
        for (int i = 0; i < set.n && c < e; ++i) {
            const int64_t lo = std::max(c, first_tile[i]), hi = std::min(e, first_tile[i + 1]);
            if (lo >= hi) continue;
            const Job& j = set.jobs[i];
            const int64_t tr = job_tile_rows(j);
            const int64_t r0 = (lo - first_tile[i]) * tr;
            const int64_t r1 = std::min((hi - first_tile[i]) * tr, j.w.rows);
            f(j, r0, r1 - r0, off);
            off += r1 - r0;
        }
    }

    void run_worker(int thread) {
        Slot& sl = slots[thread];
        int64_t c, e;
        while (claim(c, e)) {
            const uint64_t running = pack(RUNNING, ++sl.seq, c, e);
            sl.word.store(running, std::memory_order_release);
            const int64_t rows = (e - c) * kMaxTileRows;  // at most
            if (static_cast<int64_t>(sl.out.size()) < rows) sl.out.resize(static_cast<size_t>(rows));
            for_segments(c, e, [&](const Job& j, int64_t r0, int64_t n, int64_t off) {
                Job part = j;  // the rows [r0, r0 + n) as a weight of their own, writing out[off..]
                part.w.data = static_cast<const uint8_t*>(j.w.data) + r0 * static_cast<int64_t>(j.w.row_bytes);
                part.w.rows = n;
                run_rows(part, 0, job_tiles(part), sl.out.data() + off);
            });
            if (const int64_t d = g_test_delay_ns.load(std::memory_order_relaxed))
                std::this_thread::sleep_for(std::chrono::nanoseconds(d));
            uint64_t expect = running;
            if (sl.word.compare_exchange_strong(expect, pack(COMMITTING, sl.seq, c, e), std::memory_order_acq_rel,
                                                std::memory_order_acquire)) {
                for_segments(c, e, [&](const Job& j, int64_t r0, int64_t n, int64_t off) {
                    std::memcpy(j.y + r0, sl.out.data() + off, sizeof(float) * static_cast<size_t>(n));
                });
                done.fetch_add(e - c, std::memory_order_release);
            }
            sl.word.store(pack(IDLE, sl.seq, 0, 0), std::memory_order_release);
        }
    }

    void run_caller() {
        int64_t c, e, my_tiles = 0;
        const int64_t t0 = now_ns();
        while (claim(c, e)) {
            run_range(c, e);
            my_tiles += e - c;
            done.fetch_add(e - c, std::memory_order_relaxed);
        }
        const int64_t wait0 = now_ns();
        const double ns_per_tile = my_tiles > 0 ? static_cast<double>(wait0 - t0) / static_cast<double>(my_tiles)
                                                : bytes_per_tile / 2.0;  // no sample: assume 2 GB/s
        for (int spin = 0; done.load(std::memory_order_acquire) < total; ++spin) {
            if (spin < kPauseIterations) BONSAI_SPIN_PAUSE();
            if (spin % 64 != 0 && spin < kPauseIterations) continue;
            const int64_t waited = now_ns() - wait0;
            for (int64_t t = 1; t < threads; ++t) {
                uint64_t w = slots[t].word.load(std::memory_order_acquire);
                if (word_status(w) != RUNNING) continue;
                const int64_t wc = word_first(w), we = word_end(w);
                const double grace = std::max<double>(kStealAfterNs, 2.0 * ns_per_tile * static_cast<double>(we - wc));
                if (static_cast<double>(waited) < grace) continue;
                if (slots[t].word.compare_exchange_strong(w, (w & ~(uint64_t{3} << 62)) | STOLEN << 62,
                                                          std::memory_order_acq_rel, std::memory_order_acquire)) {
                    run_range(wc, we);
                    done.fetch_add(we - wc, std::memory_order_relaxed);
                    g_takeovers.fetch_add(1, std::memory_order_relaxed);
                }
            }
            if (spin >= kPauseIterations) std::this_thread::yield();
        }
    }

    void run(int thread) override {
        if (thread == 0)
            run_caller();
        else if (thread < threads)
            run_worker(thread);
    }
};

void set_one_token_worker_delay_for_tests(int64_t ns) { g_test_delay_ns.store(ns, std::memory_order_relaxed); }
int64_t one_token_takeovers_for_tests() { return g_takeovers.load(std::memory_order_relaxed); }

OneTokenTask* acquire_one_token_task(ThreadPool& pool) {
    if (pool.size() < 2 || !pool.inputs_outlive_pool()) return nullptr;
    static thread_local std::vector<std::shared_ptr<OneTokenTask>> ring = [] {
        std::vector<std::shared_ptr<OneTokenTask>> r;
        r.reserve(kMaxTasks);  // entries never move: tasks point at theirs
        return r;
    }();
    for (auto& t : ring) {
        if (t.use_count() == 1) {  // nobody else holds it: no worker can still be inside it
            std::atomic_thread_fence(std::memory_order_acquire);
            return t.get();
        }
    }
    if (ring.size() == kMaxTasks) return nullptr;
    ring.push_back(std::make_shared<OneTokenTask>());
    ring.back()->holder = &ring.back();
    return ring.back().get();
}

JobSet& one_token_task_set(OneTokenTask* task) { return task->set; }

void run_one_token_task(OneTokenTask* task, ThreadPool& pool) {
    task->prepare(pool.size());
    if (task->total == 0) return;
    if (task->total >= kMaxTiles) {  // beyond the slot word: run it on the caller alone
        task->run_range(0, task->total);
        return;
    }
    pool.run_detached(*task->holder);
}

}  // namespace bonsai::cpu
