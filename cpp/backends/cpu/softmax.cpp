// Numerically stable softmax on the CPU: subtract the maximum, exponentiate, normalise by the sum
// (accumulated in double). Entries equal to -inf get probability 0.
#include <algorithm>
#include <cmath>
#include <limits>

#include "layers_cpu.h"

namespace bonsai::cpu {

void softmax(float* x, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - m);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace bonsai::cpu
