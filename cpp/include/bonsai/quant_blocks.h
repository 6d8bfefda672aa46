// Bit layouts of every quantized block type the engine reads or writes.
//
// This header is the single definition shared by the CPU reference, the SIMD kernels and the CUDA
// kernels; python/bonsai_runner/quants.py mirrors it with numpy and tests/test_quants.py proves the
// packed bytes identical. Layouts are those of mainline llama.cpp (Q8_0, Q4_0, TQ1_0, TQ2_0, Q2_0)
// and of PrismML's fork (PQ2_0 = ggml type 142, PTQ1_0 = 143, legacy Q2_0 with group 128 under
// id 42), element order inside a block included, so files move between the runners unchanged.
//
// Scales are IEEE half precision stored as raw bits (uint16_t), little-endian like the whole file.
//
// Element order within a block (j = element index, d = scale):
//   Q8_0   32 elems: x[j] = qs[j] * d
//   Q4_0   32 elems: x[j] = ((qs[j] & 15) - 8) * d, x[j+16] = ((qs[j] >> 4) - 8) * d, j < 16
//   Q2_0, Q2_0 g128, PQ2_0: x[j] = (((qs[j/4] >> 2*(j%4)) & 3) - 1) * d   (code 3 = +2, unused
//          by ternary data)
//   TQ2_0 256 elems: for half h < 2, lane l < 4, m < 32: x[128h + 32l + m] =
//          (((qs[32h + m] >> 2l) & 3) - 1) * d
//   TQ1_0 / PTQ1_0: base-3 "trit bytes". Five trits t0..t4 (each 0,1,2 for -1,0,+1; t0 most
//          significant) are stored as ceil((81 t0 + 27 t1 + 9 t2 + 3 t3 + t4) * 256 / 243); trit n
//          of byte b is ((uint8_t)(b * 3^n) * 3) >> 8. A 4-trit byte (qh) is stored with its
//          value multiplied by 3 first, so the same rule reads trits 0..3.
//     TQ1_0 256 elems: qs[0..31] hold x[32n + m] (trit n of byte m), qs[32..47] hold
//          x[160 + 16n + m] (trit n of byte 32+m), qh[0..3] hold x[240 + 4n + h].
//     PTQ1_0 128 elems: qs[0..15] hold x[16n + m], qs[16..23] hold x[80 + 8n + m],
//          qh[0..1] hold x[120 + 2n + h].
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define BONSAI_HD __host__ __device__ __forceinline__
#else
#define BONSAI_HD inline
#endif

