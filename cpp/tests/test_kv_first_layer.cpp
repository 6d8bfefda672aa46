// KvCache with first_layer > 0 (the host cache of a partially offloaded model: layers before
// first_layer keep their K/V on the GPU): sizes, row addressing by global layer index, stores that
// do not overlap, and the shape checks. Runs on every build, since CPU-only builds never offload.
#include <cstdint>
#include <vector>

#include "bonsai/kv_cache.h"
#include "bonsai/quants.h"
#include "check.h"

using namespace bonsai;

int main() {
    KvCacheParams p;
    p.n_cells = 8;
    p.n_layer = 5;
    p.n_embd_kv = 64;
    p.head_dim = 32;
    p.type_k = TYPE_F16;
    p.type_v = TYPE_Q8_0;
    const uint64_t row = type_row_bytes(TYPE_F16, 64) + type_row_bytes(TYPE_Q8_0, 64);
    CHECK(KvCache::bytes_needed(p) == 5 * 8 * row);
    p.first_layer = 3;
    CHECK(KvCache::bytes_needed(p) == 2 * 8 * row);
    KvCache kv(p);
    CHECK(kv.bytes() == 2 * 8 * row);
    std::vector<float> k(64), v(64);
    for (int il = 3; il < 5; ++il) {
        for (int c = 0; c < 8; ++c) {
            for (int i = 0; i < 64; ++i) {
                k[i] = static_cast<float>(il * 100 + c + i * 0.25);
                v[i] = -k[i];
            }
            kv.store(il, c, k.data(), v.data());
        }
    }
    std::vector<float> got(64);
    std::vector<uint8_t> vrow(kv.v_row_bytes());
    for (int il = 3; il < 5; ++il) {
        for (int c = 0; c < 8; ++c) {
            kv.k_head_floats(il, c, 0, got.data());
            CHECK(got[0] == static_cast<float>(il * 100 + c));
            kv.get_v_row(il, c, vrow.data());
            dequantize_row(TYPE_Q8_0, vrow.data(), got.data(), 64);
            CHECK(got[0] < 0.0f);
        }
    }
    CHECK(kv.k_panel(3, 0) == kv.k_panel(4, 0) - 8 * type_row_bytes(TYPE_F16, 64));
    p.first_layer = 5;  // every layer offloaded: metadata only, no rows
    CHECK(KvCache::bytes_needed(p) == 0);
    KvCache empty(p);
    CHECK(empty.bytes() == 0 && empty.n_cells() == 8);
    p.first_layer = 6;
    CHECK_THROWS(KvCache(p), "invalid KV cache shape");
    p.first_layer = -1;
    CHECK_THROWS(KvCache(p), "invalid KV cache shape");
    if (g_failures) std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return g_failures ? 1 : 0;
}
