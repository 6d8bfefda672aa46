// Scalar block unpacking for every quantized type, following the element order documented in
// bonsai/quant_blocks.h (trits read with trit_of, 2-bit codes with q2_code / tq2_0_code).
#include "block_unpack.h"

#include <cstring>

#include "bonsai/quant_blocks.h"
#include "bonsai/quants.h"

namespace bonsai::cpu {

namespace {

const BlockInfo kQ8_0{QK8_0, sizeof(block_q8_0), 0};
const BlockInfo kQ4_0{QK4_0, sizeof(block_q4_0), 0};
const BlockInfo kTQ1_0{QK_K, sizeof(block_tq1_0), 52};
const BlockInfo kTQ2_0{QK_K, sizeof(block_tq2_0), 64};
const BlockInfo kQ2_0{QK2_0, sizeof(block_q2_0), 0};
const BlockInfo kQ2_0_G128{QK2_0_G128, sizeof(block_q2_0_g128), 0};
const BlockInfo kPQ2_0{QK_PQ2_0, sizeof(block_pq2_0), 0};
const BlockInfo kPTQ1_0{QK_PTQ1_0, sizeof(block_ptq1_0), 26};

// Five trits of byte b (t0 most significant) as -1/0/+1, without division.
inline void trits5(uint8_t b, int8_t* out, int stride, int count) {
    for (int n = 0; n < count; ++n) out[n * stride] = static_cast<int8_t>(trit_of(b, n) - 1);
}

}  // namespace

const BlockInfo* block_info(GgmlType type) {
    switch (type) {
        case TYPE_Q8_0: return &kQ8_0;
        case TYPE_Q4_0: return &kQ4_0;
        case TYPE_TQ1_0: return &kTQ1_0;
        case TYPE_TQ2_0: return &kTQ2_0;
        case TYPE_Q2_0: return &kQ2_0;
        case TYPE_Q2_0_G128: return &kQ2_0_G128;
        case TYPE_PQ2_0: return &kPQ2_0;
        case TYPE_PTQ1_0: return &kPTQ1_0;
        default: return nullptr;
    }
}

float unpack_block(GgmlType type, const uint8_t* p, int8_t* v) {
    const BlockInfo* bi = block_info(type);
    const float d = fp16_to_fp32(load_u16(p + bi->d_offset));
    switch (type) {
        case TYPE_Q8_0:
            std::memcpy(v, p + 2, QK8_0);
            break;
        case TYPE_Q4_0:
            for (int j = 0; j < 16; ++j) {
                v[j] = static_cast<int8_t>((p[2 + j] & 15) - 8);
                v[j + 16] = static_cast<int8_t>((p[2 + j] >> 4) - 8);
            }
            break;
        case TYPE_TQ1_0:
            for (int m = 0; m < 32; ++m) trits5(p[m], v + m, 32, 5);
            for (int m = 0; m < 16; ++m) trits5(p[32 + m], v + 160 + m, 16, 5);
            for (int h = 0; h < 4; ++h) trits5(p[48 + h], v + 240 + h, 4, 4);
            break;
        case TYPE_PTQ1_0:
            for (int m = 0; m < 16; ++m) trits5(p[m], v + m, 16, 5);
            for (int m = 0; m < 8; ++m) trits5(p[16 + m], v + 80 + m, 8, 5);
            for (int h = 0; h < 2; ++h) trits5(p[24 + h], v + 120 + h, 2, 4);
            break;
        case TYPE_TQ2_0:
            for (int h = 0; h < 2; ++h)
                for (int l = 0; l < 4; ++l)
                    for (int m = 0; m < 32; ++m)
                        v[128 * h + 32 * l + m] = static_cast<int8_t>(((p[32 * h + m] >> (2 * l)) & 3) - 1);
            break;
        case TYPE_Q2_0:
        case TYPE_Q2_0_G128:
        case TYPE_PQ2_0:
            for (int j = 0; j < bi->elems; ++j) v[j] = static_cast<int8_t>(q2_code(p + 2, j) - 1);
            break;
        default:
            break;
    }
    return d;
}

void dequantize_row_cpu(GgmlType type, const uint8_t* row, int64_t cols, float* out) {
    switch (type) {
        case TYPE_F32:
            std::memcpy(out, row, static_cast<size_t>(cols) * sizeof(float));
            return;
        case TYPE_F16:
            for (int64_t k = 0; k < cols; ++k) out[k] = fp16_to_fp32(load_u16(row + 2 * k));
            return;
        case TYPE_BF16:
            for (int64_t k = 0; k < cols; ++k) out[k] = bf16_to_fp32(load_u16(row + 2 * k));
            return;
        default:
            break;
    }
    const BlockInfo* bi = block_info(type);
    int8_t vals[QK_K];
    for (int64_t b = 0; b < cols / bi->elems; ++b) {
        const float d = unpack_block(type, row + b * bi->bytes, vals);
        float* o = out + b * bi->elems;
        for (int j = 0; j < bi->elems; ++j) o[j] = d * static_cast<float>(vals[j]);
    }
}

}  // namespace bonsai::cpu
