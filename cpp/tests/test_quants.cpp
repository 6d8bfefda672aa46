// Unit tests of the reference quantizers (cpp/src/quants.cpp): fp16 / bf16 conversion edge cases,
// known bytes pinning the element order of the trit and 2-bit layouts (worked out by hand from the
// layout rules in quant_blocks.h), lossless round trips of exactly representable data, rounding
// at the half-way points, tiny scales, and the errors for bad input.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/quants.h"
#include "bonsai/types.h"
#include "check.h"

using namespace bonsai;

namespace {

const std::vector<GgmlType> kAllTypes = {TYPE_F32,   TYPE_F16,   TYPE_BF16,  TYPE_Q8_0,
                                         TYPE_Q4_0,  TYPE_TQ1_0, TYPE_TQ2_0, TYPE_Q2_0,
                                         TYPE_Q2_0_G128, TYPE_PQ2_0, TYPE_PTQ1_0};
const std::vector<GgmlType> kTernaryTypes = {TYPE_TQ1_0, TYPE_TQ2_0, TYPE_Q2_0,
                                             TYPE_Q2_0_G128, TYPE_PQ2_0, TYPE_PTQ1_0};

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

std::vector<uint8_t> quantize(GgmlType t, const std::vector<float>& x) {
    std::vector<uint8_t> q(type_row_bytes(t, static_cast<int64_t>(x.size())));
    quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
    return q;
}

std::vector<float> dequantize(GgmlType t, const std::vector<uint8_t>& q, size_t n) {
    std::vector<float> y(n);
    dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(n));
    return y;
}

// Runs f, which must throw bonsai::Error whose message contains every one of `parts`.
template <typename F>
void check_error(F f, std::initializer_list<const char*> parts) {
    try {
        f();
        std::fprintf(stderr, "expected bonsai::Error containing \"%s\", nothing thrown\n",
                     *parts.begin());
        ++g_failures;
    } catch (const Error& e) {
        for (const char* p : parts) {
            if (std::string(e.what()).find(p) == std::string::npos) {
                std::fprintf(stderr, "error \"%s\" lacks \"%s\"\n", e.what(), p);
                ++g_failures;
            }
        }
    }
}

void test_fp16() {
    CHECK(fp32_to_fp16(0.0f) == 0x0000);
    CHECK(fp32_to_fp16(-0.0f) == 0x8000);
    CHECK(fp32_to_fp16(1.0f) == 0x3c00);
    CHECK(fp32_to_fp16(-2.0f) == 0xc000);
    CHECK(fp32_to_fp16(65504.0f) == 0x7bff);
    CHECK(fp32_to_fp16(65519.996f) == 0x7bff);  // just under the tie with 65536
    CHECK(fp32_to_fp16(65520.0f) == 0x7c00);    // tie rounds to even: infinity
    CHECK(fp32_to_fp16(1e10f) == 0x7c00);
    CHECK(fp32_to_fp16(-std::numeric_limits<float>::infinity()) == 0xfc00);
    CHECK(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()) == 0x7e00);
    CHECK(fp32_to_fp16(from_bits(0xffc00001u)) == 0xfe00);  // negative NaN keeps its sign
    CHECK(fp32_to_fp16(1.0f + 0x1p-11f) == 0x3c00);         // tie, even below
    CHECK(fp32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02);     // tie, even above
    CHECK(fp32_to_fp16(0x1p-14f) == 0x0400);                // smallest normal
    CHECK(fp32_to_fp16(0x1p-24f) == 0x0001);                // smallest subnormal
    CHECK(fp32_to_fp16(0x1p-25f) == 0x0000);                // tie with zero: even
    CHECK(fp32_to_fp16(0x1.000002p-25f) == 0x0001);
    CHECK(fp32_to_fp16(3 * 0x1p-25f) == 0x0002);            // 1.5 units: tie, even above
    CHECK(fp32_to_fp16(1023.5f * 0x1p-24f) == 0x0400);      // largest subnormal + half: normal
    CHECK(fp32_to_fp16(-1e-30f) == 0x8000);
    CHECK(fp16_to_fp32(0x0001) == 0x1p-24f);
    CHECK(fp16_to_fp32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(fp16_to_fp32(0x7bff) == 65504.0f);
    CHECK(fp16_to_fp32(0xc000) == -2.0f);
    CHECK(std::isinf(fp16_to_fp32(0xfc00)) && fp16_to_fp32(0xfc00) < 0);
    CHECK(std::isnan(fp16_to_fp32(0x7e00)));
    CHECK(std::signbit(fp16_to_fp32(0x8000)));
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; ++h) {  // every non-NaN half survives a round trip
        const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
        if (!nan && fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(h))) != h) ++bad;
    }
    CHECK(bad == 0);
}

