// Per-token absmax INT8 activation quantization (see act_quant.h), shared by every kernel path so
// that they see the same int8 activations. The AVX2 variant (used whenever the CPU has AVX2)
// performs exactly the scalar operations (one multiply, truncation, exact remainder, clamp), so
// it yields the same q; rounding is half away from zero.
#include "act_quant.h"

#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cpu_features.h"

namespace bonsai::cpu {

namespace {

constexpr size_t kAlign = 64;

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Sizes {
    int64_t n_blocks, n_units, slot_bytes, t_pad;
    size_t scale, q, asum, asum_t, slots;
};

Sizes sizes_of(const Int8Layout* l, int64_t cols, int64_t n_tokens, bool with_slots) {
    Sizes s;
    s.n_blocks = cols / l->block_elems;
    if (l->rest) {  // full units, then the rest's units
        const int64_t full = s.n_blocks / l->G, rest = (s.n_blocks - full * l->G + l->rest->G - 1) / l->rest->G;
        s.n_units = full + rest;
        s.slot_bytes = with_slots ? (full * l->C + rest * l->rest->C) * 64 : 0;
    } else {
        s.n_units = (s.n_blocks + l->G - 1) / l->G;
        s.slot_bytes = with_slots ? s.n_units * l->C * 64 : 0;
    }
    s.t_pad = (n_tokens + 15) / 16 * 16;
    s.scale = round_up(sizeof(float) * s.t_pad);
    s.q = round_up(static_cast<size_t>(cols * n_tokens));
    s.asum = round_up(sizeof(int32_t) * s.n_blocks * n_tokens);
    s.asum_t = round_up(sizeof(int32_t) * s.n_blocks * s.t_pad);
    s.slots = static_cast<size_t>(s.slot_bytes * n_tokens);
    return s;
}

}  // namespace

size_t act_int8_bytes(const Int8Layout* layout, int64_t cols, int64_t n_tokens, bool with_slots) {
    const Sizes s = sizes_of(layout, cols, n_tokens, with_slots);
    return kAlign + s.scale + s.q + s.asum + s.asum_t + s.slots;
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
    a.t_pad = s.t_pad;
    a.asum_t = reinterpret_cast<int32_t*>(p);
    p += s.asum_t;
    for (int64_t t = n_tokens; t < s.t_pad; ++t) {
        a.scale[t] = 0.0f;
        for (int64_t b = 0; b < s.n_blocks; ++b) a.asum_t[b * s.t_pad + t] = 0;
    }
    a.slots = with_slots ? reinterpret_cast<int8_t*>(p) : nullptr;
    return a;
}

namespace {

// Round half away from zero of v (|v| <= 2^23): trunc, then one step away from zero when the
// exact remainder reaches one half. The same operations in every variant give the same q.
inline float round_half_away(float v) {
    const float t = std::trunc(v);
    const float f = v - t;
    return t + static_cast<float>(f >= 0.5f) - static_cast<float>(f <= -0.5f);
}

// Returns amax, or infinity when some value is not finite.
float absmax_scalar(const float* x, int64_t n) {
    float amax = 0.0f;
    for (int64_t k = 0; k < n; ++k) {
        const float a = std::fabs(x[k]);
        if (!(a <= std::numeric_limits<float>::max())) return std::numeric_limits<float>::infinity();
        amax = a > amax ? a : amax;
    }
    return amax;
}

void quantize_scalar(const float* x, int64_t n, float iscale, int8_t* q) {
    for (int64_t k = 0; k < n; ++k) {
        const float v = round_half_away(x[k] * iscale);
        q[k] = static_cast<int8_t>(v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v));
    }
}

#if defined(__x86_64__) || defined(__i386__)
#define BONSAI_ACT_AVX2 __attribute__((target("avx2,fma")))

BONSAI_ACT_AVX2 float absmax_avx2(const float* x, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(std::numeric_limits<float>::max());
    __m256 m = _mm256_setzero_ps();
    __m256 bad = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));  // NaN or infinity
        m = _mm256_max_ps(m, a);
    }
    if (_mm256_movemask_ps(bad)) return std::numeric_limits<float>::infinity();
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float amax = 0.0f;
    for (float v : lanes) amax = v > amax ? v : amax;
    const float tail = absmax_scalar(x + k, n - k);
    return tail > amax ? tail : amax;
}

BONSAI_ACT_AVX2 void quantize_avx2(const float* x, int64_t n, float iscale, int8_t* q) {
    const __m256 s = _mm256_set1_ps(iscale), half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f);
    const __m256 one = _mm256_set1_ps(1.0f), lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + k), s);
        const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 f = _mm256_sub_ps(v, t);
        __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, half, _CMP_GE_OQ), one));
        r = _mm256_sub_ps(r, _mm256_and_ps(_mm256_cmp_ps(f, mhalf, _CMP_LE_OQ), one));
        r = _mm256_min_ps(_mm256_max_ps(r, nlim), lim);
        const __m256i i32 = _mm256_cvtps_epi32(r);
        const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), _mm_packs_epi16(i16, i16));
    }
    quantize_scalar(x + k, n - k, iscale, q + k);
}
#endif

