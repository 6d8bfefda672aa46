// Slot maps of the unit layout (see int8_layout.h), built once from the element order of
// bonsai/quant_blocks.h.
#include "int8_layout.h"

#include <algorithm>
#include <vector>

#include "block_unpack.h"
#include "bonsai/quant_blocks.h"
#include "cpu_features.h"
#include "ptq1_0_r16.h"
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

// The one-token AVX-512 layout of PTQ1_0 (shifted).
// (finish() runs on each entry in its final place: the layout points into the entry's vectors.)
const Int8Layout* one_token_ptq1_0() {
    static LayoutEntry shifted = make_entry(TYPE_PTQ1_0, 2, 5, 1, false, true);
    static const bool done = (shifted.finish(), true);
    (void)done;
    return &shifted.layout;
}

// The one-token AVX-512 layout of PTQ1_0_R16 (ptq1_0_r16.h): one block a unit, dword 5 k + n the
// activations of trit n of the block's qs bytes 4 k .. 4 k + 3 (k < 6), dword 30 + f those of
// field f of its two re-coded qh bytes (two bytes, two of padding), the rest padding. The kernel
// multiplies each dword, broadcast, with all 16 rows of a tile.
const Int8Layout* one_token_ptq1_0_r16() {
    static LayoutEntry r16;
    static const bool done = [] {
        r16.map.assign(kR16ActVectors * 64, -1);
        for (int k = 0; k < 6; ++k)
            for (int n = 0; n < 5; ++n)
                for (int i = 0; i < 4; ++i) r16.map[4 * (5 * k + n) + i] = static_cast<int16_t>(ptq1_element(n, 0, 4 * k + i));
        for (int f = 0; f < 4; ++f)
            for (int i = 0; i < 2; ++i) r16.map[4 * (30 + f) + i] = static_cast<int16_t>(ptq1_element(f, 0, 24 + i));
        r16.layout = Int8Layout{1, kR16ActVectors, 1, false, QK_PTQ1_0, static_cast<int>(sizeof(block_ptq1_0)), -1,
                                nullptr, nullptr, nullptr, nullptr};
        r16.finish();
        return true;
    }();
    (void)done;
    return &r16.layout;
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

int64_t tile_batch_tokens(GgmlType type) { return is_r16(type) ? 8 : 4; }

const Int8Layout* int8_layout_for(GgmlType type, CpuPath path, int64_t n_tokens) {
    if (path == CpuPath::AVX512 && n_tokens <= tile_batch_tokens(type)) {
        if (type == TYPE_PTQ1_0) return one_token_ptq1_0();
        if (type == TYPE_PTQ1_0_R16) return one_token_ptq1_0_r16();
        // (R16L's code needs VBMI's lookups: with VBMI switched off its tiles are read converted back)
        if (type == TYPE_PTQ1_0_R16L) return avx512_vbmi_enabled() ? one_token_ptq1_0_r16() : one_token_ptq1_0();
        if (type == TYPE_Q8_0_R4) return one_token_q8_0_r4();
    }
    return int8_layout(type);
}

bool reads_repacked(const Int8Layout* layout) { return layout == one_token_ptq1_0_r16() || layout == one_token_q8_0_r4(); }

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
