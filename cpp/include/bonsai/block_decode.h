// Element access into packed weight rows, shared by the CUDA kernels and the host (where
// cpp/tests/test_block_decode.cpp checks it against the CPU dequantizer).
//
// Every function reads bytes only: packed blocks are not aligned to their natural size (a 28-byte
// PTQ1_0 block sits at any even offset, an 18-byte Q4_0 block likewise), so nothing here casts a
// block pointer to a wider type. The bit layouts are those of quant_blocks.h:
//   block_value(t, blk, j)  signed integer weight of element j of one block (x[j] = d * value)
//   block_scale(t, blk)     the block's scale d (fp16, little-endian, at block_geom().d_offset)
//   row_element(t, row, k)  element k of a row of any type, dequantized to float exactly as
//                           dequantize_row does (d * value in float32, one rounding)
#pragma once

#include <cstdint>
#include <cstring>

#include "bonsai/quant_blocks.h"
#include "bonsai/quants.h"
#include "bonsai/types.h"

namespace bonsai {

struct BlockGeom {
    int elems;     // elements per block (1 for F32 / F16 / BF16)
    int bytes;     // bytes per block
    int d_offset;  // byte offset of the fp16 scale (-1 for the float types)
};

// Geometry of a type; {0, 0, -1} for an unknown type.
BONSAI_HD BlockGeom block_geom(GgmlType t) {
    switch (t) {
        case TYPE_F32: return {1, 4, -1};
        case TYPE_F16: return {1, 2, -1};
        case TYPE_BF16: return {1, 2, -1};
        case TYPE_Q8_0: return {QK8_0, 34, 0};
        case TYPE_Q4_0: return {QK4_0, 18, 0};
        case TYPE_TQ1_0: return {QK_K, 54, 52};
        case TYPE_TQ2_0: return {QK_K, 66, 64};
        case TYPE_Q2_0: return {QK2_0, 18, 0};
        case TYPE_Q2_0_G128: return {QK2_0_G128, 34, 0};
        case TYPE_PQ2_0: return {QK_PQ2_0, 34, 0};
        case TYPE_PTQ1_0: return {QK_PTQ1_0, 28, 26};
        default: return {0, 0, -1};
    }
}

// Little-endian 16-bit value at any address.
BONSAI_HD uint16_t load_le16(const uint8_t* p) {
    return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}

BONSAI_HD float block_scale(GgmlType t, const uint8_t* blk) {
    return fp16_to_fp32(load_le16(blk + block_geom(t).d_offset));
}

// Signed integer weight of element j of a quantized block (0 for the float types).
BONSAI_HD int block_value(GgmlType t, const uint8_t* blk, int j) {
    switch (t) {
        case TYPE_Q8_0:
            return static_cast<int8_t>(blk[2 + j]);
        case TYPE_Q4_0:
            return j < 16 ? (blk[2 + j] & 15) - 8 : (blk[2 + j - 16] >> 4) - 8;
        case TYPE_TQ1_0:
            if (j < 160) return trit_of(blk[j & 31], j >> 5) - 1;
            if (j < 240) return trit_of(blk[32 + ((j - 160) & 15)], (j - 160) >> 4) - 1;
            return trit_of(blk[48 + ((j - 240) & 3)], (j - 240) >> 2) - 1;
        case TYPE_PTQ1_0:
            if (j < 80) return trit_of(blk[j & 15], j >> 4) - 1;
            if (j < 120) return trit_of(blk[16 + ((j - 80) & 7)], (j - 80) >> 3) - 1;
            return trit_of(blk[24 + ((j - 120) & 1)], (j - 120) >> 1) - 1;
        case TYPE_TQ2_0: {
            const int h = j >> 7, l = (j >> 5) & 3, m = j & 31;
            return ((blk[32 * h + m] >> (2 * l)) & 3) - 1;
        }
        case TYPE_Q2_0:
        case TYPE_Q2_0_G128:
        case TYPE_PQ2_0:
            return q2_code(blk + 2, j) - 1;
        default:
            return 0;
    }
}

// Element k of a row of type t, as float (bit-identical to dequantize_row).
BONSAI_HD float row_element(GgmlType t, const uint8_t* row, int64_t k) {
    switch (t) {
        case TYPE_F32: {
            const uint8_t* p = row + 4 * k;
            return bits_float(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
        }
        case TYPE_F16: return fp16_to_fp32(load_le16(row + 2 * k));
        case TYPE_BF16: return bf16_to_fp32(load_le16(row + 2 * k));
        default: break;
    }
    const BlockGeom g = block_geom(t);
    const uint8_t* blk = row + (k / g.elems) * g.bytes;
    return block_scale(t, blk) * static_cast<float>(block_value(t, blk, static_cast<int>(k % g.elems)));
}

}  // namespace bonsai
