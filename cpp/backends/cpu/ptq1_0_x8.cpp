// Byte reordering (and the qh trits' re-coding) between PTQ1_0 rows and the X8 groups of ptq1_0_x8.h.
#include "ptq1_0_x8.h"

#include <cstring>

#include "bonsai/quant_blocks.h"

namespace bonsai::cpu {

namespace {

constexpr int kBlock = static_cast<int>(sizeof(block_ptq1_0));  // 28: qs[24], qh[2], d

// to_x8: block bytes -> group positions; otherwise the reverse.
template <bool to_x8>
void reorder_row(const uint8_t* src, uint8_t* dst, int64_t n_blocks) {
    const int64_t n_groups = n_blocks / kX8Blocks;
    for (int64_t g = 0; g < n_groups; ++g) {
        const uint8_t* s = src + g * kX8Bytes;
        uint8_t* d = dst + g * kX8Bytes;
        if (to_x8) std::memset(d + kX8QhOffset, 0, kX8DOffset - kX8QhOffset);  // fields are or-ed in
        for (int b = 0; b < kX8Blocks; ++b) {
            const int blk = kBlock * b;
            for (int j = 0; j < 24; ++j) {
                if (to_x8) d[x8_qs_pos(b, j)] = s[blk + j];
                else d[blk + j] = s[x8_qs_pos(b, j)];
            }
            for (int h = 0; h < 2; ++h) {
                if (to_x8) d[kX8DOffset + 2 * b + h] = s[blk + 26 + h];
                else d[blk + 26 + h] = s[kX8DOffset + 2 * b + h];
            }
            // qh: trit n of byte h is element 120 + m, m = 2 n + h
            if (to_x8) {
                for (int m = 0; m < 8; ++m) {
                    const X8QhSlot q = x8_qh_slot(b, m);
                    d[kX8QhOffset + q.byte] |= static_cast<uint8_t>(trit_of(s[blk + 24 + m % 2], m / 2) << (2 * q.field));
                }
            } else {
                for (int h = 0; h < 2; ++h) {
                    int t[4];
                    for (int n = 0; n < 4; ++n) {
                        const X8QhSlot q = x8_qh_slot(b, 2 * n + h);
                        t[n] = s[kX8QhOffset + q.byte] >> (2 * q.field) & 3;
                    }
                    d[blk + 24 + h] = pack_trits4(t);  // = kX8QhBase3's byte for t (the GEMM's gather)
                }
            }
        }
    }
    const int64_t done = n_groups * kX8Bytes;
    std::memcpy(dst + done, src + done, static_cast<size_t>((n_blocks - n_groups * kX8Blocks) * kBlock));
}

}  // namespace

void pack_ptq1_0_x8_row(const uint8_t* src, uint8_t* dst, int64_t n_blocks) { reorder_row<true>(src, dst, n_blocks); }

void unpack_ptq1_0_x8_row(const uint8_t* src, uint8_t* dst, int64_t n_blocks) {
    reorder_row<false>(src, dst, n_blocks);
}

}  // namespace bonsai::cpu
