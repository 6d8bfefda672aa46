// C++ unit test of the thread pool and the CPU matmul: chunk coverage, exceptions and nesting in
// ThreadPool; INT8 results bit-identical across every available path and thread count, close to a
// double-precision reference built from the scalar block unpacker; matmul_shared_input equal bit for
// bit to separate matmul calls; shape errors throw; repacked weights (PTQ1_0_R16, Q8_0_R4) give the
// file types' results bit for bit on every path.
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#if defined(__unix__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "../backends/cpu/block_unpack.h"
#include "../backends/cpu/cpu_features.h"
#include "../backends/cpu/matmul_jobs.h"
#include "../backends/cpu/ptq1_0_r16.h"
#include "../backends/cpu/repack.h"
#include "bonsai/error.h"
#include "bonsai/ops.h"
#include "bonsai/quant_blocks.h"
#include "bonsai/quants.h"
#include "bonsai/types.h"
#include "check.h"

using namespace bonsai;

template <class F>
static bool throws(F&& f) {
    try {
        f();
    } catch (const Error&) {
        return true;
    }
    return false;
}

static void test_thread_pool() {
    for (int threads : {1, 2, 3, 5}) {
        ThreadPool pool(threads);
        CHECK(pool.size() == threads);
        for (int64_t n : {0, 1, 2, 7, 1000}) {
            std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
            for (auto& h : hits) h = 0;
            pool.parallel_for(n, [&](int64_t b, int64_t e, int ti) {
                CHECK(ti >= 0 && ti < threads);
                for (int64_t i = b; i < e; ++i) hits[i]++;
            });
            for (auto& h : hits) CHECK(h.load() == 1);
        }
        bool caught = false;
        try {
            pool.parallel_for(10, [](int64_t, int64_t, int) { throw Error("boom"); });
        } catch (const Error&) {
            caught = true;
        }
        CHECK(caught);
        std::atomic<int> inner{0};
        pool.parallel_for(4, [&](int64_t b, int64_t e, int) {
            pool.parallel_for(e - b, [&](int64_t ib, int64_t ie, int) { inner += static_cast<int>(ie - ib); });
        });
        CHECK(inner.load() == 4);
        // Back-to-back jobs of varying size: every index exactly once per call (no part lost or
        // run twice when a late worker meets a newer job).
        std::vector<std::atomic<int>> seen(8);
        bool all_once = true;
        for (int call = 0; call < 3000; ++call) {
            const int64_t n = 1 + call % 8;
            for (auto& h : seen) h = 0;
            pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
                for (int64_t i = b; i < e; ++i) seen[i]++;
            });
            for (int64_t i = 0; i < 8; ++i) all_once = all_once && seen[i].load() == (i < n ? 1 : 0);
        }
        CHECK(all_once);
    }
    CHECK(throws([] { ThreadPool p(0); }));
}

struct Case {
    GgmlType type;
    int64_t cols;
};

static std::vector<uint8_t> random_weight(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
    const TypeTraits* t = type_traits(type);
    std::vector<uint8_t> w(static_cast<size_t>(rows) * type_row_bytes(type, cols));
    for (auto& b : w) b = static_cast<uint8_t>(rng());
    const cpu::BlockInfo* bi = cpu::block_info(type);
    if (!bi) return w;  // F32 / F16 / BF16: raw random bits
    for (size_t off = 0; off < w.size(); off += static_cast<size_t>(t->type_size)) {
        // a moderate fp16 scale: exponent 0b01010..0b01100, random mantissa and sign
        const uint16_t h = static_cast<uint16_t>((rng() & 0x83ffu) | (0x28u + rng() % 3) << 10);
        std::memcpy(&w[off + bi->d_offset], &h, 2);
    }
    return w;
}

// w's INT8 result on every available path, with 1 and 2 threads and both AVX-512 base-3 unpackers,
// equals ref bit for bit.
static void check_int8_paths(const WeightView& w, const std::vector<float>& x, int64_t nt, const std::vector<float>& ref,
                             ThreadPool& pool1, ThreadPool& pool2) {
    std::vector<float> y(ref.size());
    for (CpuPath p : available_cpu_paths())
        for (ThreadPool* pool : {&pool1, &pool2})
            for (bool vbmi : {false, true}) {
                cpu::set_avx512_vbmi_enabled(vbmi);
                std::fill(y.begin(), y.end(), -1.0f);
                matmul_on_path(w, x.data(), nt, y.data(), ActMode::INT8, *pool, p);
                CHECK(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)) == 0);
            }
    cpu::set_avx512_vbmi_enabled(true);
}

