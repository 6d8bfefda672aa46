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
//   bytes [192, 208) the blocks' two four-trit bytes qh, block after block;
//   bytes [208, 224) the blocks' fp16 scales, block after block.
// The blocks past the last full group (n_blocks % 8) follow unchanged in the PTQ1_0 layout.
// Element order inside a block is PTQ1_0's (bonsai/quant_blocks.h): trit n of qs[j] is element
// 16 n + j (j < 16) or 80 + 8 n + (j - 16), trit n < 4 of qh[h] is element 120 + 2 n + h.
#pragma once

#include <cstdint>

namespace bonsai::cpu {

constexpr int kX8Blocks = 8;     // blocks per group
constexpr int kX8Bytes = 224;    // bytes per group (8 x 28)
constexpr int kX8QhOffset = 192;
constexpr int kX8DOffset = 208;

// Position inside a group of byte j (< 24) of block b's qs.
constexpr int x8_qs_pos(int b, int j) { return 64 * (j / 8) + 4 * (b + 8 * (j / 4 % 2)) + j % 4; }

// One row of n_blocks PTQ1_0 blocks into the X8 order (src and dst must not overlap), and back.
void pack_ptq1_0_x8_row(const uint8_t* src, uint8_t* dst, int64_t n_blocks);
void unpack_ptq1_0_x8_row(const uint8_t* src, uint8_t* dst, int64_t n_blocks);

}  // namespace bonsai::cpu
