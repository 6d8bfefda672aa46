// Weights the CPU backend keeps in an order of its own after loading them (llama.cpp's "repack";
// --no-repack keeps the file's order). Model::load writes them while it copies the CPU's streamed
// weights into huge pages, or in place in a file read into memory (--no-mmap), when the AVX-512
// path is active; the one-token AVX-512 kernel and the
// AVX-512 GEMM read them, every other kernel reads rows converted back (unpack_rows). The bytes are
// the file's, so are the results.
//   PTQ1_0_X8  PTQ1_0 rows of 8 or more blocks, each row regrouped eight blocks at a time
//              (ptq1_0_x8.h).
//   Q8_0_R4    Q8_0 rows of 2 or more blocks, interleaved four rows at a time (below).
//
// Interleaving by four: each full tile of 4 rows (rows 4t..4t+3) keeps the bytes [4t rb, 4(t+1) rb)
// but stores the first `lead` bytes of every row as units of `unit` bytes, unit-major (unit k of
// the tile's row i at 4 k unit + i unit), then the rest of each row, row after row (4 lead +
// i (rb - lead)). A tile is then one run of memory that the 4-row tile reads front to back: one
// stream instead of four interleaved ones, which the hardware prefetchers follow better (a Q8_0
// output head read 15-24% faster when other tenants use the memory bandwidth). Rows past the last
// full tile stay as they are. (Tried on Zen 4: groups of four blocks, each row's codes 0..15 and
// 16..31 of the group in two vectors and the scales apart, halve the one-token tile's work from
// the cache, but the cold head read slower, 19 against 24 GB/s on one core, 25-30 against 29-31 on
// two.)
#pragma once

#include <cstdint>

#include "bonsai/ops.h"
#include "bonsai/types.h"

namespace bonsai::cpu {

struct Interleave {
    int64_t unit = 0;  // bytes of a unit; 0: rows not interleaved
    int64_t lead = 0;  // bytes of a row stored unit-major (a multiple of unit)
};

// The type Model::load stores a weight of `type` and `cols` columns as (type itself: unchanged).
GgmlType repacked_type(GgmlType type, int64_t cols);
// The file's type of a repacked type (any other type: itself).
GgmlType file_type(GgmlType type);
bool is_repacked(GgmlType type);
// How rows of a repacked type with row_bytes bytes each are interleaved.
Interleave interleave_of(GgmlType type, int64_t row_bytes);

// Rows [r0, r1) of a weight of `rows` rows, row_bytes each, from the file's layout at src to
// repacked_type(file)'s at dst (the same offsets: row r's bytes stay in [r rb, (r + 1) rb) of its
// tile). r0 and r1 must be multiples of 4 or r1 == rows. src and dst must not overlap.
void repack_rows(GgmlType file, const uint8_t* src, uint8_t* dst, int64_t rows, int64_t row_bytes, int64_t r0,
                 int64_t r1);

// The same in place: rows [r0, r1) of the weight at data rewritten, each 4-row tile through tmp
// (4 row_bytes).
void repack_rows_in_place(GgmlType file, uint8_t* data, int64_t rows, int64_t row_bytes, int64_t r0, int64_t r1,
                          uint8_t* tmp);

// Rows [r0, r1) of a repacked weight in the file's layout, row after row at dst.
void unpack_rows(const WeightView& w, int64_t r0, int64_t r1, uint8_t* dst);

}  // namespace bonsai::cpu
