// PTQ1_0 rows interleaved sixteen at a time ("R16"): an in-memory layout of PTQ1_0 weights that the
// AVX-512 one-token kernel reads with every sum already one lane per row. It never appears in a
// file: Model::load writes it while copying the CPU's streamed weights into huge pages (repack.h),
// and views of such weights carry TYPE_PTQ1_0_R16.
//
// A weight keeps its size and each row range its bytes' place; only their order inside a tile of
// 16 rows changes (the last tile of a weight whose rows are not a multiple of 16 has w = rows % 16
// rows and the same order at width w). Block b of the tile's w rows is 28 w bytes at 28 w b, seven
// "vectors" of w dwords, row r's dword at 4 r:
//   vectors k < 6   dword k of the row's 24 five-trit qs bytes (qs bytes 4 k .. 4 k + 3);
//   vector 6        [qh'0, qh'1, d (fp16, 2 bytes)]: qh'h is qh byte h re-coded as 2-bit fields,
//                   field f holding trit f of the file's byte (element 120 + 2 f + h), so the kernel
//                   reads it with a shift and a mask instead of table lookups.
// For w = 16 each vector is one 64-byte zmm whose lane r is row r: a block's products land in one
// lane per row, and the kernel adds d_b * isum_b to a per-row accumulator block after block (the
// scalar kernel's order) with no transposition. Element order inside a block is PTQ1_0's
// (bonsai/quant_blocks.h). Unpacking writes every qh byte as the quantizer packs its four trits
// (pack_trits4): a file's qh byte not in that form (the quantizers never write one) comes back as
// the canonical byte of the same trits, so every product and value is unchanged.
#pragma once

#include <cstdint>

namespace bonsai::cpu {

constexpr int kR16Rows = 16;         // rows per tile
constexpr int kR16Vectors = 7;       // vectors per block: six of qs dwords, one of [qh', d]
constexpr int kR16Bytes = 28 * 16;   // bytes of a full tile's block (448: seven zmm)
// 64-byte activation vectors of a block in the one-token kernel (int8_layout.h): 34 dwords used.
constexpr int kR16ActVectors = 3;

// Rows [0, n) of a tile (n <= 16 rows of n_blocks blocks each, contiguous in the file's layout) into
// the tile order at dst, and back. src and dst must not overlap.
void pack_ptq1_0_r16_tile(const uint8_t* src, uint8_t* dst, int n, int64_t n_blocks);
void unpack_ptq1_0_r16_tile(const uint8_t* src, uint8_t* dst, int n, int64_t n_blocks);

}  // namespace bonsai::cpu
