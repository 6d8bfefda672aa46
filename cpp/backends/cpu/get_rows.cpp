// CPU embedding gather: each requested row is dequantized block by block into the output.
#include "block_unpack.h"
#include "matmul.h"

namespace bonsai::cpu {

void get_rows_cpu(const WeightView& w, const int32_t* ids, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i)
        dequantize_row_cpu(w.type, static_cast<const uint8_t*>(w.data) + ids[i] * w.row_bytes, w.cols,
                           out + i * w.cols);
}

}  // namespace bonsai::cpu
