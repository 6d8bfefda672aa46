// Byte reordering (and the qh trits' re-coding) between PTQ1_0 rows and the R16 tiles of ptq1_0_r16.h.
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

}  // namespace

void pack_ptq1_0_r16_tile(const uint8_t* src, uint8_t* dst, int n, int64_t n_blocks) {
    const int64_t bb = static_cast<int64_t>(kBlock) * n;  // bytes of a block of the tile
    for (int r = 0; r < n; ++r)
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* s = src + (r * n_blocks + b) * kBlock;
            uint8_t* d = dst + b * bb + 4 * r;
            for (int k = 0; k < 6; ++k) std::memcpy(d + 4 * n * k, s + 4 * k, 4);
            const uint8_t tail[4] = {kQh.fields[s[24]], kQh.fields[s[25]], s[26], s[27]};
            std::memcpy(d + 4 * n * 6, tail, 4);
        }
}

void unpack_ptq1_0_r16_tile(const uint8_t* src, uint8_t* dst, int n, int64_t n_blocks) {
    const int64_t bb = static_cast<int64_t>(kBlock) * n;
    for (int r = 0; r < n; ++r)
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* s = src + b * bb + 4 * r;
            uint8_t* d = dst + (r * n_blocks + b) * kBlock;
            for (int k = 0; k < 6; ++k) std::memcpy(d + 4 * k, s + 4 * n * k, 4);
            const uint8_t* tail = s + 4 * n * 6;
            d[24] = kQh.base3[tail[0]];
            d[25] = kQh.base3[tail[1]];
            d[26] = tail[2];
            d[27] = tail[3];
        }
}

}  // namespace bonsai::cpu
