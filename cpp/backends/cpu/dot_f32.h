// A float32 dot product with 16 independent partial sums, so that the compiler vectorizes it
// without reassociating (the gated delta rule's rows: gated_delta.cpp, gated_delta_chunked.cpp).
#pragma once

#include <cstdint>

namespace bonsai::cpu {

inline float dot_f32(const float* a, const float* b, int64_t n) {
    constexpr int kLanes = 16;
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
    }
    float s = 0.0f;
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

}  // namespace bonsai::cpu