static void test_int8_paths() {
    // Q2_0 / Q4_0 (four blocks per unit): row ends with 1, 2 and 3 blocks past the last full unit.
    const Case cases[] = {{TYPE_PTQ1_0, 384}, {TYPE_PTQ1_0, 2048}, {TYPE_TQ1_0, 512},  {TYPE_TQ2_0, 768},
                          {TYPE_Q2_0, 320},   {TYPE_Q2_0, 448},     {TYPE_Q2_0_G128, 640}, {TYPE_PQ2_0, 384},
                          {TYPE_Q4_0, 96},    {TYPE_Q4_0, 192},     {TYPE_Q8_0, 224}};
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    ThreadPool pool1(1), pool2(2);
    for (const Case& c : cases) {
        const int64_t rows = 29;
        std::vector<uint8_t> w = random_weight(c.type, rows, c.cols, rng);
        const WeightView wv{c.type, w.data(), rows, c.cols, type_row_bytes(c.type, c.cols)};
        for (int64_t nt : {1, 4, 19}) {
            std::vector<float> x(static_cast<size_t>(nt * c.cols));
            for (auto& v : x) v = nd(rng);
            std::vector<float> ref(static_cast<size_t>(nt * rows)), y(ref.size());
            matmul_on_path(wv, x.data(), nt, ref.data(), ActMode::INT8, pool1, CpuPath::SCALAR);
            check_int8_paths(wv, x, nt, ref, pool1, pool2);
            // The kernels' block unpacker agrees with the reference dequantizer.
            std::vector<float> wd(static_cast<size_t>(c.cols)), wref(wd.size());
            for (int64_t r = 0; r < rows; ++r) {
                cpu::dequantize_row_cpu(c.type, w.data() + r * wv.row_bytes, c.cols, wd.data());
                dequantize_row(c.type, w.data() + r * wv.row_bytes, wref.data(), c.cols);
                CHECK(std::memcmp(wd.data(), wref.data(), wd.size() * sizeof(float)) == 0);
            }
            // Float-mode result against a double reference of the dequantized weights.
            matmul_on_path(wv, x.data(), nt, y.data(), ActMode::FLOAT, pool2, active_cpu_path());
            for (int64_t r = 0; r < rows; ++r) {
                cpu::dequantize_row_cpu(c.type, w.data() + r * wv.row_bytes, c.cols, wd.data());
                for (int64_t t = 0; t < nt; ++t) {
                    double s = 0, sa = 0;
                    for (int64_t k = 0; k < c.cols; ++k) {
                        s += static_cast<double>(wd[k]) * x[t * c.cols + k];
                        sa += std::fabs(static_cast<double>(wd[k]) * x[t * c.cols + k]);
                    }
                    CHECK(std::fabs(y[t * rows + r] - s) <= 1e-5 * sa + 1e-30);
                    // INT8 result: within the activation quantization error of the float one.
                    CHECK(std::fabs(ref[t * rows + r] - s) <= 0.05 * sa + 1e-30);
                }
            }
        }
    }
}

