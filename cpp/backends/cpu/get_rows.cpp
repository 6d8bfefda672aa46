// CPU embedding gather: each requested row is dequantized block by block into the output (a
// repacked weight's row is first put back in the file's layout).
#include <vector>

#include "block_unpack.h"
#include "matmul.h"
#include "repack.h"

namespace bonsai::cpu {

void get_rows_cpu(const WeightView& w, const int32_t* ids, int64_t n, float* out) {
    std::vector<uint8_t> row(is_repacked(w.type) ? w.row_bytes : 0);
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t* r = static_cast<const uint8_t*>(w.data) + ids[i] * w.row_bytes;
        if (!row.empty()) {
            unpack_rows(w, ids[i], ids[i] + 1, row.data());
            r = row.data();
        }
        dequantize_row_cpu(file_type(w.type), r, w.cols, out + i * w.cols);
    }
}

}  // namespace bonsai::cpu
