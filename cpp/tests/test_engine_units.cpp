// Unit tests of the engine pieces that need no model file: the sampler (greedy, filters,
// determinism under a seed, validation), the KV cache cells (claim, seq_rm / seq_cp / seq_keep,
// f16 and q8_0 round trips, type checks) and the building blocks (RMSNorm, both rope layouts,
// softmax, attention's two variants against each other and against a direct computation, and
// every CPU path's attention against the scalar one on longer caches shared by two sequences).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../backends/cpu/layers_cpu.h"
#include "bonsai/error.h"
#include "bonsai/kv_cache.h"
#include "bonsai/ops.h"
#include "bonsai/quants.h"
#include "bonsai/sampling.h"
#include "bonsai/thread_pool.h"
#include "layers.h"
#include "check.h"

using namespace bonsai;

static void test_sampler() {
    std::vector<float> logits(500);
    std::mt19937 g(1);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (float& x : logits) x = nd(g);
    const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());

    SamplingParams greedy;
    greedy.temp = 0.0f;
    CHECK(Sampler(greedy).sample(logits.data(), 500) == best);

    SamplingParams p;
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 99;
    Sampler a(p), b(p);
    std::vector<int32_t> da, db;
    for (int i = 0; i < 100; ++i) {
        da.push_back(a.sample(logits.data(), 500));
        db.push_back(b.sample(logits.data(), 500));
    }
    CHECK(da == db);
    a.reset();
    for (int i = 0; i < 100; ++i) CHECK(a.sample(logits.data(), 500) == da[i]);

    // top-p 1e-6 keeps only the best token
    p.top_p = 1e-6f;
    Sampler c(p);
    for (int i = 0; i < 50; ++i) CHECK(c.sample(logits.data(), 500) == best);

    // repeat penalty over the last 2 accepted tokens only
    SamplingParams r;
    r.temp = 0.0f;
    r.repeat_penalty = 10.0f;
    r.repeat_last_n = 2;
    Sampler s(r);
    const float three[3] = {2.0f, 1.9f, 1.8f};
    s.accept(0);
    CHECK(s.sample(three, 3) == 1);
    s.accept(1);
    CHECK(s.sample(three, 3) == 2);
    s.accept(2);  // history is now {1, 2}: token 0 is free again
    CHECK(s.sample(three, 3) == 0);

    SamplingParams bad;
    bad.temp = -0.5f;
    CHECK_THROWS(Sampler{bad}, "temperature");
    bad = SamplingParams{};
    bad.top_p = 0.0f;
    CHECK_THROWS(Sampler{bad}, "top_p");
    bad = SamplingParams{};
    bad.min_p = 2.0f;
    CHECK_THROWS(Sampler{bad}, "min_p");
    bad = SamplingParams{};
    bad.repeat_penalty = -1.0f;
    CHECK_THROWS(Sampler{bad}, "repeat_penalty");
    std::vector<float> nan_logits = {0.0f, NAN};
    CHECK_THROWS(Sampler(greedy).sample(nan_logits.data(), 2), "NaN");
}