// Weights that end exactly at a page followed by an inaccessible page: any kernel read past the
// last block faults. Every type (and the repacked PTQ1_0 / Q8_0 orders), path, mode and tile shape runs over them.
static void test_no_read_past_end() {
#if defined(__unix__)
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    struct Weight {
        GgmlType type;
        int64_t cols;
        GgmlType stored;  // type, or a repacked type of it (repack.h)
    };
    std::vector<Weight> weights;
    for (GgmlType type : {TYPE_PTQ1_0, TYPE_TQ1_0, TYPE_TQ2_0, TYPE_Q2_0, TYPE_Q2_0_G128, TYPE_PQ2_0, TYPE_Q4_0,
                          TYPE_Q8_0, TYPE_F32, TYPE_F16, TYPE_BF16})
        weights.push_back({type, type_traits(type)->block_size == 256 ? 768 : 640, type});
    for (GgmlType r16 : {TYPE_PTQ1_0_R16, TYPE_PTQ1_0_R16L})
        for (int64_t cols : {1024, 1408}) weights.push_back({TYPE_PTQ1_0, cols, r16});
    weights.push_back({TYPE_Q8_0, 2080, TYPE_Q8_0_R4});
    std::mt19937 rng(3);
    ThreadPool pool(2);
    for (const Weight& wt : weights) {
        const GgmlType type = wt.type;
        const int64_t cols = wt.cols, rows = 7;
        std::vector<uint8_t> w = random_weight(type, rows, cols, rng);
        const size_t pages = (w.size() + page - 1) / page + 1;
        void* mem = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(mem != MAP_FAILED);
        if (mem == MAP_FAILED) return;
        uint8_t* guard = static_cast<uint8_t*>(mem) + (pages - 1) * page;
        mprotect(guard, page, PROT_NONE);
        uint8_t* data = guard - w.size();
        const size_t rb = type_row_bytes(type, cols);
        if (wt.stored != type)
            cpu::repack_rows(wt.stored, w.data(), data, rows, static_cast<int64_t>(rb), 0, rows);
        else
            std::memcpy(data, w.data(), w.size());
        const WeightView wv{wt.stored, data, rows, cols, rb};
        for (int64_t nt : {1, 2, 3, 17}) {
            std::vector<float> x(static_cast<size_t>(nt * cols), 0.25f), y(static_cast<size_t>(nt * rows));
            for (CpuPath p : available_cpu_paths())
                for (ActMode mode : {ActMode::INT8, ActMode::FLOAT})
                    matmul_on_path(wv, x.data(), nt, y.data(), mode, pool, p);
        }
        const int32_t last = static_cast<int32_t>(rows - 1);
        std::vector<float> row(static_cast<size_t>(cols));
        get_rows(wv, &last, 1, row.data());
        munmap(mem, pages * page);
    }
#endif
}

// matmul_shared_input against one matmul per weight, bit for bit: mixed types (two INT8 layouts
// sharing a quantization, a third of its own, a float weight), odd row counts, 1..5 tokens, every
// path, both AVX-512 base-3 unpackers, 1 and 2 threads, both modes; more weights than one
// dispatch holds; mismatched columns throw.
static void test_shared_input() {
    const int64_t cols = 512;
    const GgmlType types[] = {TYPE_PTQ1_0, TYPE_PTQ1_0, TYPE_Q8_0, TYPE_F16, TYPE_PQ2_0, TYPE_Q2_0, TYPE_TQ2_0};
    const int64_t rows[] = {37, 5, 66, 19, 1, 23, 9};
    constexpr int n = 7;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<std::vector<uint8_t>> w;
    std::vector<WeightView> wv;
    for (int i = 0; i < n; ++i) w.push_back(random_weight(types[i], rows[i], cols, rng));
    for (int i = 0; i < n; ++i) wv.push_back(WeightView{types[i], w[i].data(), rows[i], cols, type_row_bytes(types[i], cols)});
    ThreadPool pool1(1), pool2(2);
    for (int64_t nt : {1, 2, 5}) {
        std::vector<float> x(static_cast<size_t>(nt * cols));
        for (auto& v : x) v = nd(rng);
        for (CpuPath p : available_cpu_paths())
            for (ThreadPool* pool : {&pool1, &pool2})
                for (ActMode mode : {ActMode::INT8, ActMode::FLOAT})
                    for (bool vbmi : {false, true}) {
                        cpu::set_avx512_vbmi_enabled(vbmi);
                        std::vector<std::vector<float>> want(n), got(n);
                        const WeightView* ws[n];
                        float* ys[n];
                        for (int i = 0; i < n; ++i) {
                            want[i].assign(static_cast<size_t>(nt * rows[i]), 0.0f);
                            got[i].assign(want[i].size(), -1.0f);
                            matmul_on_path(wv[i], x.data(), nt, want[i].data(), mode, *pool, p);
                            ws[i] = &wv[i];
                            ys[i] = got[i].data();
                        }
                        matmul_shared_input_on_path(ws, ys, n, x.data(), nt, mode, *pool, p);
                        for (int i = 0; i < n; ++i)
                            CHECK(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)) == 0);
                    }
        cpu::set_avx512_vbmi_enabled(true);
    }
    // 20 weights: more than one dispatch holds.
    std::vector<const WeightView*> many(20, &wv[0]);
    std::vector<std::vector<float>> outs(20, std::vector<float>(static_cast<size_t>(rows[0])));
    std::vector<float*> ys;
    for (auto& o : outs) ys.push_back(o.data());
    std::vector<float> x(static_cast<size_t>(cols)), want(static_cast<size_t>(rows[0]));
    for (auto& v : x) v = nd(rng);
    matmul(wv[0], x.data(), 1, want.data(), ActMode::INT8, pool2);
    matmul_shared_input(many.data(), ys.data(), 20, x.data(), 1, ActMode::INT8, pool2);
    for (auto& o : outs) CHECK(std::memcmp(o.data(), want.data(), want.size() * sizeof(float)) == 0);
    std::vector<uint8_t> narrow = random_weight(TYPE_PTQ1_0, 4, 256, rng);
    const WeightView nv{TYPE_PTQ1_0, narrow.data(), 4, 256, type_row_bytes(TYPE_PTQ1_0, 256)};
    const WeightView* mixed[2] = {&wv[0], &nv};
    float* mixed_y[2] = {outs[0].data(), outs[1].data()};
    CHECK(throws([&] { matmul_shared_input(mixed, mixed_y, 2, x.data(), 1, ActMode::INT8, pool1); }));
}

