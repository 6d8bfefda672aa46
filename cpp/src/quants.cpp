// Reference quantizers and dequantizers (scalar C++, bit-exact with llama.cpp / PrismML).
//
// Per block of a quantized type (id = d ? 1/d : 0):
//   Q8_0     d = amax / 127   q = roundf(x * id)
//   Q4_0     d = max / -8     q = min(15, trunc(x * id + 8.5f)), max: the signed value of
//                             largest |x|, the first one on ties
//   TQ1_0, TQ2_0, Q2_0, Q2_0_G128, PQ2_0, PTQ1_0
//            d = amax         q = lroundf(x * id) + 1 (0..2 ternary, clamped to 0..3 for Q2)
// with every operation in float32 in that order, so numpy (quants.py) reproduces the bytes.
// d is stored as fp16; the codes are computed from the float32 d, as llama.cpp does.
//
// Inputs that llama.cpp leaves undefined are pinned down here (and identically in quants.py):
// a float32 scale so small that 1/d overflows makes x * id infinite or NaN (0 * inf); NaN counts
// as 0 and the product is clamped to the code range before rounding. For finite id the clamp
// never changes a code.
#include "bonsai/quants.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>

#include "bonsai/error.h"

namespace bonsai {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error(msg); }

const TypeTraits& checked_traits(GgmlType type, int64_t n, const char* action) {
    const TypeTraits* t = type_traits(type);
    if (!t) fail(std::string("cannot ") + action + " tensor type id " + std::to_string(type) +
                 ": the engine does not know this type");
    if (n < 0 || n % t->block_size != 0) {
        std::ostringstream os;
        os << "cannot " << action << " " << n << " elements as " << t->name
           << ": the count must be a multiple of the " << t->name << " block size "
           << t->block_size << " (pad the row or pick a type with a smaller block)";
        fail(os.str());
    }
    return *t;
}

void check_finite(const TypeTraits& t, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) {
            std::ostringstream os;
            os << "cannot quantize to " << t.name << ": element " << i << " is "
               << (std::isnan(x[i]) ? "NaN" : (x[i] > 0 ? "+Inf" : "-Inf"))
               << " (first non-finite value); the tensor must hold finite values only";
            fail(os.str());
        }
    }
}

// fp16 bits of the block scale d, or an error when d does not fit fp16.
uint16_t checked_scale(const TypeTraits& t, float d, float amax, int64_t block) {
    const uint16_t h = fp32_to_fp16(d);
    if ((h & 0x7fffu) == 0x7c00u) {
        std::ostringstream os;
        os << "values too large for " << t.name << ": block " << block << " (elements "
           << block * t.block_size << ".." << (block + 1) * t.block_size - 1 << ") has max |x| = "
           << amax << ", giving scale " << d << ", which overflows the fp16 scale (max 65504); "
           << "store this tensor as F32 or BF16 instead";
        fail(os.str());
    }
    return h;
}

float abs_max(const float* x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    return amax;
}

// lroundf(v) clamped to [lo, hi] (NaN -> 0), see the file comment.
int round_code(float v, float lo, float hi) {
    if (std::isnan(v)) v = 0.0f;
    v = v < lo ? lo : (v > hi ? hi : v);
    return static_cast<int>(std::lround(v));
}

void quantize_f16(const TypeTraits& t, const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = fp32_to_fp16(x[i]);
        if ((y[i] & 0x7fffu) == 0x7c00u) {
            std::ostringstream os;
            os << "value " << x[i] << " at element " << i << " is too large for " << t.name
               << " (max 65504); store this tensor as F32 or BF16 instead";
            fail(os.str());
        }
    }
}

void quantize_bf16(const TypeTraits& t, const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = fp32_to_bf16(x[i]);
        if ((y[i] & 0x7fffu) == 0x7f80u) {
            std::ostringstream os;
            os << "value " << x[i] << " at element " << i << " is too large for " << t.name
               << " (it rounds to infinity); store this tensor as F32 instead";
            fail(os.str());
        }
    }
}

void quantize_q8_0(const TypeTraits& t, const float* x, block_q8_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
        const float amax = abs_max(x, QK8_0);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = checked_scale(t, d, amax, i);
        for (int j = 0; j < QK8_0; ++j)
            y[i].qs[j] = static_cast<int8_t>(round_code(x[j] * id, -127.0f, 127.0f));
    }
}