static void test_kv_cache() {
    KvCacheParams p;
    p.n_cells = 8;
    p.n_layer = 2;
    p.n_embd_kv = 64;
    p.head_dim = 32;
    p.type_k = TYPE_Q8_0;
    p.type_v = TYPE_F16;
    KvCache kv(p);
    CHECK(kv.bytes() == 8u * 2 * (2 * 34 + 64 * 2));
    std::vector<int32_t> cells;
    CHECK(kv.find_free(8, cells) && !kv.find_free(9, cells));
    for (int c = 0; c < 4; ++c) kv.claim(c, c, 1);  // seq 0, positions 0..3
    CHECK(kv.n_free() == 4 && kv.used_end() == 4);
    kv.seq_cp(0, 1, 0, 2);  // positions 0, 1 shared with seq 1
    CHECK(kv.seq_pos_max(1) == 1 && kv.cell_seq(0) == 3);
    kv.seq_rm(0, 2, -1);
    CHECK(kv.seq_pos_max(0) == 1 && kv.n_free() == 6 && kv.used_end() == 2);
    kv.seq_keep(1);
    CHECK(kv.seq_pos_max(0) == -1 && kv.seq_pos_max(1) == 1 && kv.n_free() == 6);
    kv.seq_rm(-1, -1, -1);
    CHECK(kv.n_free() == 8 && kv.used_end() == 0);

    std::vector<float> k(64), v(64), back(64);
    for (int i = 0; i < 64; ++i) {
        k[i] = std::sin(0.3f * i) * 3.0f;
        v[i] = std::cos(0.2f * i);
    }
    kv.store(1, 5, k.data(), v.data());
    std::vector<uint8_t> row(kv.k_row_bytes() + kv.v_row_bytes());
    kv.get_k_row(1, 5, row.data());
    dequantize_row(TYPE_Q8_0, row.data(), back.data(), 64);
    for (int i = 0; i < 64; ++i) CHECK(std::fabs(back[i] - k[i]) <= 3.0f / 127.0f);
    kv.get_v_row(1, 5, row.data());
    dequantize_row(TYPE_F16, row.data(), back.data(), 64);
    for (int i = 0; i < 64; ++i) CHECK(std::fabs(back[i] - v[i]) <= 1e-3f);
    // head-major panels: head 1's V of cell 5 at cell 5 of its panel
    CHECK(std::memcmp(kv.v_panel(1, 1) + 5 * kv.v_head_bytes(), row.data() + 64, 64) == 0);

    // An F16 K panel is tiled (16 cells a tile, a last partial tile of n_cells % 16): every cell and
    // dimension comes back where it was stored, through the row copies and the head reader.
    KvCacheParams pt = p;
    pt.n_cells = 21;
    pt.type_k = TYPE_F16;
    KvCache kt(pt);
    CHECK(kt.k_tiled());
    std::vector<float> kk(64), got(32);
    for (int c = 0; c < 21; ++c) {
        for (int i = 0; i < 64; ++i) kk[i] = static_cast<float>(c * 64 + i);
        kt.store(0, c, kk.data(), v.data());
    }
    const uint16_t* tiles = reinterpret_cast<const uint16_t*>(kt.k_panel(0, 1));
    CHECK(fp16_to_fp32(tiles[3 * 16 + 2]) == 2 * 64 + 32 + 3);        // cell 2, head 1, dim 3
    CHECK(fp16_to_fp32(tiles[16 * 32 + 3 * 5 + 4]) == 20 * 64 + 32 + 3);  // cell 20: tile 1, width 5
    std::vector<uint8_t> krow(kt.k_row_bytes());
    for (int c = 0; c < 21; ++c) {
        kt.k_head_floats(0, c, 1, got.data());
        for (int i = 0; i < 32; ++i) CHECK(got[i] == static_cast<float>(c * 64 + 32 + i));
        kt.get_k_row(0, c, krow.data());
        kt.set_k_row(1, 20 - c, krow.data());
    }
    for (int c = 0; c < 21; ++c) {
        kt.k_head_floats(1, 20 - c, 0, got.data());
        for (int i = 0; i < 32; ++i) CHECK(got[i] == static_cast<float>(c * 64 + i));
    }

    p.head_dim = 16;
    p.n_embd_kv = 64;
    CHECK_THROWS(KvCache{p}, "multiple of 32");
    p.type_k = TYPE_Q4_0;
    CHECK_THROWS(KvCache{p}, "f16 or q8_0");
}

