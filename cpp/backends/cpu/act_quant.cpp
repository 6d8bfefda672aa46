// Per-token absmax INT8 activation quantization (see act_quant.h). Plain scalar code shared by every
// kernel path: it is O(cols) per token against O(rows * cols) for the matmul, and sharing it is
// what keeps the paths bit-identical.
#include "act_quant.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace bonsai::cpu {

namespace {

constexpr size_t kAlign = 64;

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Sizes {
    int64_t n_blocks, n_units, slot_bytes;
    size_t scale, q, asum, slots;
};

Sizes sizes_of(const Int8Layout* l, int64_t cols, int64_t n_tokens, bool with_slots) {
    Sizes s;
    s.n_blocks = cols / l->block_elems;
    s.n_units = (s.n_blocks + l->G - 1) / l->G;
    s.slot_bytes = with_slots ? s.n_units * l->C * 64 : 0;
    s.scale = round_up(sizeof(float) * n_tokens);
    s.q = round_up(static_cast<size_t>(cols * n_tokens));
    s.asum = round_up(sizeof(int32_t) * s.n_blocks * n_tokens);
    s.slots = static_cast<size_t>(s.slot_bytes * n_tokens);
    return s;
}

}  // namespace

size_t act_int8_bytes(const Int8Layout* layout, int64_t cols, int64_t n_tokens, bool with_slots) {
    const Sizes s = sizes_of(layout, cols, n_tokens, with_slots);
    return kAlign + s.scale + s.q + s.asum + s.slots;
}

ActInt8 act_int8_setup(const Int8Layout* layout, int64_t cols, int64_t n_tokens, bool with_slots, void* buf) {
    const Sizes s = sizes_of(layout, cols, n_tokens, with_slots);
    uintptr_t p = (reinterpret_cast<uintptr_t>(buf) + kAlign - 1) / kAlign * kAlign;
    ActInt8 a;
    a.layout = layout;
    a.n_tokens = n_tokens;
    a.cols = cols;
    a.n_blocks = s.n_blocks;
    a.n_units = s.n_units;
    a.slot_bytes = s.slot_bytes;
    a.scale = reinterpret_cast<float*>(p);
    p += s.scale;
    a.q = reinterpret_cast<int8_t*>(p);
    p += s.q;
    a.asum = reinterpret_cast<int32_t*>(p);
    p += s.asum;
    a.slots = with_slots ? reinterpret_cast<int8_t*>(p) : nullptr;
    return a;
}

void quantize_act_token(const ActInt8& a, const float* x, int64_t t) {
    const int64_t cols = a.cols;
    int8_t* q = a.q + t * cols;
    float amax = 0.0f;
    for (int64_t k = 0; k < cols; ++k) amax = std::fmax(amax, std::fabs(x[k]));
    if (!std::isfinite(amax)) {
        a.scale[t] = std::numeric_limits<float>::quiet_NaN();
        std::memset(q, 0, static_cast<size_t>(cols));
    } else if (amax == 0.0f) {
        a.scale[t] = 0.0f;
        std::memset(q, 0, static_cast<size_t>(cols));
    } else {
        a.scale[t] = amax / 127.0f;
        const float iscale = 127.0f / amax;
        for (int64_t k = 0; k < cols; ++k) {
            float v = std::round(x[k] * iscale);
            v = std::fmin(127.0f, std::fmax(-127.0f, v));
            q[k] = static_cast<int8_t>(v);
        }
    }
    const Int8Layout* l = a.layout;
    int32_t* asum = a.asum + t * a.n_blocks;
    for (int64_t b = 0; b < a.n_blocks; ++b) {
        int32_t s = 0;
        const int8_t* qb = q + b * l->block_elems;
        for (int j = 0; j < l->block_elems; ++j) s += qb[j];
        asum[b] = s;
    }
    if (!a.slots) return;
    int8_t* dst = a.slots + t * a.slot_bytes;
    const int64_t unit_elems = static_cast<int64_t>(l->G) * l->block_elems;
    const int n_slots = l->C * 64;
    for (int64_t u = 0; u < a.n_units; ++u) {
        const int64_t base = u * unit_elems;
        int8_t* d = dst + u * n_slots;
        for (int s = 0; s < n_slots; ++s) {
            const int e = l->slot_map[s];
            d[s] = (e >= 0 && base + e < cols) ? q[base + e] : 0;
        }
    }
}

}  // namespace bonsai::cpu