static void test_errors_and_paths() {
    ThreadPool pool(1);
    std::vector<uint8_t> w(4 * 28);
    std::vector<float> x(128), y(4);
    CHECK(throws([&] { matmul(WeightView{TYPE_PTQ1_0, w.data(), 4, 128, 27}, x.data(), 1, y.data(), ActMode::INT8, pool); }));
    CHECK(throws([&] { matmul(WeightView{TYPE_PTQ1_0, w.data(), 1, 100, 28}, x.data(), 1, y.data(), ActMode::INT8, pool); }));
    CHECK(throws([&] { matmul(WeightView{static_cast<GgmlType>(12), w.data(), 1, 128, 28}, x.data(), 1, y.data(), ActMode::INT8, pool); }));
    CHECK(throws([&] { matmul(WeightView{TYPE_PTQ1_0, nullptr, 4, 128, 28}, x.data(), 1, y.data(), ActMode::INT8, pool); }));
    CHECK(!throws([&] { matmul(WeightView{TYPE_PTQ1_0, w.data(), 4, 128, 28}, x.data(), 1, y.data(), ActMode::INT8, pool); }));
    const int32_t bad_id = 4;
    CHECK(throws([&] { get_rows(WeightView{TYPE_PTQ1_0, w.data(), 4, 128, 28}, &bad_id, 1, x.data()); }));
    CHECK(throws([] { parse_cpu_path("neon"); }));
    const CpuPath before = active_cpu_path();
    for (CpuPath p : available_cpu_paths()) {
        set_cpu_path(p);
        CHECK(active_cpu_path() == p);
    }
    set_cpu_path(before);
}

// One token on a pool whose weights outlive it: the dispatch is a detached task in which the
// caller takes over the chunks of workers that do not commit in time. With workers delayed
// before every commit, takeovers happen, late workers' commits are dropped (they are still
// running when the next dispatch reuses the outputs) and every result is bit-identical to one
// thread's, for INT8 and FLOAT weights, several weights per dispatch and consecutive dispatches.
static void test_one_token_takeover() {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t cols = 2048, rows_a = 6000, rows_b = 333, rows_f = 1027;
    const std::vector<uint8_t> wa = random_weight(TYPE_PTQ1_0, rows_a, cols, rng);
    const std::vector<uint8_t> wb = random_weight(TYPE_Q8_0, rows_b, cols, rng);
    std::vector<uint16_t> wf(static_cast<size_t>(rows_f * cols));
    for (auto& h : wf) h = fp32_to_fp16(nd(rng));
    const WeightView va{TYPE_PTQ1_0, wa.data(), rows_a, cols, type_row_bytes(TYPE_PTQ1_0, cols)};
    const WeightView vb{TYPE_Q8_0, wb.data(), rows_b, cols, type_row_bytes(TYPE_Q8_0, cols)};
    const WeightView vf{TYPE_F16, wf.data(), rows_f, cols, type_row_bytes(TYPE_F16, cols)};
    ThreadPool pool1(1);
    for (int threads : {2, 3}) {
        for (int64_t delay : {int64_t{0}, int64_t{2000000}}) {
            ThreadPool pool(threads);
            pool.set_inputs_outlive_pool(true);
            cpu::set_one_token_worker_delay_for_tests(delay);
            const int64_t takeovers0 = cpu::one_token_takeovers_for_tests();
            // until a takeover has happened (a worker must have claimed a chunk first), 6 at least
            for (int rep = 0; rep < 6 || (delay > 0 && rep < 400 && cpu::one_token_takeovers_for_tests() == takeovers0);
                 ++rep) {
                std::vector<float> x(static_cast<size_t>(cols));
                for (auto& v : x) v = nd(rng);
                std::vector<float> ra(rows_a), rb(rows_b), rf(rows_f), ya(rows_a, -1.0f), yb(rows_b, -1.0f),
                    yf(rows_f, -1.0f);
                const WeightView* ws[2] = {&va, &vb};
                float* rs[2] = {ra.data(), rb.data()};
                float* ys[2] = {ya.data(), yb.data()};
                matmul_shared_input(ws, rs, 2, x.data(), 1, ActMode::INT8, pool1);
                matmul_shared_input(ws, ys, 2, x.data(), 1, ActMode::INT8, pool);
                CHECK(std::memcmp(ya.data(), ra.data(), ra.size() * sizeof(float)) == 0);
                CHECK(std::memcmp(yb.data(), rb.data(), rb.size() * sizeof(float)) == 0);
                matmul(vf, x.data(), 1, rf.data(), ActMode::FLOAT, pool1);
                matmul(vf, x.data(), 1, yf.data(), ActMode::FLOAT, pool);
                CHECK(std::memcmp(yf.data(), rf.data(), rf.size() * sizeof(float)) == 0);
            }
            if (delay > 0) CHECK(cpu::one_token_takeovers_for_tests() > takeovers0);
        }
    }
    cpu::set_one_token_worker_delay_for_tests(0);
}

