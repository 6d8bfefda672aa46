// Scalar unpacking of one quantized block into signed integer weights in element order, so that
// x[j] = d * vals[j] (the layouts are in bonsai/quant_blocks.h). Shared by the scalar INT8 kernel,
// the FLOAT-mode kernels and get_rows.
#pragma once

#include <cstdint>
#include <cstring>

#include "bonsai/types.h"

namespace bonsai::cpu {

// Little-endian 16-bit field (an fp16 scale) at any alignment.
inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

struct BlockInfo {
    int elems;     // elements per block
    int bytes;     // bytes per block
    int d_offset;  // byte offset of the fp16 scale inside the block
};

// Geometry of a quantized type; nullptr for F32/F16/BF16 and unknown types.
const BlockInfo* block_info(GgmlType type);

// vals[0..elems) = integer weights of the block; returns the block's scale d.
float unpack_block(GgmlType type, const uint8_t* block, int8_t* vals);

// out[0..cols) = dequantized row (any type, F32/F16/BF16 included).
void dequantize_row_cpu(GgmlType type, const uint8_t* row, int64_t cols, float* out);

}  // namespace bonsai::cpu
