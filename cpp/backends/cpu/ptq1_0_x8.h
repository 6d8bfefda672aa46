// PTQ1_0 regrouped eight blocks at a time ("X8"): an in-memory layout of PTQ1_0 rows that the
// AVX-512 one-token kernel reads with fewer unpacking steps. It never appears in a file: Model::load
// writes it while copying the CPU's streamed weights into huge pages (repack.h), and views of such
// rows carry TYPE_PTQ1_0_X8.
//
// A row keeps its size and its bytes; only their order changes. Each run of eight blocks (1024
// weights, 224 bytes) becomes one group:
//   bytes [0, 192)   the blocks' 24 five-trit bytes qs, as three 64-byte vectors: byte j of block b
//                    (j = 4m + k, m < 6, k < 4) sits in vector m / 2, dword b + 8 (m % 2), byte k;
//                    so each dword holds four bytes of one block and dwords b and b + 8 of every
//                    vector belong to block b (the kernel sums the two 256-bit halves and has the
//                    eight block sums in eight lanes);
//   bytes [192, 208) the blocks' 64 qh trits (elements 120..127 of each) re-coded as 2-bit fields,
//                    four to a byte: dword d (bytes 4 d .. 4 d + 3) holds blocks 2 d (fields 0, 1)
//                    and 2 d + 1 (fields 2, 3); byte 4 d + k, field f holds element 120 + 4 (f % 2)
//                    + k of its block (x8_qh_slot). A field reads with a shift and a mask where a
//                    base-3 byte needs table lookups, and each dword of a field's vector belongs to
//                    one block, so the kernel takes a block's qh products with four vpdpbusd for the
//                    four rows of a tile instead of eight;
//   bytes [208, 224) the blocks' fp16 scales, block after block.
// The blocks past the last full group (n_blocks % 8) follow unchanged in the PTQ1_0 layout.
// Element order inside a block is PTQ1_0's (bonsai/quant_blocks.h): trit n of qs[j] is element
// 16 n + j (j < 16) or 80 + 8 n + (j - 16), trit n < 4 of qh[h] is element 120 + 2 n + h.
// Unpacking writes every qh byte as the quantizer packs its four trits (pack_trits4): a file's qh
// byte that is not in that form (the quantizers never write one; any byte reads as four trits)
// comes back as the canonical byte of the same trits, so every product and value is unchanged.
#pragma once

#include <cstdint>

#include "bonsai/quant_blocks.h"

namespace bonsai::cpu {

constexpr int kX8Blocks = 8;     // blocks per group
constexpr int kX8Bytes = 224;    // bytes per group (8 x 28)
constexpr int kX8QhOffset = 192;
constexpr int kX8DOffset = 208;
// Activation vectors of a group in the one-token kernel (int8_layout.h): 15 for the qs trits, 4 for
// the qh fields.
constexpr int kX8CodeVectors = 19;

// Position inside a group of byte j (< 24) of block b's qs.
constexpr int x8_qs_pos(int b, int j) { return 64 * (j / 8) + 4 * (b + 8 * (j / 4 % 2)) + j % 4; }

// Where element 120 + m (m < 8) of block b sits among a group's qh bytes: byte (from kX8QhOffset)
// and 2-bit field.
struct X8QhSlot {
    int byte, field;
};
constexpr X8QhSlot x8_qh_slot(int b, int m) { return {4 * (b / 2) + m % 4, 2 * (b % 2) + m / 4}; }

// kX8QhBase3.v[i]: the canonical qh byte (pack_trits4) of the trits t0, t1, t2, t3 in bits 0..1,
// 4..5, 2..3, 6..7 of i. The low nibbles of bytes h and h + 2 of a qh dword, i = nib(h) |
// nib(h + 2) << 4, hold trits 0, 2 and 1, 3 of qh byte h of the dword's first block (the high
// nibbles: of its second block). Indices holding a field 3 (never written) map to 0.
struct X8QhBase3 {
    uint8_t v[256];
    constexpr X8QhBase3() : v() {
        for (int i = 0; i < 256; ++i) {
            const int t[4] = {i & 3, i >> 4 & 3, i >> 2 & 3, i >> 6 & 3};
            if (t[0] < 3 && t[1] < 3 && t[2] < 3 && t[3] < 3) v[i] = pack_trits4(t);
        }
    }
};
inline constexpr X8QhBase3 kX8QhBase3{};

// One row of n_blocks PTQ1_0 blocks into the X8 order (src and dst must not overlap), and back.
void pack_ptq1_0_x8_row(const uint8_t* src, uint8_t* dst, int64_t n_blocks);
void unpack_ptq1_0_x8_row(const uint8_t* src, uint8_t* dst, int64_t n_blocks);

}  // namespace bonsai::cpu
