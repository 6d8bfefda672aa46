// Per-token INT8 activation quantization for the INT8 matmul (the W1.58A8 scheme).
//
// For each token row x[0..cols): amax = max |x|, s = amax / 127, q = round-half-away(x * (127 /
// amax)) clamped to [-127, 127]; amax 0 gives all zeros (s = 0); a non-finite amax gives s = NaN
// so the output is NaN, as float math would give. Besides q in element order (the scalar kernel)
// it stores asum (sum of q over each weight block) and, for the SIMD kernels, q rearranged into
// the unit slot order of int8_layout.h with zeros in the padding slots.
#pragma once

#include <cstddef>
#include <cstdint>

#include "int8_layout.h"

namespace bonsai::cpu {

struct ActInt8 {
    const Int8Layout* layout;
    int64_t n_tokens;
    int64_t cols;
    int64_t n_blocks;    // weight blocks per row
    int64_t n_units;     // units per row (n_blocks / G rounded up)
    int64_t slot_bytes;  // bytes of slot-ordered activations per token (n_units * C * 64), 0 if none
    float* scale;        // [t_pad], padding is 0
    int8_t* q;           // [n_tokens][cols], element order
    int32_t* asum;       // [n_tokens][n_blocks]
    int64_t t_pad;       // n_tokens rounded up to 16
    int32_t* asum_t;     // [n_blocks][t_pad], asum transposed for the prefill tiles; padding is 0
    int8_t* slots;       // [n_tokens][slot_bytes], 64-byte aligned; nullptr without slots
};

// Bytes of scratch needed by act_int8_setup.
size_t act_int8_bytes(const Int8Layout* layout, int64_t cols, int64_t n_tokens, bool with_slots);

// Carves the arrays out of buf (act_int8_bytes bytes, any alignment) and zeroes the padding.
ActInt8 act_int8_setup(const Int8Layout* layout, int64_t cols, int64_t n_tokens, bool with_slots, void* buf);

// Quantizes token t from x_t[0..cols).
void quantize_act_token(const ActInt8& a, const float* x_t, int64_t t);

}  // namespace bonsai::cpu