static void test_blocks() {
    // RMSNorm
    const float x[4] = {1.0f, -2.0f, 3.0f, -4.0f}, w[4] = {1.0f, 1.0f, 2.0f, 0.5f};
    float y[4];
    rms_norm(x, w, 1, 4, 0.0f, y);
    const float r = std::sqrt((1.0f + 4.0f + 9.0f + 16.0f) / 4.0f);
    CHECK(std::fabs(y[2] - 3.0f / r * 2.0f) < 1e-6f && std::fabs(y[3] + 4.0f / r * 0.5f) < 1e-6f);

    // rope: NORMAL rotates (x0, x1), NEOX rotates (x0, x2) for n_rot 4 at position 1
    RopeParams rp;
    rp.n_rot = 4;
    rp.theta_base = 100.0f;
    const int32_t pos = 1;
    float cs[4];
    rope_table(&pos, 1, rp, cs);
    CHECK(std::fabs(cs[0] - std::cos(1.0f)) < 1e-6f && std::fabs(cs[3] - std::sin(0.1f)) < 1e-6f);
    float a[4] = {1.0f, 0.0f, 0.0f, 0.0f};
    rope_apply(a, 1, 1, 4, rp, cs);
    CHECK(std::fabs(a[0] - std::cos(1.0f)) < 1e-6f && std::fabs(a[1] - std::sin(1.0f)) < 1e-6f);
    rp.type = RopeType::NEOX;
    float b[4] = {1.0f, 0.0f, 0.0f, 0.0f};
    rope_apply(b, 1, 1, 4, rp, cs);
    CHECK(std::fabs(b[0] - std::cos(1.0f)) < 1e-6f && std::fabs(b[2] - std::sin(1.0f)) < 1e-6f && b[1] == 0.0f);

    float sm[3] = {0.0f, std::log(2.0f), -INFINITY};
    cpu::softmax(sm, 3);
    CHECK(std::fabs(sm[0] - 1.0f / 3) < 1e-6f && std::fabs(sm[1] - 2.0f / 3) < 1e-6f && sm[2] == 0.0f);

    // attention: 3 cached tokens of one sequence, 4 query heads over 2 kv heads, both variants
    KvCacheParams p;
    p.n_cells = 6;
    p.n_layer = 1;
    p.n_embd_kv = 2 * 8;
    p.head_dim = 8;
    KvCache kv(p);
    std::mt19937 g(3);
    std::normal_distribution<float> nd;
    std::vector<float> ks(3 * 16), vs(3 * 16), q(3 * 32);
    for (float& t : ks) t = nd(g);
    for (float& t : vs) t = nd(g);
    for (float& t : q) t = nd(g);
    for (int t = 0; t < 3; ++t) {
        kv.claim(t, t, 1);
        kv.store(0, t, ks.data() + t * 16, vs.data() + t * 16);
    }
    kv.claim(3, 0, 2);  // another sequence's cell: must be invisible
    const int32_t qpos[3] = {0, 1, 2};
    const uint64_t qseq[3] = {1, 1, 1};
    ThreadPool pool(2);
    std::vector<float> out1(3 * 32), out2(3 * 32);
    AttentionArgs args;
    args.q = q.data();
    args.n_tokens = 3;
    args.pos = qpos;
    args.seq_mask = qseq;
    args.kv = &kv;
    args.n_head = 4;
    args.n_head_kv = 2;
    args.head_dim = 8;
    args.scale = 1.0f / std::sqrt(8.0f);
    const size_t per = attention_scratch_floats(6, 4, 2, 8);
    std::vector<float> scratch(per * 2);
    args.out = out1.data();
    attention(args, scratch.data(), per, pool);
    args.flash = true;
    args.out = out2.data();
    attention(args, scratch.data(), per, pool);
    for (int t = 0; t < 3; ++t) {
        for (int h = 0; h < 4; ++h) {
            const int hk = h / 2;
            std::vector<double> s(t + 1);
            double m = -1e30, sum = 0;
            for (int u = 0; u <= t; ++u) {
                double d = 0;
                for (int i = 0; i < 8; ++i) {
                    d += q[t * 32 + h * 8 + i] * fp16_to_fp32(fp32_to_fp16(ks[u * 16 + hk * 8 + i]));
                }
                s[u] = d / std::sqrt(8.0);
                m = std::max(m, s[u]);
            }
            for (double& e : s) sum += (e = std::exp(e - m));
            for (int i = 0; i < 8; ++i) {
                double o = 0;
                for (int u = 0; u <= t; ++u) o += s[u] / sum * fp16_to_fp32(fp32_to_fp16(vs[u * 16 + hk * 8 + i]));
                CHECK(std::fabs(out1[t * 32 + h * 8 + i] - o) < 1e-5);
                CHECK(std::fabs(out2[t * 32 + h * 8 + i] - o) < 1e-5);
            }
        }
    }
}