namespace bonsai {

constexpr int QK8_0 = 32;
constexpr int QK4_0 = 32;
constexpr int QK_K = 256;      // TQ1_0 / TQ2_0 super-block
constexpr int QK2_0 = 64;      // mainline Q2_0
constexpr int QK2_0_G128 = 128; // legacy PrismML Q2_0 (same id 42, told apart by size)
constexpr int QK_PQ2_0 = 128;
constexpr int QK_PTQ1_0 = 128;

struct block_q8_0 {
    uint16_t d;          // scale, fp16 bits
    int8_t qs[QK8_0];    // signed 8-bit quants
};
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must be 34 bytes");

struct block_q4_0 {
    uint16_t d;            // scale, fp16 bits (negative: d = signed max / -8)
    uint8_t qs[QK4_0 / 2]; // low nibble: element j, high nibble: element j + 16
};
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 must be 18 bytes");

struct block_tq1_0 {
    uint8_t qs[48];      // 5 trits per byte: 32 bytes -> 160 elements, 16 bytes -> 80
    uint8_t qh[4];       // 4 trits per byte -> 16 elements
    uint16_t d;          // scale, fp16 bits (last)
};
static_assert(sizeof(block_tq1_0) == 54, "block_tq1_0 must be 54 bytes");

struct block_tq2_0 {
    uint8_t qs[QK_K / 4]; // 2-bit codes, see the element order above
    uint16_t d;           // scale, fp16 bits (last)
};
static_assert(sizeof(block_tq2_0) == 66, "block_tq2_0 must be 66 bytes");

struct block_q2_0 {
    uint16_t d;            // scale, fp16 bits (first)
    uint8_t qs[QK2_0 / 4]; // element j at bits 2*(j%4) of byte j/4, code = t + 1
};
static_assert(sizeof(block_q2_0) == 18, "block_q2_0 must be 18 bytes");

struct block_q2_0_g128 {
    uint16_t d;                 // scale, fp16 bits (first)
    uint8_t qs[QK2_0_G128 / 4]; // as block_q2_0, 128 elements
};
static_assert(sizeof(block_q2_0_g128) == 34, "block_q2_0_g128 must be 34 bytes");

struct block_pq2_0 {
    uint16_t d;               // scale, fp16 bits (first)
    uint8_t qs[QK_PQ2_0 / 4]; // as block_q2_0, 128 elements
};
static_assert(sizeof(block_pq2_0) == 34, "block_pq2_0 must be 34 bytes");

struct block_ptq1_0 {
    uint8_t qs[24];      // 5 trits per byte: 16 bytes -> 80 elements, 8 bytes -> 40
    uint8_t qh[2];       // 4 trits per byte -> 8 elements
    uint16_t d;          // scale, fp16 bits (last)
};
static_assert(sizeof(block_ptq1_0) == 28, "block_ptq1_0 must be 28 bytes");

// Trit n (0..4) of a base-3 byte, as 0, 1 or 2 (meaning -1, 0, +1). No division: multiplying by
// 3^n modulo 256 leaves trit n in the top bits, and three times the top byte over 256 reads it.
BONSAI_HD int trit_of(uint8_t byte, int n) {
    constexpr uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const uint8_t q = static_cast<uint8_t>(byte * pow3[n]);
    return (static_cast<uint16_t>(q) * 3) >> 8;
}

// Packs five trits (0..2 each, t[0] most significant) into one byte; four-trit bytes pass t[4]=0
// after the shift described above (callers use pack_trits4).
BONSAI_HD uint8_t pack_trits5(const int t[5]) {
    int q = 0;
    for (int n = 0; n < 5; ++n) q = q * 3 + t[n];
    return static_cast<uint8_t>((q * 256 + 242) / 243);
}

BONSAI_HD constexpr uint8_t pack_trits4(const int t[4]) {
    int q = 0;
    for (int n = 0; n < 4; ++n) q = q * 3 + t[n];
    q *= 3;
    return static_cast<uint8_t>((q * 256 + 242) / 243);
}

// Trit (-1, 0, +1) of element j of a PTQ1_0 block.
BONSAI_HD int ptq1_0_trit(const block_ptq1_0& b, int j) {
    if (j < 80) return trit_of(b.qs[j & 15], j >> 4) - 1;
    if (j < 120) return trit_of(b.qs[16 + ((j - 80) & 7)], (j - 80) >> 3) - 1;
    return trit_of(b.qh[(j - 120) & 1], (j - 120) >> 1) - 1;
}

// Trit (-1, 0, +1) of element j of a TQ1_0 block.
BONSAI_HD int tq1_0_trit(const block_tq1_0& b, int j) {
    if (j < 160) return trit_of(b.qs[j & 31], j >> 5) - 1;
    if (j < 240) return trit_of(b.qs[32 + ((j - 160) & 15)], (j - 160) >> 4) - 1;
    return trit_of(b.qh[(j - 240) & 3], (j - 240) >> 2) - 1;
}

// 2-bit code (0..3, value = code - 1) of element j of a TQ2_0 block.
BONSAI_HD int tq2_0_code(const block_tq2_0& b, int j) {
    const int h = j >> 7, l = (j >> 5) & 3, m = j & 31;
    return (b.qs[32 * h + m] >> (2 * l)) & 3;
}

// 2-bit code (0..3, value = code - 1) of element j of a Q2_0 / Q2_0 g128 / PQ2_0 block.
BONSAI_HD int q2_code(const uint8_t* qs, int j) {
    return (qs[j >> 2] >> (2 * (j & 3))) & 3;
}

}  // namespace bonsai
