// Memory-read bandwidth probe (see bandwidth.h).
//
// The buffer is a HugeBuffer (2 MiB pages where the kernel allows them, so page walks do not
// lower the figure) of uint64 words filled by the same threads that later read it (first touch
// places the pages near them). Each thread's share is summed with independent accumulators: with
// AVX-512 (run-time check) four 64-byte loads per step, otherwise eight words per step, which the
// compiler turns into vector loads of the baseline ISA; either way the loop is bound by memory and
// not by the add latency, so the figure is the ceiling the decode kernels, which use the same
// loads, can reach. The sums are combined and stored to a volatile sink so that no read can be
// optimized away. Bytes/s = buffer bytes / wall time of one full pass; the best pass is reported
// (the others suffer from scheduling noise on shared machines), together with the mean.
#include "bonsai/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/huge_buffer.h"
#include "bonsai/thread_pool.h"
#include "../backends/cpu/cpu_features.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define BONSAI_BW_X86 1
#endif

namespace bonsai {

namespace {

volatile uint64_t g_sink = 0;

uint64_t sum_words(const uint64_t* p, int64_t n) {
    uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; ++k) a[k] += p[i + k];
    }
    for (; i < n; ++i) a[0] += p[i];
    uint64_t s = 0;
    for (int k = 0; k < 8; ++k) s += a[k];
    return s;
}

#if BONSAI_BW_X86
__attribute__((target("avx512f"))) uint64_t sum_words_avx512(const uint64_t* p, int64_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
    }
    // a plain store and sum (GCC 12 warns falsely inside _mm512_reduce_add_epi64)
    alignas(64) uint64_t lanes[8];
    _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
    return sum_words(lanes, 8) + sum_words(p + i, n - i);
}
#endif

}  // namespace

BandwidthResult measure_read_bandwidth(uint64_t buffer_bytes, int n_threads, int repeats) {
    if (repeats < 1) throw Error("bandwidth probe: repeats must be >= 1, got " + std::to_string(repeats));
    if (n_threads < 0) throw Error("bandwidth probe: n_threads must be >= 0, got " + std::to_string(n_threads));
    if (buffer_bytes < (uint64_t{1} << 20)) {
        throw Error("bandwidth probe: the buffer must be at least 1 MiB (larger than the caches), got " +
                    std::to_string(buffer_bytes) + " bytes");
    }
    if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
    const int64_t n_words = static_cast<int64_t>(buffer_bytes / 64 * 8);
    HugeBuffer buf(static_cast<size_t>(n_words) * 8);
    if (!buf.data()) {
        throw Error("bandwidth probe: cannot allocate " + std::to_string(buffer_bytes) +
                    " bytes; use a smaller buffer");
    }
    ThreadPool pool(n_threads);
    uint64_t* data = reinterpret_cast<uint64_t*>(buf.data());
    uint64_t (*sum)(const uint64_t*, int64_t) = sum_words;
#if BONSAI_BW_X86
    if (cpu::cpu_has_avx512()) sum = sum_words_avx512;
#endif
    pool.parallel_for(n_words, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) data[i] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    });
    std::vector<uint64_t> partial(n_threads, 0);
    BandwidthResult r;
    r.buffer_bytes = static_cast<uint64_t>(n_words) * 8;
    r.n_threads = n_threads;
    r.repeats = repeats;
    double total = 0.0;
    for (int rep = 0; rep < repeats; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for(n_words, [&](int64_t b, int64_t e, int th) { partial[th] += sum(data + b, e - b); });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double rate = static_cast<double>(r.buffer_bytes) / std::max(s, 1e-9);
        r.bytes_per_s = std::max(r.bytes_per_s, rate);
        total += rate;
    }
    uint64_t s = 0;
    for (uint64_t p : partial) s += p;
    g_sink = s;
    r.mean_bytes_per_s = total / repeats;
    return r;
}

}  // namespace bonsai
