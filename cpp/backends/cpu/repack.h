// Weights the CPU backend keeps in an order of its own after loading them (llama.cpp's "repack";
// --no-repack keeps the file's order). Model::load writes them while it copies the CPU's streamed
// weights into huge pages, or in place in a file read into memory (--no-mmap), when the AVX-512
// path is active; the one-token AVX-512 kernel reads them, every other kernel (the GEMM a panel at
// a time) reads rows converted back (unpack_rows). The trits and scales are the file's, so are the
// results.
//   PTQ1_0_R16 PTQ1_0 weights, sixteen rows at a time interleaved dword by dword (ptq1_0_r16.h).
//   PTQ1_0_R16L the same with the trit bytes in a code AVX-512 VBMI reads by lookups, on hosts with
//              VBMI (ptq1_0_r16.h; R16 elsewhere).
//   Q8_0_R4    Q8_0 rows of 2 or more blocks, four rows at a time in groups of four blocks (below).
//
// Q8_0_R4: each full tile of 4 rows (rows 4t..4t+3, nb blocks each) keeps the bytes
// [4t rb, 4(t+1) rb) as groups of four blocks (nb / 4 of them), then the blocks after the last
// group (nb % 4), row after row in the file's layout, at q8r4_rest_offset. A group is 512 bytes of
// codes at q8r4_codes_offset, row c's 128 at + 128 c: the codes 0..15 of the group's blocks 0..3
// (16 bytes each), then their codes 16..31; and 32 bytes of scales at q8r4_scales_offset, block j
// of row c at + 8 j + 2 c. Groups go in pairs, the pair's codes then its scales (1088 bytes,
// 17 cache lines), so the one-token tile reads its tile strictly front to back, one stream that
// the hardware prefetchers follow on their own: with all scales after all of the tile's codes
// instead, the cold head read at 12 GB/s on one Zen 4 core (hardware prefetch only; 19 with
// software prefetches), in pairs at 30, where the probe reads 28-31. Each row's vector holds whole
// blocks in 128-bit chunks, so the four rows' sums reduce to [block][row] without cross-lane
// moves. Rows past the last full tile stay as they are.
#pragma once

#include <cstdint>

#include "bonsai/ops.h"
#include "bonsai/types.h"

namespace bonsai::cpu {

// The type Model::load stores a weight of `type` and `cols` columns as (type itself: unchanged);
// PTQ1_0 becomes PTQ1_0_R16L while AVX-512 VBMI is enabled (avx512_vbmi_enabled), R16 otherwise.
GgmlType repacked_type(GgmlType type, int64_t cols);
// The file's type of a repacked type (any other type: itself).
GgmlType file_type(GgmlType type);
bool is_repacked(GgmlType type);
// Whether `type` is one of the PTQ1_0 16-row tiles (PTQ1_0_R16 or R16L).
inline bool is_r16(GgmlType type) { return type == TYPE_PTQ1_0_R16 || type == TYPE_PTQ1_0_R16L; }
// Whether a repacked type's tiles interleave their rows (Q8_0_R4, PTQ1_0_R16/R16L): every kernel but the
// one-token AVX-512 tile reads them through unpack_rows.
bool rows_interleaved(GgmlType type);
// Rows per tile of a weight of `type`: 16 for PTQ1_0_R16/R16L, 4 otherwise. Work is split, and weights
// repacked (tile_rows(repacked_type(...))), in whole tiles.
int64_t tile_rows(GgmlType type);
constexpr int64_t kMaxTileRows = 16;  // the largest tile_rows

// Q8_0_R4 tiles (above): blocks per group, and where a tile of nb-block rows keeps group g's codes
// and scales and the blocks after its groups.
constexpr int64_t kQ8R4Blocks = 4;
constexpr int64_t q8r4_codes_offset(int64_t g) { return g / 2 * 1088 + g % 2 * 512; }
constexpr int64_t q8r4_scales_offset(int64_t nb, int64_t g) {
    return g / 2 * 1088 + (g / 2 * 2 + 1 < nb / kQ8R4Blocks ? 1024 : 512) + g % 2 * 32;
}
constexpr int64_t q8r4_rest_offset(int64_t nb) { return nb / kQ8R4Blocks * 544; }

// Rows [r0, r1) of a weight of `rows` rows, row_bytes each, from its file type's layout at src to
// the repacked type `type`'s at dst (the same offsets: row r's bytes stay in [r rb, (r + 1) rb) of
// its tile). r0 and r1 must be multiples of its tile_rows or r1 == rows. src and dst must not overlap.
void repack_rows(GgmlType type, const uint8_t* src, uint8_t* dst, int64_t rows, int64_t row_bytes, int64_t r0,
                 int64_t r1);

// The same in place: rows [r0, r1) of the weight at data rewritten, each tile through tmp
// (its tile_rows row_bytes).
void repack_rows_in_place(GgmlType type, uint8_t* data, int64_t rows, int64_t row_bytes, int64_t r0, int64_t r1,
                          uint8_t* tmp);

// Rows [r0, r1) of a repacked weight in the file's layout, row after row at dst.
void unpack_rows(const WeightView& w, int64_t r0, int64_t r1, uint8_t* dst);

}  // namespace bonsai::cpu
