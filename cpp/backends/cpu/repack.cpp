// The CPU backend's repacked weights (repack.h): which types, and the conversions both ways.
#include "repack.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "bonsai/quant_blocks.h"
#include "cpu_features.h"
#include "ptq1_0_r16.h"

namespace bonsai::cpu {

namespace {

// A full Q8_0_R4 tile (repack.h) from its 4 rows of rb bytes in the file's layout at src (forward),
// or those rows from the tile at src.
void interleave_q8_tile(const uint8_t* src, uint8_t* dst, int64_t rb, bool forward) {
    constexpr int64_t bb = sizeof(block_q8_0), G = kQ8R4Blocks;
    const int64_t nb = rb / bb, ng = nb / G, rest = nb - ng * G;
    // n bytes at row_off of the rows and tile_off of the tile
    auto piece = [&](int64_t row_off, int64_t tile_off, int64_t n) {
        if (forward) std::memcpy(dst + tile_off, src + row_off, static_cast<size_t>(n));
        else std::memcpy(dst + row_off, src + tile_off, static_cast<size_t>(n));
    };
    for (int64_t c = 0; c < 4; ++c) {
        for (int64_t g = 0; g < ng; ++g)
            for (int64_t j = 0; j < G; ++j) {
                const int64_t blk = c * rb + (G * g + j) * bb;
                for (int64_t h = 0; h < 2; ++h)
                    piece(blk + 2 + 16 * h, q8r4_codes_offset(g) + 128 * c + 64 * h + 16 * j, 16);
                piece(blk, q8r4_scales_offset(nb, g) + 8 * j + 2 * c, 2);
            }
        piece(c * rb + G * ng * bb, q8r4_rest_offset(nb) + c * rest * bb, rest * bb);
    }
}

// One tile of a weight of repacked type `type`: its n rows (tile_rows(type), or fewer after the last
// full tile: `full` says which) from src to dst, both pointing at the tile's first row.
void repack_tile(GgmlType type, const uint8_t* src, uint8_t* dst, int64_t n, int64_t row_bytes, bool full) {
    if (is_r16(type)) {
        pack_ptq1_0_r16_tile(src, dst, static_cast<int>(n), row_bytes / static_cast<int64_t>(sizeof(block_ptq1_0)),
                             type == TYPE_PTQ1_0_R16L);
    } else if (full) {
        interleave_q8_tile(src, dst, row_bytes, true);
    } else {
        std::memcpy(dst, src, static_cast<size_t>(n * row_bytes));
    }
}

}  // namespace

GgmlType repacked_type(GgmlType type, int64_t cols) {
    // (R16L only where the kernels read its code natively: int8_layout_for decides by the same switch)
    if (type == TYPE_PTQ1_0 && cols >= QK_PTQ1_0) return avx512_vbmi_enabled() ? TYPE_PTQ1_0_R16L : TYPE_PTQ1_0_R16;
    if (type == TYPE_Q8_0 && cols >= 2 * QK8_0) return TYPE_Q8_0_R4;
    return type;
}

GgmlType file_type(GgmlType type) {
    if (is_r16(type)) return TYPE_PTQ1_0;
    if (type == TYPE_Q8_0_R4) return TYPE_Q8_0;
    return type;
}

bool is_repacked(GgmlType type) { return file_type(type) != type; }

bool rows_interleaved(GgmlType type) { return type == TYPE_Q8_0_R4 || is_r16(type); }

int64_t tile_rows(GgmlType type) { return is_r16(type) ? kR16Rows : 4; }
static_assert(kMaxTileRows == kR16Rows);

void repack_rows(GgmlType type, const uint8_t* src, uint8_t* dst, int64_t rows, int64_t row_bytes, int64_t r0,
                 int64_t r1) {
    const int64_t tr = tile_rows(type), full = rows / tr * tr;
    for (int64_t r = r0; r < r1; r += tr) {
        const int64_t n = std::min<int64_t>(tr, r1 - r);
        repack_tile(type, src + r * row_bytes, dst + r * row_bytes, n, row_bytes, n == tr && r + tr <= full);
    }
}

void repack_rows_in_place(GgmlType type, uint8_t* data, int64_t rows, int64_t row_bytes, int64_t r0, int64_t r1,
                          uint8_t* tmp) {
    const int64_t tr = tile_rows(type), full = rows / tr * tr;
    for (int64_t r = r0; r < r1; r += tr) {
        const int64_t n = std::min<int64_t>(tr, r1 - r);
        std::memcpy(tmp, data + r * row_bytes, static_cast<size_t>(n * row_bytes));
        repack_tile(type, tmp, data + r * row_bytes, n, row_bytes, n == tr && r + tr <= full);
    }
}

void unpack_rows(const WeightView& w, int64_t r0, int64_t r1, uint8_t* dst) {
    const auto* data = static_cast<const uint8_t*>(w.data);
    const int64_t rb = static_cast<int64_t>(w.row_bytes);
    if (is_r16(w.type)) {  // whole tiles, through a copy for a tile the range cuts
        const bool code = w.type == TYPE_PTQ1_0_R16L;
        const int64_t nb = rb / static_cast<int64_t>(sizeof(block_ptq1_0));
        std::vector<uint8_t> tile;
        for (int64_t r = r0; r < r1;) {
            const int64_t t = r / kR16Rows * kR16Rows, n = std::min<int64_t>(kR16Rows, w.rows - t);
            const int64_t e = std::min(r1, t + n);
            if (r == t && e == t + n) {
                unpack_ptq1_0_r16_tile(data + t * rb, dst + (r - r0) * rb, static_cast<int>(n), nb, code);
            } else {
                tile.resize(static_cast<size_t>(n * rb));
                unpack_ptq1_0_r16_tile(data + t * rb, tile.data(), static_cast<int>(n), nb, code);
                std::memcpy(dst + (r - r0) * rb, tile.data() + (r - t) * rb, static_cast<size_t>((e - r) * rb));
            }
            r = e;
        }
        return;
    }
    const int64_t full = w.rows / 4 * 4;
    std::vector<uint8_t> tile;  // only for a tile the range cuts (the GEMM's panels are whole tiles)
    for (int64_t r = r0; r < r1;) {
        if (r >= full || !rows_interleaved(w.type)) {
            std::memcpy(dst + (r - r0) * rb, data + r * rb, static_cast<size_t>((r1 - r) * rb));
            return;
        }
        const int64_t t = r / 4 * 4, e = std::min(r1, t + 4);
        if (r == t && e == t + 4) {
            interleave_q8_tile(data + t * rb, dst + (r - r0) * rb, rb, false);
        } else {
            tile.resize(static_cast<size_t>(4 * rb));
            interleave_q8_tile(data + t * rb, tile.data(), rb, false);
            std::memcpy(dst + (r - r0) * rb, tile.data() + (r - t) * rb, static_cast<size_t>((e - r) * rb));
        }
        r = e;
    }
}

}  // namespace bonsai::cpu
