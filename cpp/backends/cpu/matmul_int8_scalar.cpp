// Scalar INT8 matmul: the reference the SIMD paths must match bit for bit.
//
// Per row, every block is unpacked once to signed integer weights in element order (block_unpack),
// then for each token: isum_b = sum_j w_j * q_j (exact int32), acc = fma(d_b, isum_b, acc) over the
// blocks in order starting from 0, y = acc * s_token.
#include <cmath>

#include "block_unpack.h"
#include "matmul_kernels.h"

namespace bonsai::cpu {

void matmul_int8_scalar(const WeightView& w, const ActInt8& a, int64_t r0, int64_t r1, float* y, void* scratch) {
    const Int8Layout* l = a.layout;
    const int64_t cols = a.cols, nb = a.n_blocks;
    int8_t* vals = static_cast<int8_t*>(scratch);
    float* dsc = reinterpret_cast<float*>(vals + (cols + 63) / 64 * 64);
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
        for (int64_t b = 0; b < nb; ++b)
            dsc[b] = unpack_block(w.type, row + b * l->block_bytes, vals + b * l->block_elems);
        for (int64_t t = 0; t < a.n_tokens; ++t) {
            const int8_t* q = a.q + t * cols;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const int8_t* wv = vals + b * l->block_elems;
                const int8_t* qv = q + b * l->block_elems;
                int32_t isum = 0;
                for (int j = 0; j < l->block_elems; ++j) isum += static_cast<int32_t>(wv[j]) * qv[j];
                acc = std::fma(dsc[b], static_cast<float>(isum), acc);
            }
            y[t * w.rows + r] = acc * a.scale[t];
        }
    }
}

}  // namespace bonsai::cpu