void test_bf16() {
    CHECK(fp32_to_bf16(1.0f) == 0x3f80);
    CHECK(fp32_to_bf16(from_bits(0x3f808000u)) == 0x3f80);  // tie, even below
    CHECK(fp32_to_bf16(from_bits(0x3f818000u)) == 0x3f82);  // tie, even above
    CHECK(fp32_to_bf16(from_bits(0x3f808001u)) == 0x3f81);
    CHECK(fp32_to_bf16(from_bits(0x7f800001u)) == 0x7fc0);  // signalling NaN made quiet
    CHECK(fp32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80);  // FLT_MAX rounds to infinity
    CHECK(bf16_to_fp32(0xbf80) == -1.0f);
}

// Every trit byte value 0..242 reads back its base-3 digits, first trit most significant.
void test_trit_bytes() {
    for (int q = 0; q < 243; ++q) {
        int t[5], r = q;
        for (int n = 4; n >= 0; --n, r /= 3) t[n] = r % 3;
        const uint8_t b = pack_trits5(t);
        for (int n = 0; n < 5; ++n) CHECK(trit_of(b, n) == t[n]);
    }
    for (int q = 0; q < 81; ++q) {
        int t[4], r = q;
        for (int n = 3; n >= 0; --n, r /= 3) t[n] = r % 3;
        const uint8_t b = pack_trits4(t);
        for (int n = 0; n < 4; ++n) CHECK(trit_of(b, n) == t[n]);
    }
}

// Block of `bs` zeros with element k set to v: every byte must equal `base`, except byte `at`,
// which must equal `want`. Bytes from the scale offset on are skipped.
void check_single(GgmlType t, int bs, int k, float v, const std::vector<uint8_t>& base, int at,
                  uint8_t want) {
    std::vector<float> x(bs, 0.0f);
    x[k] = v;
    const std::vector<uint8_t> q = quantize(t, x);
    for (size_t i = 0; i < base.size(); ++i) {
        const uint8_t expect = static_cast<int>(i) == at ? want : base[i];
        if (q[i] != expect) {
            std::fprintf(stderr, "%s element %d = %g: byte %zu is %d, expected %d\n",
                         type_traits(t)->name, k, v, i, q[i], expect);
            ++g_failures;
        }
    }
    const std::vector<float> y = dequantize(t, q, bs);
    for (int j = 0; j < bs; ++j) CHECK(y[j] == (j == k ? v : 0.0f));
}

void test_element_order() {
    // All-zero trits (code 1) pack to 128 in a 5-trit byte and 127 in a 4-trit byte; a single
    // +1 at trit n gives 213, 156, 137, 131, 129 (5 trits) or 212, 155, 136, 130 (4 trits).
    std::vector<uint8_t> ptq(26, 128);
    ptq[24] = ptq[25] = 127;
    const struct { int k, at; uint8_t want; } ptq_cases[] = {
        {0, 0, 213},   {15, 15, 213}, {16, 0, 156},   {79, 15, 129},  {80, 16, 213},
        {87, 23, 213}, {88, 16, 156}, {119, 23, 129}, {120, 24, 212}, {121, 25, 212},
        {122, 24, 155}, {127, 25, 130}};
    for (const auto& c : ptq_cases) check_single(TYPE_PTQ1_0, 128, c.k, 1.0f, ptq, c.at, c.want);
    check_single(TYPE_PTQ1_0, 128, 0, -1.0f, ptq, 0, 43);

    std::vector<uint8_t> tq1(52, 128);
    for (int i = 48; i < 52; ++i) tq1[i] = 127;
    const struct { int k, at; uint8_t want; } tq1_cases[] = {
        {0, 0, 213},    {31, 31, 213},  {32, 0, 156},   {159, 31, 129}, {160, 32, 213},
        {175, 47, 213}, {176, 32, 156}, {239, 47, 129}, {240, 48, 212}, {243, 51, 212},
        {244, 48, 155}, {255, 51, 130}};
    for (const auto& c : tq1_cases) check_single(TYPE_TQ1_0, 256, c.k, 1.0f, tq1, c.at, c.want);

    // 2-bit types: code 1 everywhere is 0x55; a +1 (code 2) in lane l replaces 01 by 10.
    std::vector<uint8_t> tq2(64, 0x55);
    check_single(TYPE_TQ2_0, 256, 0, 1.0f, tq2, 0, 0x56);
    check_single(TYPE_TQ2_0, 256, 32, 1.0f, tq2, 0, 0x59);
    check_single(TYPE_TQ2_0, 256, 127, 1.0f, tq2, 31, 0x95);
    check_single(TYPE_TQ2_0, 256, 128, 1.0f, tq2, 32, 0x56);
    check_single(TYPE_TQ2_0, 256, 255, 1.0f, tq2, 63, 0x95);
    std::vector<uint8_t> q2(2, 0);
    q2[1] = 0x3c;  // fp16 1.0 first
    q2.resize(18, 0x55);
    check_single(TYPE_Q2_0, 64, 0, 1.0f, q2, 2, 0x56);
    check_single(TYPE_Q2_0, 64, 5, 1.0f, q2, 3, 0x59);
    check_single(TYPE_Q2_0, 64, 63, 1.0f, q2, 17, 0x95);
    q2.resize(34, 0x55);
    check_single(TYPE_PQ2_0, 128, 127, 1.0f, q2, 33, 0x95);
    check_single(TYPE_Q2_0_G128, 128, 66, -1.0f, q2, 18, 0x45);
}

