// RMSNorm on the CPU: y = x * w / sqrt(mean(x^2) + eps). The sum of squares is accumulated in
// double so that long rows (hidden 5120+) keep full float precision.
#include <cmath>

#include "layers_cpu.h"

namespace bonsai::cpu {

void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

}  // namespace bonsai::cpu
