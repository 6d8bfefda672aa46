// Host run of the __host__ __device__ element access of bonsai/block_decode.h (what the CUDA
// kernels use to read packed weights) against the CPU reference dequantize_row, for every type:
// random bytes (every trit byte value 0..255, every 2-bit code), random scales, rows placed at odd
// byte offsets so nothing may rely on alignment. Values must be bit-identical; block_value * scale
// must also reproduce the element.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "bonsai/block_decode.h"
#include "bonsai/quants.h"
#include "bonsai/types.h"
#include "check.h"

using namespace bonsai;

namespace {

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

void check_type(GgmlType t, std::mt19937& rng) {
    const TypeTraits* tr = type_traits(t);
    const BlockGeom g = block_geom(t);
    CHECK(g.elems == tr->block_size && g.bytes == tr->type_size);
    const int64_t n = 4 * static_cast<int64_t>(tr->block_size);
    const size_t nbytes = type_row_bytes(t, n);
    std::vector<uint8_t> storage(nbytes + 3);
    uint8_t* row = storage.data() + 3;  // deliberately misaligned
    std::uniform_int_distribution<int> byte(0, 255);
    std::normal_distribution<float> val(0.0f, 2.0f);
    for (size_t i = 0; i < nbytes; ++i) row[i] = static_cast<uint8_t>(byte(rng));
    if (g.d_offset >= 0) {
        for (int64_t b = 0; b < n / g.elems; ++b) {
            const uint16_t h = fp32_to_fp16(val(rng));
            row[b * g.bytes + g.d_offset] = static_cast<uint8_t>(h & 0xff);
            row[b * g.bytes + g.d_offset + 1] = static_cast<uint8_t>(h >> 8);
        }
    } else {
        for (int64_t k = 0; k < n; ++k) {
            const float v = val(rng);
            if (t == TYPE_F32) std::memcpy(row + 4 * k, &v, 4);
            const uint16_t h = t == TYPE_F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
            if (t != TYPE_F32) std::memcpy(row + 2 * k, &h, 2);
        }
    }
    std::vector<float> ref(n);
    std::vector<uint8_t> aligned(row, row + nbytes);
    dequantize_row(t, aligned.data(), ref.data(), n);
    int bad = 0;
    for (int64_t k = 0; k < n; ++k) {
        const float got = row_element(t, row, k);
        if (bits(got) != bits(ref[k]) && !(got != got && ref[k] != ref[k])) ++bad;
        if (g.d_offset >= 0) {
            const uint8_t* blk = row + (k / g.elems) * g.bytes;
            const int v = block_value(t, blk, static_cast<int>(k % g.elems));
            CHECK(v >= -128 && v <= 127);
            const float again = block_scale(t, blk) * static_cast<float>(v);
            if (bits(again) != bits(ref[k]) && !(again != again)) ++bad;
        }
    }
    if (bad) std::fprintf(stderr, "%s: %d elements differ from dequantize_row\n", tr->name, bad);
    CHECK(bad == 0);
}

}  // namespace

int main() {
    std::mt19937 rng(7);
    for (GgmlType t : {TYPE_F32, TYPE_F16, TYPE_BF16, TYPE_Q8_0, TYPE_Q4_0, TYPE_TQ1_0, TYPE_TQ2_0,
                       TYPE_Q2_0, TYPE_Q2_0_G128, TYPE_PQ2_0, TYPE_PTQ1_0}) {
        for (int rep = 0; rep < 20; ++rep) check_type(t, rng);
    }
    CHECK(block_geom(static_cast<GgmlType>(99)).elems == 0);
    if (g_failures) std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return g_failures ? 1 : 0;
}