void quantize_q4_0(const TypeTraits& t, const float* x, block_q4_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; ++j) {
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = checked_scale(t, d, amax, i);
        uint8_t q[QK4_0];
        for (int j = 0; j < QK4_0; ++j) {
            float v = x[j] * id;
            if (std::isnan(v)) v = 0.0f;
            v = v < -8.0f ? -8.0f : (v > 8.0f ? 8.0f : v);
            // v + 8.5f rounded once to float32. Going through double keeps the compiler from
            // fusing the multiply above into an FMA, which would round differently from numpy.
            const float s = static_cast<float>(static_cast<double>(v) + 8.5);
            const int c = static_cast<int>(s);  // truncation toward zero, s >= 0
            q[j] = static_cast<uint8_t>(c < 15 ? c : 15);
        }
        for (int j = 0; j < QK4_0 / 2; ++j) y[i].qs[j] = q[j] | (q[j + QK4_0 / 2] << 4);
    }
}

// Ternary codes 0..2 (or 0..3 with hi = 2) of one block, and its fp16 scale.
uint16_t ternary_codes(const TypeTraits& t, const float* x, int bs, float hi, int64_t block,
                       int* codes) {
    const float amax = abs_max(x, bs);
    const float d = amax;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = checked_scale(t, d, amax, block);
    for (int j = 0; j < bs; ++j) codes[j] = round_code(x[j] * id, -1.0f, hi) + 1;
    return h;
}

// n_bytes base-3 bytes, byte m holding codes[m + n_bytes * k] as trit k (k < 5, or k < 4 when
// four), the first trit most significant.
void pack_trit_bytes(const int* codes, int n_bytes, bool four, uint8_t* out) {
    for (int m = 0; m < n_bytes; ++m) {
        int t[5];
        for (int k = 0; k < (four ? 4 : 5); ++k) t[k] = codes[m + n_bytes * k];
        out[m] = four ? pack_trits4(t) : pack_trits5(t);
    }
}

void quantize_tq1_0(const TypeTraits& t, const float* x, block_tq1_0* y, int64_t nb) {
    int c[QK_K];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        y[i].d = ternary_codes(t, x, QK_K, 1.0f, i, c);
        pack_trit_bytes(c, 32, false, y[i].qs);             // elements 0..159
        pack_trit_bytes(c + 160, 16, false, y[i].qs + 32);  // elements 160..239
        pack_trit_bytes(c + 240, 4, true, y[i].qh);         // elements 240..255
    }
}

void quantize_ptq1_0(const TypeTraits& t, const float* x, block_ptq1_0* y, int64_t nb) {
    int c[QK_PTQ1_0];
    for (int64_t i = 0; i < nb; ++i, x += QK_PTQ1_0) {
        y[i].d = ternary_codes(t, x, QK_PTQ1_0, 1.0f, i, c);
        pack_trit_bytes(c, 16, false, y[i].qs);            // elements 0..79
        pack_trit_bytes(c + 80, 8, false, y[i].qs + 16);   // elements 80..119
        pack_trit_bytes(c + 120, 2, true, y[i].qh);        // elements 120..127
    }
}

void quantize_tq2_0(const TypeTraits& t, const float* x, block_tq2_0* y, int64_t nb) {
    int c[QK_K];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        y[i].d = ternary_codes(t, x, QK_K, 1.0f, i, c);
        std::memset(y[i].qs, 0, sizeof y[i].qs);
        for (int j = 0; j < QK_K; ++j) {
            const int h = j >> 7, l = (j >> 5) & 3, m = j & 31;
            y[i].qs[32 * h + m] |= static_cast<uint8_t>(c[j] << (2 * l));
        }
    }
}

// Q2_0, Q2_0_G128 and PQ2_0: fp16 d first, then bs/4 bytes of 2-bit codes (element j at bits
// 2*(j%4) of byte j/4); codes are clamped to 0..3, so +2 is representable.
void quantize_q2(const TypeTraits& t, const float* x, uint8_t* y, int64_t nb) {
    const int bs = t.block_size;
    int c[QK_PQ2_0];
    for (int64_t i = 0; i < nb; ++i, x += bs, y += t.type_size) {
        const uint16_t h = ternary_codes(t, x, bs, 2.0f, i, c);
        std::memcpy(y, &h, sizeof h);
        uint8_t* qs = y + sizeof h;
        std::memset(qs, 0, bs / 4);
        for (int j = 0; j < bs; ++j) qs[j >> 2] |= static_cast<uint8_t>(c[j] << (2 * (j & 3)));
    }
}

}  // namespace

