// PTQ1_0 rows interleaved sixteen at a time ("R16"): an in-memory layout of PTQ1_0 weights that the
// AVX-512 one-token kernel reads with every sum already one lane per row. It never appears in a
// file: Model::load writes it while copying the CPU's streamed weights into huge pages (repack.h),
// and views of such weights carry TYPE_PTQ1_0_R16, or TYPE_PTQ1_0_R16L where the qs bytes are in the
// R16 code below (hosts with AVX-512 VBMI).
//
// A weight keeps its size and each row range its bytes' place; inside a tile of 16 rows their
// order changes and trit bytes are re-coded (the last tile of a weight whose rows are not a
// multiple of 16 has w = rows % 16 rows and the same order at width w). Block b of the tile's w
// rows is 28 w bytes at 28 w b, seven "vectors" of w dwords, row r's dword at 4 r:
//   vectors k < 6   dword k of the row's 24 five-trit qs bytes (qs bytes 4 k .. 4 k + 3): the
//                   file's bytes (R16) or each byte in the R16 code below (R16L);
//   vector 6        [qh'0, qh'1, d (fp16, 2 bytes)]: qh'h is qh byte h re-coded as 2-bit fields,
//                   field f holding trit f of the file's byte (element 120 + 2 f + h), so the kernel
//                   reads it with a shift and a mask instead of table lookups.
// For w = 16 each vector is one 64-byte zmm whose lane r is row r: a block's products land in one
// lane per row, and the kernel adds d_b * isum_b to a per-row accumulator block after block (the
// scalar kernel's order) with no transposition. Element order inside a block is PTQ1_0's
// (bonsai/quant_blocks.h). Unpacking writes every qh byte (and an R16L tile every qs byte) as the
// quantizers pack its trits (pack_trits4, pack_trits5): a file's byte not in that form (most qh
// bytes, 13 of the 256 qs bytes; the quantizers never write one) comes back as the canonical byte
// of the same trits, so every product and value is unchanged.
//
// The R16 code of five trits t0..t4 (trit n of the file's byte, t0 first): with a = 3 t0 + t1,
// g = 9 t2 + 3 t3 + t4, i = g % 7 and m = g / 7, the code is 64 m + 7 a + i. Its low six bits
// l = 7 a + i (< 63) give t0 and t1 by one lookup each (R16QsTables::t0, t1); its top two bits m and
// l's position i give t2..t4: key[l] = i ^ (l >> 2), so (key[l] ^ code >> 2) & 63 = 16 m + i, and
// that index reads t2, t3 and t4. AVX-512 VBMI's vpermb takes the low six bits of every index byte,
// so the kernel decodes a vector of codes with six such lookups, a shift and an XOR, where a
// file's base-3 byte needs a 256-entry table per trit (five two-table lookups behind a mask and a
// stand-in key): on a Zen 4, 0.91x the kernel's time. Without VBMI the code has no cheap decode, so
// those hosts keep R16 (their kernel unpacks base-3 bytes with multiplies); while the tests switch
// VBMI off, R16L weights are read converted back (int8_layout_for).
#pragma once

#include <cstdint>

namespace bonsai::cpu {

constexpr int kR16Rows = 16;         // rows per tile
constexpr int kR16Vectors = 7;       // vectors per block: six of qs dwords, one of [qh', d]
constexpr int kR16Bytes = 28 * 16;   // bytes of a full tile's block (448: seven zmm)
// 64-byte activation vectors of a block in the one-token kernel (int8_layout.h): 34 dwords used.
constexpr int kR16ActVectors = 3;

// Lookup tables of the R16 code (above): t0, t1 and key by a code's low six bits, t2..t4 by
// (key ^ code >> 2) & 63. Entries no code reaches are 0.
struct R16QsTables {
    alignas(64) uint8_t t0[64];
    alignas(64) uint8_t t1[64];
    alignas(64) uint8_t key[64];
    alignas(64) uint8_t t2[64];
    alignas(64) uint8_t t3[64];
    alignas(64) uint8_t t4[64];
};
extern const R16QsTables kR16Qs;

// The R16 code of a file's five-trit byte, and the canonical byte (pack_trits5) of a code's trits.
uint8_t r16_qs_code(uint8_t file_byte);
uint8_t r16_qs_byte(uint8_t code);

// Rows [0, n) of a tile (n <= 16 rows of n_blocks blocks each, contiguous in the file's layout) into
// the tile order at dst, and back; `code`: qs bytes in the R16 code (R16L). src and dst must not
// overlap.
void pack_ptq1_0_r16_tile(const uint8_t* src, uint8_t* dst, int n, int64_t n_blocks, bool code);
void unpack_ptq1_0_r16_tile(const uint8_t* src, uint8_t* dst, int n, int64_t n_blocks, bool code);

}  // namespace bonsai::cpu
