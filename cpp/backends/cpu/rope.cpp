// Rotary position embedding on the CPU.
//
// Pair i (0 <= i < n_rot/2) of a head is rotated by theta_i(p) = p * freq_scale *
// base^(-2i/n_rot) / freq_factors[i]. NORMAL mode pairs adjacent elements (x[2i], x[2i+1]) — the
// llama layout after the converter's q/k permutation; NEOX mode pairs the two halves
// (x[i], x[i + n_rot/2]) — the Hugging Face rotate_half layout used by qwen2/qwen3. Dimensions
// at and beyond n_rot pass through. The cos/sin table is built once per batch (in double) and
// shared by every head and layer.
#include <cmath>

#include "../../src/layers.h"
#include "layers_cpu.h"

namespace bonsai::cpu {

void rope_table(const int32_t* pos, int64_t n_tokens, const RopeParams& p, float* cos_sin) {
    const int64_t half = p.n_rot / 2;
    for (int64_t t = 0; t < n_tokens; ++t) {
        float* cs = cos_sin + t * p.n_rot;
        for (int64_t i = 0; i < half; ++i) {
            double theta = static_cast<double>(pos[t]) * p.freq_scale *
                           std::pow(static_cast<double>(p.theta_base),
                                    -2.0 * static_cast<double>(i) / static_cast<double>(p.n_rot));
            if (p.freq_factors) theta /= p.freq_factors[i];
            cs[2 * i] = static_cast<float>(std::cos(theta));
            cs[2 * i + 1] = static_cast<float>(std::sin(theta));
        }
    }
}

void rope_head(float* x, const RopeParams& p, const float* cs) {
    const int64_t half = p.n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        float* a;
        float* b;
        if (p.type == RopeType::NORMAL) {
            a = x + 2 * i;
            b = x + 2 * i + 1;
        } else {
            a = x + i;
            b = x + i + half;
        }
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
    }
}

}  // namespace bonsai::cpu