// Every CPU path against the scalar attention: two interleaved sequences over a few hundred cells
// (more than one flash block), f16 / q8_0 K and V, head sizes with and without a partial 16-lane
// chunk (or one not a multiple of 4) or over 128 dimensions, n_rep 1 to 12 (groups of four heads
// full and partial), one and several query tokens, both variants.
static void test_attention_paths() {
    struct Shape {
        int64_t head_dim, n_head, n_head_kv;
        GgmlType tk, tv;
    };
    const Shape shapes[] = {{64, 8, 2, TYPE_F16, TYPE_F16},   {40, 4, 4, TYPE_F16, TYPE_F16},
                            {64, 8, 2, TYPE_Q8_0, TYPE_Q8_0}, {32, 12, 1, TYPE_F16, TYPE_Q8_0},
                            {96, 4, 2, TYPE_Q8_0, TYPE_F16},  {160, 6, 2, TYPE_F16, TYPE_Q8_0},
                            {42, 10, 2, TYPE_F16, TYPE_F16}};
    std::mt19937 g(11);
    std::normal_distribution<float> nd;
    ThreadPool pool(2);
    const CpuPath saved = active_cpu_path();
    for (const Shape& sh : shapes) {
        KvCacheParams p;
        p.n_cells = 300;
        p.n_layer = 2;
        p.head_dim = sh.head_dim;
        p.n_embd_kv = sh.n_head_kv * sh.head_dim;
        p.type_k = sh.tk;
        p.type_v = sh.tv;
        KvCache kv(p);
        std::vector<float> k(p.n_embd_kv), v(p.n_embd_kv);
        int32_t next_pos[2] = {0, 0};
        for (int32_t c = 0; c < 290; ++c) {  // sequence 0 gets about two thirds of the cells
            const int seq = (c % 3 == 2) ? 1 : 0;
            kv.claim(c, next_pos[seq]++, uint64_t{1} << seq);
            for (int64_t l = 0; l < 2; ++l) {
                for (float& x : k) x = nd(g) * 2.0f;
                for (float& x : v) x = nd(g);
                kv.store(l, c, k.data(), v.data());
            }
        }
        const int64_t n_q = sh.n_head * sh.head_dim;
        // The last query token sees every cell (both sequences): the all-visible fast path.
        const int32_t qpos[4] = {next_pos[0] - 1, next_pos[1] - 1, 50, 1000};
        const uint64_t qseq[4] = {1, 2, 1, 3};
        std::vector<float> q(4 * n_q);
        for (float& x : q) x = nd(g);
        const size_t per = attention_scratch_floats(p.n_cells, sh.n_head, sh.n_head_kv, sh.head_dim);
        std::vector<float> scratch(per * 2);
        for (bool flash : {false, true}) {
            AttentionArgs a;
            a.q = q.data();
            a.n_tokens = 4;
            a.pos = qpos;
            a.seq_mask = qseq;
            a.kv = &kv;
            a.layer = 1;
            a.n_head = sh.n_head;
            a.n_head_kv = sh.n_head_kv;
            a.head_dim = sh.head_dim;
            a.scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
            a.flash = flash;
            std::vector<float> ref(4 * n_q), out(4 * n_q);
            set_cpu_path(CpuPath::SCALAR);
            a.out = ref.data();
            attention(a, scratch.data(), per, pool);
            for (CpuPath path : available_cpu_paths()) {
                set_cpu_path(path);
                std::fill(out.begin(), out.end(), NAN);
                a.out = out.data();
                attention(a, scratch.data(), per, pool);
                for (size_t i = 0; i < out.size(); ++i) CHECK(std::fabs(out[i] - ref[i]) < 2e-5f);
            }
        }
    }
    set_cpu_path(saved);
}

int main() {
    test_sampler();
    test_kv_cache();
    test_blocks();
    test_attention_paths();
    if (g_failures) {
        std::fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    std::puts("test_engine_units: all checks passed");
    return 0;
}
