// SwiGLU on the CPU: out = silu(gate) * up with silu(g) = g / (1 + exp(-g)).
#include <cmath>

#include "layers_cpu.h"

namespace bonsai::cpu {

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

}  // namespace bonsai::cpu