// w as unpacking its rows repacked as `type` gives it back: PTQ1_0_R16 tiles re-code their qh trits
// and R16L tiles their qs bytes too (ptq1_0_r16.h), so those bytes come back in the quantizers' form
// (pack_trits4 / pack_trits5 of the byte's trits); other types are unchanged.
static std::vector<uint8_t> canonical_trits(GgmlType type, std::vector<uint8_t> w, int64_t rows, size_t rb) {
    if (!cpu::is_r16(type)) return w;
    const size_t nb = rb / sizeof(block_ptq1_0);
    for (int64_t r = 0; r < rows; ++r)
        for (size_t b = 0; b < nb; ++b) {
            uint8_t* blk = &w[r * rb + b * sizeof(block_ptq1_0)];
            for (size_t k = 0; k < sizeof(block_ptq1_0::qs) && type == TYPE_PTQ1_0_R16L; ++k) {
                int t[5];
                for (int n = 0; n < 5; ++n) t[n] = trit_of(blk[k], n);
                blk[k] = pack_trits5(t);
            }
            for (int h = 0; h < 2; ++h) {
                uint8_t& q = blk[offsetof(block_ptq1_0, qh) + h];
                int t[4];
                for (int n = 0; n < 4; ++n) t[n] = trit_of(q, n);
                q = pack_trits4(t);
            }
        }
    return w;
}

// The R16 code (ptq1_0_r16.h): every one of the 256 file bytes gets a code whose table lookups,
// made as the kernel makes them (low six bits; key ^ code >> 2), give the byte's five trits, and the
// code converts back to the canonical byte of those trits; the 243 trit tuples get 243 codes.
static void test_r16_code() {
    std::vector<bool> used(256, false);
    int distinct = 0;
    for (int b = 0; b < 256; ++b) {
        const uint8_t c = cpu::r16_qs_code(static_cast<uint8_t>(b));
        int t[5];
        for (int n = 0; n < 5; ++n) t[n] = trit_of(static_cast<uint8_t>(b), n);
        const int l = c & 63, idx = (cpu::kR16Qs.key[l] ^ (c >> 2)) & 63;
        CHECK(cpu::kR16Qs.t0[l] == t[0] && cpu::kR16Qs.t1[l] == t[1]);
        CHECK(cpu::kR16Qs.t2[idx] == t[2] && cpu::kR16Qs.t3[idx] == t[3] && cpu::kR16Qs.t4[idx] == t[4]);
        CHECK(cpu::r16_qs_byte(c) == pack_trits5(t));
        if (!used[c]) ++distinct;
        used[c] = true;
    }
    CHECK(distinct == 243);
}

