// Slot maps of the unit layout (see int8_layout.h), built once from the element order of
// bonsai/quant_blocks.h.
#include "int8_layout.h"

#include <algorithm>
#include <vector>

#include "block_unpack.h"
#include "bonsai/quant_blocks.h"
#include "ptq1_0_x8.h"
#include "repack.h"

namespace bonsai::cpu {

namespace {

// Element of a PTQ1_0 unit held by code vector n, block g, block byte k; -1 for padding.
int ptq1_element(int n, int g, int k) {
    int e;
    if (k < 0) return -1;
    if (k < 16) e = 16 * n + k;
    else if (k < 24) e = 80 + 8 * n + (k - 16);
    else if (k < 26 && n < 4) e = 120 + 2 * n + (k - 24);
    else return -1;
    return 128 * g + e;
}

// Element of the unit held by code vector v, byte p; -1 for padding.
int slot_element(GgmlType type, int v, int p) {
    switch (type) {
        case TYPE_PTQ1_0: return ptq1_element(v, p / 32, p % 32);
        case TYPE_TQ1_0: {
            const int n = v;
            if (p < 32) return 32 * n + p;
            const int k = p - 32;
            if (k < 16) return 160 + 16 * n + k;
            if (k < 20 && n < 4) return 240 + 4 * n + (k - 16);
            return -1;
        }
        case TYPE_TQ2_0: {
            const int h = p / 32, m = p % 32, l = v;
            return 128 * h + 32 * l + m;
        }
        case TYPE_Q2_0: {
            const int g = p / 16, k = p % 16;
            return 64 * g + 4 * k + v;
        }
        case TYPE_Q2_0_G128:
        case TYPE_PQ2_0: {
            const int g = p / 32, k = p % 32;
            return 128 * g + 4 * k + v;
        }
        case TYPE_Q4_0: {
            const int g = p / 16, k = p % 16;
            return 32 * g + k + 16 * v;
        }
        case TYPE_Q8_0: {
            const int g = p / 32, k = p % 32;
            return 32 * g + k;
        }
        default:
            return -1;
    }
}

// Element of an X8 group held by code vector v, byte p (int8_layout.h); -1 for padding.
int x8_element(int v, int p) {
    if (v < 15) {
        const int w = v / 5, n = v % 5, l = p / 4;
        return ptq1_element(n, l % 8, 4 * (2 * w + l / 8) + p % 4);
    }
    // qh field f = v - 15 of byte p % 16 of a row's qh bytes (x8_qh_slot): element 120 + m of block b
    const int f = v - 15, q = p % 16, b = 2 * (q / 4) + f / 2, m = 4 * (f % 2) + q % 4;
    return ptq1_element(m / 2, b, 24 + m % 2);
}

struct LayoutEntry {
    Int8Layout layout;
    std::vector<int16_t> map;
    std::vector<int32_t> idx;   // the map as dword gathers (Int8Layout::gather_idx), empty if it is not one
    std::vector<uint8_t> mask;
    // Points the layout at map and, when every dword of slots is consecutive elements or padding,
    // at its gather plan.
    void finish() {
        layout.slot_map = map.data();
        idx.assign(map.size() / 4, 0);
        mask.assign(map.size(), 0);
        for (size_t j = 0; j < idx.size(); ++j) {
            int base = -1;
            for (int k = 0; k < 4; ++k) {
                const int e = map[4 * j + k];
                if (e < 0) continue;
                if (base < 0 && k == 0) base = e;
                if (base < 0) base = e - k;
                if (e != base + k) {  // not a gather: the scalar copy
                    idx.clear();
                    mask.clear();
                    return;
                }
                mask[4 * j + k] = 0xFF;
            }
            idx[j] = base;  // (-1 for an all-padding dword: masked, its bytes lie inside the buffer)
        }
        layout.gather_idx = idx.data();
        layout.gather_mask = mask.data();
    }
};

LayoutEntry make_entry(GgmlType type, int G, int C, int off, bool is_signed, bool shifted = false) {
    LayoutEntry e;
    const BlockInfo* bi = block_info(type);
    e.map.resize(static_cast<size_t>(C) * 64);
    for (int v = 0; v < C; ++v)
        for (int p = 0; p < 64; ++p)
            e.map[v * 64 + p] = static_cast<int16_t>(shifted ? ptq1_element(v, p / 32, p < 32 ? p - 4 : p - 32)
                                                             : slot_element(type, v, p));
    e.layout = Int8Layout{G, C, off, is_signed, bi->elems, bi->bytes, bi->d_offset, nullptr, nullptr, nullptr, nullptr};
    return e;
}

// The one-token AVX-512 layout of PTQ1_0 (shifted), and of PTQ1_0_X8 (its rest: the shifted one).
// (finish() runs on each entry in its final place: the layout points into the entry's vectors.)
const Int8Layout* one_token_ptq1_0() {
    static LayoutEntry shifted = make_entry(TYPE_PTQ1_0, 2, 5, 1, false, true);
    static const bool done = (shifted.finish(), true);
    (void)done;
    return &shifted.layout;
}

const Int8Layout* one_token_ptq1_0_x8() {
    static LayoutEntry x8;
    static const bool done = [] {
        x8.map.resize(kX8CodeVectors * 64);
        for (int v = 0; v < kX8CodeVectors; ++v)
            for (int p = 0; p < 64; ++p) x8.map[v * 64 + p] = static_cast<int16_t>(x8_element(v, p));
        x8.layout = Int8Layout{kX8Blocks, kX8CodeVectors, 1, false, QK_PTQ1_0, static_cast<int>(sizeof(block_ptq1_0)), -1,
                               nullptr, one_token_ptq1_0(), nullptr, nullptr};
        x8.finish();
        return true;
    }();
    (void)done;
    return &x8.layout;
}

const LayoutEntry* entries() {
    static LayoutEntry table[] = {
        make_entry(TYPE_PTQ1_0, 2, 5, 1, false),     make_entry(TYPE_TQ1_0, 1, 5, 1, false),
        make_entry(TYPE_TQ2_0, 1, 4, 1, false),      make_entry(TYPE_Q2_0, 4, 4, 1, false),
        make_entry(TYPE_Q2_0_G128, 2, 4, 1, false),  make_entry(TYPE_PQ2_0, 2, 4, 1, false),
        make_entry(TYPE_Q4_0, 4, 2, 8, false),       make_entry(TYPE_Q8_0, 2, 1, 0, true),
    };
    static const bool done = [] {
        for (LayoutEntry& e : table) e.finish();
        return true;
    }();
    (void)done;
    return table;
}

// The one-token AVX-512 layout of Q8_0_R4 (its rest: Q8_0's).
const Int8Layout* one_token_q8_0_r4() {
    static LayoutEntry r4;
    static const bool done = [] {
        r4.map.resize(2 * 64);
        for (int v = 0; v < 2; ++v)
            for (int p = 0; p < 64; ++p) r4.map[v * 64 + p] = static_cast<int16_t>(32 * (p / 16) + 16 * v + p % 16);
        r4.layout = Int8Layout{static_cast<int>(kQ8R4Blocks), 2, 0, true, QK8_0,
                               static_cast<int>(sizeof(block_q8_0)), 0, nullptr, int8_layout(TYPE_Q8_0), nullptr,
                               nullptr};
        r4.finish();
        return true;
    }();
    (void)done;
    return &r4.layout;
}

}  // namespace

const Int8Layout* int8_layout_for(GgmlType type, CpuPath path, int64_t n_tokens) {
    if (path == CpuPath::AVX512 && n_tokens <= kTileBatchTokens) {
        if (type == TYPE_PTQ1_0) return one_token_ptq1_0();
        if (type == TYPE_PTQ1_0_X8) return one_token_ptq1_0_x8();
        if (type == TYPE_Q8_0_R4) return one_token_q8_0_r4();
    }
    return int8_layout(type);
}

const Int8Layout* int8_layout(GgmlType type) {
    type = file_type(type);  // repacked weights (repack.h): their codes are the file type's
    static const struct Table {
        Int8Layout l[8];
        GgmlType t[8];
        Table() {
            const LayoutEntry* e = entries();
            const GgmlType types[8] = {TYPE_PTQ1_0, TYPE_TQ1_0, TYPE_TQ2_0, TYPE_Q2_0,
                                       TYPE_Q2_0_G128, TYPE_PQ2_0, TYPE_Q4_0, TYPE_Q8_0};
            for (int i = 0; i < 8; ++i) {
                l[i] = e[i].layout;
                t[i] = types[i];
            }
        }
    } table;
    for (int i = 0; i < 8; ++i)
        if (table.t[i] == type) return &table.l[i];
    return nullptr;
}

}  // namespace bonsai::cpu
