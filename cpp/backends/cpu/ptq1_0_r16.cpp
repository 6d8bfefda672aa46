// Byte reordering and re-coding (qh bytes to 2-bit fields, for R16L qs bytes to the R16 code)
// between PTQ1_0 rows and the R16 / R16L tiles of ptq1_0_r16.h.
#include "ptq1_0_r16.h"

#include <cstring>

#include "bonsai/quant_blocks.h"

namespace bonsai::cpu {

namespace {

constexpr int kBlock = static_cast<int>(sizeof(block_ptq1_0));  // 28: qs[24], qh[2], d

// The two qh codings of four trits: fields[b] = the 2-bit fields of base-3 byte b, base3[f] = the
// canonical base-3 byte (pack_trits4) of fields f (a field 3, never written, reads as 0).
struct QhCodes {
    uint8_t fields[256], base3[256];
    QhCodes() {
        for (int b = 0; b < 256; ++b) {
            int f = 0;
            for (int t = 0; t < 4; ++t) f |= trit_of(static_cast<uint8_t>(b), t) << (2 * t);
            fields[b] = static_cast<uint8_t>(f);
            int t[4];
            for (int i = 0; i < 4; ++i) t[i] = (b >> (2 * i) & 3) < 3 ? b >> (2 * i) & 3 : 0;
            base3[b] = pack_trits4(t);
        }
    }
};
const QhCodes kQh;

// The qs codings: code[b] = the R16 code of file byte b, byte[c] = the canonical file byte of code
// c's trits (codes the packer never writes: 0).
struct QsCodes {
    uint8_t code[256], byte[256];
    QsCodes() {
        for (int c = 0; c < 256; ++c) byte[c] = 0;
        for (int b = 0; b < 256; ++b) {
            int t[5];
            for (int n = 0; n < 5; ++n) t[n] = trit_of(static_cast<uint8_t>(b), n);
            const int a = 3 * t[0] + t[1], g = 9 * t[2] + 3 * t[3] + t[4];
            code[b] = static_cast<uint8_t>(64 * (g / 7) + 7 * a + g % 7);
            byte[code[b]] = pack_trits5(t);
        }
    }
};
const QsCodes kQs;

R16QsTables make_qs_tables() {
    R16QsTables t{};
    for (int l = 0; l < 63; ++l) {
        t.t0[l] = static_cast<uint8_t>(l / 7 / 3);
        t.t1[l] = static_cast<uint8_t>(l / 7 % 3);
        t.key[l] = static_cast<uint8_t>((l % 7) ^ (l >> 2));
    }
    for (int idx = 0; idx < 64; ++idx) {
        const int i = idx & 15, g = 7 * (idx >> 4) + i;
        if (i >= 7 || g >= 27) continue;
        t.t2[idx] = static_cast<uint8_t>(g / 9);
        t.t3[idx] = static_cast<uint8_t>(g / 3 % 3);
        t.t4[idx] = static_cast<uint8_t>(g % 3);
    }
    return t;
}

}  // namespace

const R16QsTables kR16Qs = make_qs_tables();

uint8_t r16_qs_code(uint8_t file_byte) { return kQs.code[file_byte]; }
uint8_t r16_qs_byte(uint8_t code) { return kQs.byte[code]; }

void pack_ptq1_0_r16_tile(const uint8_t* src, uint8_t* dst, int n, int64_t n_blocks, bool code) {
    const int64_t bb = static_cast<int64_t>(kBlock) * n;  // bytes of a block of the tile
    for (int r = 0; r < n; ++r)
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* s = src + (r * n_blocks + b) * kBlock;
            uint8_t* d = dst + b * bb + 4 * r;
            for (int k = 0; k < 6; ++k) {
                if (!code) std::memcpy(d + 4 * n * k, s + 4 * k, 4);
                else for (int i = 0; i < 4; ++i) d[4 * n * k + i] = kQs.code[s[4 * k + i]];
            }
            const uint8_t tail[4] = {kQh.fields[s[24]], kQh.fields[s[25]], s[26], s[27]};
            std::memcpy(d + 4 * n * 6, tail, 4);
        }
}

void unpack_ptq1_0_r16_tile(const uint8_t* src, uint8_t* dst, int n, int64_t n_blocks, bool code) {
    const int64_t bb = static_cast<int64_t>(kBlock) * n;
    for (int r = 0; r < n; ++r)
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* s = src + b * bb + 4 * r;
            uint8_t* d = dst + (r * n_blocks + b) * kBlock;
            for (int k = 0; k < 6; ++k) {
                if (!code) std::memcpy(d + 4 * k, s + 4 * n * k, 4);
                else for (int i = 0; i < 4; ++i) d[4 * k + i] = kQs.byte[s[4 * n * k + i]];
            }
            const uint8_t* tail = s + 4 * n * 6;
            d[24] = kQh.base3[tail[0]];
            d[25] = kQh.base3[tail[1]];
            d[26] = tail[2];
            d[27] = tail[3];
        }
}

}  // namespace bonsai::cpu