#if defined(__x86_64__) || defined(__i386__)
// Whole units of a layout with a gather plan (int8_layout.h): one dword gather and one mask per
// 16 dwords of slots. A dword may start up to 3 elements before a unit or end up to 3 after it:
// those bytes are masked off, and they lie inside the activation buffer (q follows the scales and
// is followed by the block sums, act_int8_setup).
__attribute__((target("avx512f,avx512bw"))) void gather_units(const Int8Layout* l, const int8_t* q, int64_t n_units,
                                                                int8_t* dst) {
    const int64_t unit_elems = static_cast<int64_t>(l->G) * l->block_elems;
    for (int64_t u = 0; u < n_units; ++u) {
        const int8_t* qu = q + u * unit_elems;
        int8_t* d = dst + u * l->C * 64;
        for (int v = 0; v < l->C; ++v) {
            const __m512i idx = _mm512_loadu_si512(l->gather_idx + 16 * v);
            const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xFFFF, idx, qu, 1);
            _mm512_storeu_si512(d + 64 * v, _mm512_and_si512(g, _mm512_loadu_si512(l->gather_mask + 64 * v)));
        }
    }
}
#endif

// q[0..cols) in the slot order of layout l at dst: whole units, then a last partial one (its
// missing elements read as zeros).
void write_slots(const Int8Layout* l, const int8_t* q, int64_t cols, int8_t* dst) {
    const int64_t unit_elems = static_cast<int64_t>(l->G) * l->block_elems;
    const int n_slots = l->C * 64;
    const int64_t n_units = (cols / l->block_elems + l->G - 1) / l->G;
    const int64_t full_units = cols / unit_elems;  // units whose blocks all exist
    int64_t u = 0;
#if defined(__x86_64__) || defined(__i386__)
    if (l->gather_idx && cpu_has_avx512()) {
        gather_units(l, q, full_units, dst);
        u = full_units;
    }
#endif
    for (; u < n_units; ++u) {
        const int8_t* qu = q + u * unit_elems;
        int8_t* d = dst + u * n_slots;
        if (u < full_units) {
            for (int s = 0; s < n_slots; ++s) {
                const int e = l->slot_map[s];
                d[s] = e >= 0 ? qu[e] : 0;
            }
        } else {
            const int64_t left = cols - u * unit_elems;
            for (int s = 0; s < n_slots; ++s) {
                const int e = l->slot_map[s];
                d[s] = (e >= 0 && e < left) ? qu[e] : 0;
            }
        }
    }
}

}  // namespace

void quantize_act_token(const ActInt8& a, const float* x, int64_t t) {
    const int64_t cols = a.cols;
    int8_t* q = a.q + t * cols;
#if defined(__x86_64__) || defined(__i386__)
    const bool simd = cpu_has_avx2();
#else
    const bool simd = false;
#endif
    const float amax =
#if defined(__x86_64__) || defined(__i386__)
        simd ? absmax_avx2(x, cols) :
#endif
             absmax_scalar(x, cols);
    if (!(amax <= std::numeric_limits<float>::max())) {
        a.scale[t] = std::numeric_limits<float>::quiet_NaN();
        std::memset(q, 0, static_cast<size_t>(cols));
    } else if (amax == 0.0f) {
        a.scale[t] = 0.0f;
        std::memset(q, 0, static_cast<size_t>(cols));
    } else {
        a.scale[t] = amax / 127.0f;
        const float iscale = 127.0f / amax;
#if defined(__x86_64__) || defined(__i386__)
        if (simd)
            quantize_avx2(x, cols, iscale, q);
        else
#endif
            quantize_scalar(x, cols, iscale, q);
    }
    const Int8Layout* l = a.layout;
    int32_t* asum = a.asum + t * a.n_blocks;
    for (int64_t b = 0; b < a.n_blocks; ++b) {
        int32_t s = 0;
        const int8_t* qb = q + b * l->block_elems;
        for (int j = 0; j < l->block_elems; ++j) s += qb[j];
        asum[b] = s;
        a.asum_t[b * a.t_pad + t] = s;
    }
    if (!a.slots) return;
    int8_t* dst = a.slots + t * a.slot_bytes;
    if (l->rest) {  // whole units of l, then the rest of the row in the units of l->rest
        const int64_t main_cols = a.n_blocks / l->G * l->G * l->block_elems;
        write_slots(l, q, main_cols, dst);
        write_slots(l->rest, q + main_cols, cols - main_cols, dst + main_cols / (l->G * l->block_elems) * l->C * 64);
    } else {
        write_slots(l, q, cols, dst);
    }
}

}  // namespace bonsai::cpu