// Repacked weights (repack.h: PTQ1_0_R16 and R16L, Q8_0_R4): the reordering is undone exactly (trit
// bytes canonical), for whole matrices and for row ranges; every path, mode, token count and thread
// count gives from the repacked rows exactly what it gives from the file's (INT8: the scalar
// reference; R16L with VBMI on natively, switched off converted back), for rows of
// whole units and of units and one block or more, row counts that are and are not multiples of 4
// and 16 (R16 tiles of 16 rows, and a last tile of fewer); get_rows agrees (test_no_read_past_end
// covers them too).
static void test_repacked() {
    CHECK(cpu::repacked_type(TYPE_PTQ1_0, 128) == (cpu::avx512_vbmi_enabled() ? TYPE_PTQ1_0_R16L : TYPE_PTQ1_0_R16));
    CHECK(cpu::repacked_type(TYPE_Q8_0, 32) == TYPE_Q8_0);
    CHECK(cpu::tile_rows(TYPE_PTQ1_0_R16) == 16 && cpu::tile_rows(TYPE_PTQ1_0_R16L) == 16 && cpu::tile_rows(TYPE_PTQ1_0) == 4);
    CHECK(cpu::repacked_type(TYPE_TQ2_0, 4096) == TYPE_TQ2_0 && !cpu::is_repacked(TYPE_Q8_0));
    std::mt19937 rng(8);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    ThreadPool pool1(1), pool2(2);
    const Case cases[] = {{TYPE_PTQ1_0, 128},  {TYPE_PTQ1_0, 896},  {TYPE_PTQ1_0, 1024}, {TYPE_PTQ1_0, 1152}, {TYPE_PTQ1_0, 2048}, {TYPE_PTQ1_0, 2432},
                          {TYPE_PTQ1_0, 2944}, {TYPE_Q8_0, 64},     {TYPE_Q8_0, 96},     {TYPE_Q8_0, 128},
                          {TYPE_Q8_0, 224},    {TYPE_Q8_0, 2048},   {TYPE_Q8_0, 2080}};
    for (const Case& c : cases) {
        for (GgmlType rt : {TYPE_PTQ1_0_R16, TYPE_PTQ1_0_R16L, TYPE_Q8_0_R4}) {
            if (cpu::file_type(rt) != c.type) continue;
            for (int64_t rows : {1, 3, 4, 16, 29}) {
                std::vector<uint8_t> w = random_weight(c.type, rows, c.cols, rng), wx(w.size()), back(w.size());
                const size_t rb = type_row_bytes(c.type, c.cols);
                cpu::repack_rows(rt, w.data(), wx.data(), rows, static_cast<int64_t>(rb), 0, rows);
                const WeightView wv{c.type, w.data(), rows, c.cols, rb}, xv{rt, wx.data(), rows, c.cols, rb};
                const std::vector<uint8_t> wc = canonical_trits(rt, w, rows, rb);
                CHECK(c.type != TYPE_PTQ1_0 || wc != w);  // (random trit bytes: many not in the quantizers' form)
                cpu::unpack_rows(xv, 0, rows, back.data());
                CHECK(back == wc);
                cpu::unpack_rows(xv, 1, rows, back.data());
                CHECK(std::equal(wc.begin() + static_cast<int64_t>(rb), wc.end(), back.begin()));
                // (Q8_0 rows of fewer than 4 blocks: the same order)
                if (c.type == TYPE_PTQ1_0 || (rows >= 4 && c.cols >= 128)) CHECK(wx != w);
                for (int64_t nt : {1, 2, 7, 9}) {
                    std::vector<float> x(static_cast<size_t>(nt * c.cols));
                    for (auto& v : x) v = nd(rng);
                    std::vector<float> ref(static_cast<size_t>(nt * rows)), y(ref.size());
                    matmul_on_path(wv, x.data(), nt, ref.data(), ActMode::INT8, pool1, CpuPath::SCALAR);
                    check_int8_paths(xv, x, nt, ref, pool1, pool2);
                    for (CpuPath p : available_cpu_paths()) {
                        matmul_on_path(wv, x.data(), nt, ref.data(), ActMode::FLOAT, pool2, p);
                        matmul_on_path(xv, x.data(), nt, y.data(), ActMode::FLOAT, pool2, p);
                        CHECK(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)) == 0);
                    }
                }
                const int32_t ids[3] = {0, static_cast<int32_t>(rows - 1), static_cast<int32_t>(rows / 2)};
                std::vector<float> gr(static_cast<size_t>(3 * c.cols)), gx(gr.size());
                get_rows(wv, ids, 3, gr.data());
                get_rows(xv, ids, 3, gx.data());
                CHECK(gr == gx);
            }
        }
    }
}

int main() {
    test_thread_pool();
    test_one_token_takeover();
    test_int8_paths();
    test_no_read_past_end();
    test_shared_input();
    test_r16_code();
    test_repacked();
    test_errors_and_paths();
    if (g_failures) {
        std::fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    std::puts("test_matmul: ok");
    return 0;
}