void test_scale_position() {
    std::vector<float> x(128, 0.0f);
    x[3] = -2.0f;
    const std::vector<uint8_t> p = quantize(TYPE_PTQ1_0, x);
    CHECK(p.size() == 28 && p[26] == 0x00 && p[27] == 0x40);  // fp16 2.0 last
    const std::vector<uint8_t> q = quantize(TYPE_PQ2_0, x);
    CHECK(q[0] == 0x00 && q[1] == 0x40);                         // fp16 2.0 first
    std::vector<float> z(32, 0.0f);
    z[0] = -0.0f;
    const std::vector<uint8_t> q4 = quantize(TYPE_Q4_0, z);
    CHECK(q4[0] == 0x00 && q4[1] == 0x80);  // llama.cpp: d = +0 / -8 = -0 for an all-zero block
    CHECK(q4[2] == 0x88);
}

// Exactly representable data (codes times a power-of-two or fp16-exact scale) round-trips.
void test_round_trips() {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> trit(-1, 1), code8(-127, 127), code4(-8, 7),
        exp(-20, 10), exp16(-14, 5), mant(1024, 2047);
    for (GgmlType t : kTernaryTypes) {
        const int bs = type_traits(t)->block_size;
        std::vector<float> x(static_cast<size_t>(bs) * 40);
        for (size_t b = 0; b < x.size() / bs; ++b) {
            // A normal fp16 value: 11 significant bits, exponent -14..15.
            const float d = std::ldexp(static_cast<float>(mant(rng)), exp16(rng) - 10);
            for (int j = 0; j < bs; ++j) x[b * bs + j] = static_cast<float>(trit(rng)) * d;
            x[b * bs + rng() % bs] = b % 2 ? d : -d;  // amax = d exactly
        }
        CHECK(dequantize(t, quantize(t, x), x.size()) == x);
    }
    std::vector<float> x8(32 * 40), x4(32 * 40);
    for (size_t b = 0; b < 40; ++b) {
        const float d = std::ldexp(1.0f, exp(rng));
        for (int j = 0; j < 32; ++j) {
            x8[b * 32 + j] = static_cast<float>(code8(rng)) * d;
            x4[b * 32 + j] = static_cast<float>(code4(rng)) * d;
        }
        x8[b * 32 + 5] = 127 * d;
        x4[b * 32 + 9] = -8 * d;
    }
    CHECK(dequantize(TYPE_Q8_0, quantize(TYPE_Q8_0, x8), x8.size()) == x8);
    CHECK(dequantize(TYPE_Q4_0, quantize(TYPE_Q4_0, x4), x4.size()) == x4);
    std::vector<float> xf = {1.0f, -0.5f, 65504.0f, 0x1p-24f, 3.140625f, 0.0f};
    CHECK(dequantize(TYPE_F16, quantize(TYPE_F16, xf), xf.size()) == xf);
    CHECK(dequantize(TYPE_BF16, quantize(TYPE_BF16, xf), xf.size())[4] == 3.140625f);
    xf[1] = 1e30f;
    CHECK(dequantize(TYPE_F32, quantize(TYPE_F32, xf), xf.size()) == xf);
}

