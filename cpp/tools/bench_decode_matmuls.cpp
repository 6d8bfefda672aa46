// bench_decode_matmuls: the matrix products of one decode step of a model, in decode order, through
// the same one-token path as a Context (a pool whose inputs outlive it: the detached task with
// guided chunks and takeovers), without attention, norms or sampling. Prints per op kind the time
// per call and the weight bytes read per second, so a kernel or scheduling change can be judged on
// the model's own weights as decode streams them (a cold single matmul repeated in a loop can rank
// variants differently). Built with the C++ tests (-DBONSAI_BUILD_TESTS=ON, scripts/dev_build.sh).
//
//   build/dev/bench_decode_matmuls MODEL.gguf [--tokens N] [--threads T] [--no-huge-pages] [--no-repack]
//                                  [--kv-read] [--cached]
//
// --kv-read reads 600 KiB of other memory between the q/k/v and the output projection of every
// layer, as attention reads the KV cache there. --cached runs layer 0's products only, every step,
// and no head: weights of a few MiB stay in the last-level cache, so the figures are the kernels'
// rates when memory keeps up with them. Dense architectures (llama, qwen2, qwen3) only.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/model.h"
#include "bonsai/ops.h"
#include "bonsai/thread_pool.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double bytes_of(const bonsai::WeightView& w) { return static_cast<double>(w.rows) * static_cast<double>(w.row_bytes); }

int usage(const char* why) {
    std::fprintf(stderr,
                 "bench_decode_matmuls: %s\nusage: bench_decode_matmuls MODEL.gguf [--tokens N (default 100)] "
                 "[--threads T (default 2)] [--no-huge-pages] [--no-repack] [--kv-read] [--cached]\n",
                 why);
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    std::string path;
    int tokens = 100, threads = 2;
    bool huge_pages = true, repack = true, kv_read = false, cached = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "--tokens" || a == "--threads") && i + 1 < argc) {
            const int v = std::atoi(argv[++i]);
            if (v < 1 || v > 100000) return usage((a + " needs an integer from 1 to 100000").c_str());
            (a == "--tokens" ? tokens : threads) = v;
        } else if (a == "--no-huge-pages") {
            huge_pages = false;
        } else if (a == "--no-repack") {
            repack = false;
        } else if (a == "--cached") {
            cached = true;
        } else if (a == "--kv-read") {
            kv_read = true;
        } else if (a == "-h" || a == "--help") {
            usage("the matrix products of decode, in decode order, per op kind");
            return 0;
        } else if (!a.empty() && a[0] != '-' && path.empty()) {
            path = a;
        } else {
            return usage(("unknown argument '" + a + "'").c_str());
        }
    }
    if (path.empty()) return usage("give the path of a model file");
    try {
        bonsai::ModelParams mp;
        mp.huge_pages = huge_pages;
        mp.repack = repack;
        const auto m = bonsai::Model::load(path, mp);
        const bonsai::Hparams& hp = m->hparams();
        if (!hp.recurrent.empty()) return usage("hybrid (qwen35) models are not covered; use a dense model");
        bonsai::ThreadPool pool(threads);
        pool.set_inputs_outlive_pool(true);
        std::mt19937 rng(1);
        std::normal_distribution<float> nd;
        std::vector<float> x(hp.n_embd), ff(hp.n_ff), q(hp.n_head * hp.head_dim), k(hp.n_head_kv * hp.head_dim),
            v(hp.n_head_kv * hp.head_dim), o(hp.n_embd), g(hp.n_ff), u(hp.n_ff), logits(hp.n_vocab);
        for (float& e : x) e = nd(rng);
        for (float& e : ff) e = nd(rng);
        std::vector<uint8_t> other(kv_read ? size_t{64} << 20 : 0, 1);
        volatile uint64_t sink = 0;
        const char* names[5] = {"qkv", "attn_out", "gate+up", "down", "head"};
        double t[5] = {}, b[5] = {};
        for (int tok = 0; tok <= tokens; ++tok) {  // token 0 warms up
            const bool count = tok > 0;
            const int64_t n_layer = cached ? 1 : hp.n_layer;
            for (int64_t l = 0; l < n_layer; ++l) {
                const bonsai::LayerWeights& w = m->layers()[static_cast<size_t>(l)];
                const double t0 = now();
                {
                    const bonsai::WeightView* ws[3] = {&w.wq, &w.wk, &w.wv};
                    float* ys[3] = {q.data(), k.data(), v.data()};
                    bonsai::matmul_shared_input(ws, ys, 3, x.data(), 1, bonsai::ActMode::INT8, pool);
                }
                const double t1 = now();
                if (kv_read) {
                    uint64_t s = 0;
                    const uint8_t* p = other.data() + static_cast<size_t>((tok * hp.n_layer + l) % 100) * (600 << 10);
                    for (size_t i = 0; i < (size_t{600} << 10); i += 64) s += p[i];
                    sink = s;
                }
                const double t2 = now();
                bonsai::matmul(w.wo, q.data(), 1, o.data(), bonsai::ActMode::INT8, pool);
                const double t3 = now();
                {
                    const bonsai::WeightView* ws[2] = {&w.w_gate, &w.w_up};
                    float* ys[2] = {g.data(), u.data()};
                    bonsai::matmul_shared_input(ws, ys, 2, x.data(), 1, bonsai::ActMode::INT8, pool);
                }
                const double t4 = now();
                bonsai::matmul(w.w_down, ff.data(), 1, o.data(), bonsai::ActMode::INT8, pool);
                const double t5 = now();
                if (count) {
                    t[0] += t1 - t0, t[1] += t3 - t2, t[2] += t4 - t3, t[3] += t5 - t4;
                    b[0] += bytes_of(w.wq) + bytes_of(w.wk) + bytes_of(w.wv), b[1] += bytes_of(w.wo);
                    b[2] += bytes_of(w.w_gate) + bytes_of(w.w_up), b[3] += bytes_of(w.w_down);
                }
            }
            if (cached) continue;
            const double t6 = now();
            bonsai::matmul(m->output(), x.data(), 1, logits.data(), bonsai::ActMode::INT8, pool);
            if (count) t[4] += now() - t6, b[4] += bytes_of(m->output());
        }
        (void)sink;
        const bonsai::ModelMemory mem = m->memory_report();
        std::printf("%s: %d tokens, %d threads, weights %s%s%s\n", path.c_str(), tokens, threads,
                    mem.huge_page_bytes > 0 ? "in huge pages" : "in the file mapping",
                    mem.repacked_bytes > 0 ? " (PTQ1_0 regrouped)" : "", cached ? ", layer 0 only (cached)" : "");
        double total = 0.0;
        for (int i = 0; i < (cached ? 4 : 5); ++i) {
            const double calls = static_cast<double>(tokens) * (i == 4 || cached ? 1 : static_cast<double>(hp.n_layer));
            std::printf("  %-9s %9.1f us/call %6.1f GB/s\n", names[i], t[i] / calls * 1e6, b[i] / t[i] / 1e9);
            total += t[i];
        }
        std::printf("  matmuls per %s: %.3f ms\n", cached ? "step" : "token", total / tokens * 1e3);
    } catch (const bonsai::Error& e) {
        std::fprintf(stderr, "bench_decode_matmuls: %s\n", e.what());
        return 1;
    }
    return 0;
}
