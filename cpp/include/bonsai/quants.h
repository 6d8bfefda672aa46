// Reference quantize / dequantize for every tensor type of types.h, and the scalar fp16 / bf16
// conversions they use.
//
// These are the ground truth the SIMD and CUDA kernels are tested against, and they are bit-exact
// with mainline llama.cpp's and PrismML's reference quantizers: same scale (d = amax, amax/127 or
// signed max / -8), same float32 operation order (x * (1/d), never x / d), same rounding
// (round half away from zero; Q4_0 truncates x*id + 8.5), same element order (quant_blocks.h).
// python/bonsai_runner/quants.py mirrors them in numpy byte for byte.
//
// Conversions (BONSAI_HD, usable from CUDA kernels):
//   fp32 -> fp16: round to nearest even, subnormals kept, overflow -> inf, NaN -> sign | 0x7E00.
//   fp32 -> bf16: round to nearest even on the top 16 bits, NaN -> (bits >> 16) | 64 (quiet).
#pragma once

#include <cstdint>
#include <cstring>

#include "bonsai/quant_blocks.h"
#include "bonsai/types.h"

namespace bonsai {

BONSAI_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
}

BONSAI_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

BONSAI_HD uint16_t fp32_to_fp16(float f) {
    const uint32_t x = float_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;      // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00u;     // >= 65520 rounds to inf (inf included)
    if (a >= 0x38800000u) {                          // >= 2^-14: normal half
        uint32_t r = a - 0x38000000u;                // rebias the exponent from 127 to 15
        r += 0x0fffu + ((r >> 13) & 1u);             // round to nearest even on the 13 dropped bits
        return static_cast<uint16_t>(sign | (r >> 13));
    }
    if (a <= 0x33000000u) return sign;               // <= 2^-25 rounds to (signed) zero
    // Subnormal half: units of 2^-24. The float is m * 2^(e - 150) with the implicit bit in m.
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);  // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;   // may carry into the smallest normal
    return static_cast<uint16_t>(sign | q);
}

BONSAI_HD float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return sign ? -v : v;
    }
    return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

BONSAI_HD uint16_t fp32_to_bf16(float f) {
    const uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

BONSAI_HD float bf16_to_fp32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Quantizes n floats (a multiple of the type's block size) into type_row_bytes(type, n) bytes.
// Throws bonsai::Error for an unknown type, a bad n, a NaN/Inf input (naming the first bad index)
// or values whose scale does not fit the type's fp16 scale.
void quantize_row(GgmlType type, const float* x, void* dst, int64_t n);

// Dequantizes n elements (a multiple of the block size) of `type` from src into y. Any byte
// pattern is accepted (a NaN/Inf scale gives NaN/Inf values, as in llama.cpp).
void dequantize_row(GgmlType type, const void* src, float* y, int64_t n);

}  // namespace bonsai