void test_rounding() {
    // Q8_0 with amax 127: d = 1, halves round away from zero.
    std::vector<float> x(32, 0.0f);
    x[0] = 127.0f;
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = 0.49999997f;
    const std::vector<uint8_t> q = quantize(TYPE_Q8_0, x);
    CHECK(static_cast<int8_t>(q[3]) == 3 && static_cast<int8_t>(q[4]) == -3 && q[5] == 0);
    // Ternary with amax 1: 0.5 -> +1, -0.5 -> -1, just below 0.5 -> 0.
    std::vector<float> t(128, 0.0f);
    t[0] = 1.0f;
    t[1] = 0.5f;
    t[2] = -0.5f;
    t[3] = 0.49999997f;
    const std::vector<float> y = dequantize(TYPE_PTQ1_0, quantize(TYPE_PTQ1_0, t), 128);
    CHECK(y[1] == 1.0f && y[2] == -1.0f && y[3] == 0.0f);
    // Q4_0 with max -8: x * id + 8.5 truncated; 7.5 / -1 ... values map to nibble trunc(x+8.5).
    std::vector<float> f(32, 0.0f);
    f[0] = -8.0f;  // d = 1, id = 1
    f[1] = 7.6f;   // 16.1 -> 16 -> clamped to 15
    f[2] = -0.5f;  // 8.0 -> 8
    f[3] = -0.51f; // 7.99 -> 7
    const std::vector<uint8_t> q4 = quantize(TYPE_Q4_0, f);
    CHECK((q4[2] & 15) == 0 && (q4[3] & 15) == 15 && (q4[4] & 15) == 8 && (q4[5] & 15) == 7);
}

void test_tiny_scales() {
    for (GgmlType t : kAllTypes) {
        const int bs = type_traits(t)->block_size < 32 ? 32 : type_traits(t)->block_size;
        for (float a : {1e-10f, 1e-30f, 1e-42f, 1.4e-45f}) {
            std::vector<float> x(bs, 0.0f);
            x[1] = a;
            x[2] = -a / 2;
            const std::vector<float> y = dequantize(t, quantize(t, x), bs);  // must not throw
            for (float v : y) CHECK(std::isfinite(v) && std::fabs(v) <= 2 * a + 1e-7f);
        }
    }
    // A float32 scale too small to invert (1/d = inf) still gives sign codes, scale 0.
    std::vector<float> x(128, 0.0f);
    x[0] = 1.4e-45f;
    x[1] = -1.4e-45f;
    const std::vector<uint8_t> q = quantize(TYPE_PTQ1_0, x);
    CHECK(ptq1_0_trit(*reinterpret_cast<const block_ptq1_0*>(q.data()), 0) == 1);
    CHECK(ptq1_0_trit(*reinterpret_cast<const block_ptq1_0*>(q.data()), 1) == -1);
    CHECK(ptq1_0_trit(*reinterpret_cast<const block_ptq1_0*>(q.data()), 2) == 0);
}

void test_errors() {
    std::vector<float> x(256, 0.5f);
    std::vector<uint8_t> buf(4096);
    x[77] = std::numeric_limits<float>::quiet_NaN();
    check_error([&] { quantize_row(TYPE_PTQ1_0, x.data(), buf.data(), 128); },
                {"PTQ1_0", "element 77", "NaN"});
    x[77] = -std::numeric_limits<float>::infinity();
    check_error([&] { quantize_row(TYPE_F32, x.data(), buf.data(), 256); },
                {"F32", "element 77", "-Inf"});
    x[77] = 0.5f;
    check_error([&] { quantize_row(TYPE_TQ1_0, x.data(), buf.data(), 128); },
                {"TQ1_0", "128", "multiple", "256"});
    std::vector<float> y(64);
    check_error([&] { dequantize_row(TYPE_Q8_0, buf.data(), y.data(), 33); }, {"Q8_0", "33", "32"});
    check_error([&] { quantize_row(static_cast<GgmlType>(12), x.data(), buf.data(), 256); },
                {"type id 12"});
    x[200] = 70000.0f;
    for (GgmlType t : {TYPE_PTQ1_0, TYPE_TQ2_0, TYPE_Q2_0, TYPE_PQ2_0, TYPE_TQ1_0})
        check_error([&] { quantize_row(t, x.data(), buf.data(), 256); },
                    {type_traits(t)->name, "too large", "fp16", "F32"});
    check_error([&] { quantize_row(TYPE_F16, x.data(), buf.data(), 256); },
                {"F16", "element 200", "too large"});
    quantize_row(TYPE_Q8_0, x.data(), buf.data(), 256);  // 70000 / 127 fits fp16
    quantize_row(TYPE_Q4_0, x.data(), buf.data(), 256);  // 70000 / 8 fits fp16
    x[200] = 1e7f;
    check_error([&] { quantize_row(TYPE_Q8_0, x.data(), buf.data(), 256); },
                {"Q8_0", "block 6", "elements 192..223"});
    x[200] = 3.4e38f;
    check_error([&] { quantize_row(TYPE_BF16, x.data(), buf.data(), 256); }, {"BF16", "too large"});
    quantize_row(TYPE_F32, x.data(), buf.data(), 256);
}

}  // namespace

int main() {
    test_fp16();
    test_bf16();
    test_trit_bytes();
    test_element_order();
    test_scale_position();
    test_round_trips();
    test_rounding();
    test_tiny_scales();
    test_errors();
    if (g_failures) {
        std::fprintf(stderr, "test_quants: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("test_quants: all passed\n");
    return 0;
}