void quantize_row(GgmlType type, const float* x, void* dst, int64_t n) {
    const TypeTraits& t = checked_traits(type, n, "quantize");
    check_finite(t, x, n);
    const int64_t nb = n / t.block_size;
    switch (type) {
        case TYPE_F32: std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float)); return;
        case TYPE_F16: quantize_f16(t, x, static_cast<uint16_t*>(dst), n); return;
        case TYPE_BF16: quantize_bf16(t, x, static_cast<uint16_t*>(dst), n); return;
        case TYPE_Q8_0: quantize_q8_0(t, x, static_cast<block_q8_0*>(dst), nb); return;
        case TYPE_Q4_0: quantize_q4_0(t, x, static_cast<block_q4_0*>(dst), nb); return;
        case TYPE_TQ1_0: quantize_tq1_0(t, x, static_cast<block_tq1_0*>(dst), nb); return;
        case TYPE_TQ2_0: quantize_tq2_0(t, x, static_cast<block_tq2_0*>(dst), nb); return;
        case TYPE_PTQ1_0: quantize_ptq1_0(t, x, static_cast<block_ptq1_0*>(dst), nb); return;
        case TYPE_Q2_0:
        case TYPE_Q2_0_G128:
        case TYPE_PQ2_0: quantize_q2(t, x, static_cast<uint8_t*>(dst), nb); return;
        case TYPE_PTQ1_0_R16:
        case TYPE_PTQ1_0_R16L:
        case TYPE_Q8_0_R4: break;  // in-memory orders of the CPU backend, never written
    }
    fail(std::string("quantize_row: no quantizer for ") + t.name);
}

void dequantize_row(GgmlType type, const void* src, float* y, int64_t n) {
    const TypeTraits& t = checked_traits(type, n, "dequantize");
    const int64_t nb = n / t.block_size;
    switch (type) {
        case TYPE_F32: std::memcpy(y, src, static_cast<size_t>(n) * sizeof(float)); return;
        case TYPE_F16: {
            const auto* h = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(h[i]);
            return;
        }
        case TYPE_BF16: {
            const auto* h = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(h[i]);
            return;
        }
        case TYPE_Q8_0: {
            const auto* b = static_cast<const block_q8_0*>(src);
            for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
                const float d = fp16_to_fp32(b[i].d);
                for (int j = 0; j < QK8_0; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
            }
            return;
        }
        case TYPE_Q4_0: {
            const auto* b = static_cast<const block_q4_0*>(src);
            for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
                const float d = fp16_to_fp32(b[i].d);
                for (int j = 0; j < QK4_0 / 2; ++j) {
                    y[j] = static_cast<float>((b[i].qs[j] & 15) - 8) * d;
                    y[j + QK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
                }
            }
            return;
        }
        case TYPE_TQ1_0: {
            const auto* b = static_cast<const block_tq1_0*>(src);
            for (int64_t i = 0; i < nb; ++i, y += QK_K) {
                const float d = fp16_to_fp32(b[i].d);
                for (int j = 0; j < QK_K; ++j) y[j] = static_cast<float>(tq1_0_trit(b[i], j)) * d;
            }
            return;
        }
        case TYPE_TQ2_0: {
            const auto* b = static_cast<const block_tq2_0*>(src);
            for (int64_t i = 0; i < nb; ++i, y += QK_K) {
                const float d = fp16_to_fp32(b[i].d);
                for (int j = 0; j < QK_K; ++j)
                    y[j] = static_cast<float>(tq2_0_code(b[i], j) - 1) * d;
            }
            return;
        }
        case TYPE_PTQ1_0: {
            const auto* b = static_cast<const block_ptq1_0*>(src);
            for (int64_t i = 0; i < nb; ++i, y += QK_PTQ1_0) {
                const float d = fp16_to_fp32(b[i].d);
                for (int j = 0; j < QK_PTQ1_0; ++j)
                    y[j] = static_cast<float>(ptq1_0_trit(b[i], j)) * d;
            }
            return;
        }
        case TYPE_Q2_0:
        case TYPE_Q2_0_G128:
        case TYPE_PQ2_0: {
            const auto* p = static_cast<const uint8_t*>(src);
            const int bs = t.block_size;
            for (int64_t i = 0; i < nb; ++i, y += bs, p += t.type_size) {
                uint16_t h;
                std::memcpy(&h, p, sizeof h);
                const float d = fp16_to_fp32(h);
                for (int j = 0; j < bs; ++j)
                    y[j] = static_cast<float>(q2_code(p + sizeof h, j) - 1) * d;
            }
            return;
        }
        case TYPE_PTQ1_0_R16:
        case TYPE_PTQ1_0_R16L:
        case TYPE_Q8_0_R4: break;  // the CPU backend's own orders (cpu::get_rows_cpu reads them)
    }
    fail(std::string("dequantize_row: no dequantizer for ") + t.name);
}

}  // namespace bonsai
