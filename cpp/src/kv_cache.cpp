// KV cache cells and the f16 / q8_0 row conversion (see kv_cache.h for the layout).
#include "bonsai/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "bonsai/error.h"
#include "bonsai/quants.h"

namespace bonsai {

namespace {

void check_type(const char* which, GgmlType t, int64_t head_dim) {
    if (t != TYPE_F16 && t != TYPE_Q8_0) {
        const TypeTraits* tr = type_traits(t);
        throw Error(std::string("KV cache type ") + which + " = " + (tr ? tr->name : "unknown") +
                    " is not supported; use f16 or q8_0");
    }
    if (t == TYPE_Q8_0 && head_dim % 32 != 0) {
        throw Error(std::string("KV cache type ") + which + " = q8_0 needs a head size that is a " +
                    "multiple of 32, this model's is " + std::to_string(head_dim) + "; use f16");
    }
}

}  // namespace

uint64_t KvCache::bytes_needed(const KvCacheParams& p) {
    check_type("K", p.type_k, p.head_dim);
    check_type("V", p.type_v, p.head_dim);
    const uint64_t rows = static_cast<uint64_t>(p.n_cells) * (p.n_layer - p.first_layer);
    return rows * (type_row_bytes(p.type_k, p.n_embd_kv) + type_row_bytes(p.type_v, p.n_embd_kv));
}

KvCache::KvCache(const KvCacheParams& p) : p_(p) {
    if (p.n_cells <= 0 || p.n_layer <= 0 || p.n_embd_kv <= 0 || p.head_dim <= 0 ||
        p.n_embd_kv % p.head_dim != 0 || p.first_layer < 0 || p.first_layer > p.n_layer) {
        throw Error("invalid KV cache shape: cells " + std::to_string(p.n_cells) + ", layers " +
                    std::to_string(p.n_layer) + ", row " + std::to_string(p.n_embd_kv));
    }
    bytes_needed(p);
    k_row_bytes_ = type_row_bytes(p.type_k, p.n_embd_kv);
    v_row_bytes_ = type_row_bytes(p.type_v, p.n_embd_kv);
    k_head_bytes_ = type_row_bytes(p.type_k, p.head_dim);
    v_head_bytes_ = type_row_bytes(p.type_v, p.head_dim);
    const size_t rows = static_cast<size_t>(p.n_cells) * (p.n_layer - p.first_layer);
    k_.assign(rows * k_row_bytes_, 0);
    v_.assign(rows * v_row_bytes_, 0);
    pos_.assign(p.n_cells, -1);
    seq_.assign(p.n_cells, 0);
}

int64_t KvCache::n_free() const {
    return std::count(seq_.begin(), seq_.end(), uint64_t{0});
}

bool KvCache::find_free(int64_t n, std::vector<int32_t>& cells) const {
    cells.clear();
    for (int64_t c = 0; c < p_.n_cells && static_cast<int64_t>(cells.size()) < n; ++c) {
        if (seq_[c] == 0) cells.push_back(static_cast<int32_t>(c));
    }
    return static_cast<int64_t>(cells.size()) == n;
}

void KvCache::claim(int32_t cell, int32_t pos, uint64_t seq_mask) {
    pos_[cell] = pos;
    seq_[cell] = seq_mask;
    used_end_ = std::max<int64_t>(used_end_, cell + 1);
}

static void convert_row(GgmlType t, const float* x, uint8_t* dst, int64_t n) {
    if (t == TYPE_F16) {
        uint16_t* h = reinterpret_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
    } else {
        quantize_row(t, x, dst, n);
    }
}

int64_t KvCache::k_tile_width(int64_t cell) const {
    return std::min(kKTile, p_.n_cells - cell / kKTile * kKTile);
}

size_t KvCache::k_tile_start(int64_t cell) const {
    return static_cast<size_t>(cell / kKTile * kKTile * p_.head_dim + cell % kKTile);
}

void KvCache::store(int64_t layer, int32_t cell, const float* k, const float* v) {
    const int64_t hd = p_.head_dim;
    for (int64_t h = 0; h < n_head_kv(); ++h) {
        uint8_t* kp = k_.data() + panel_offset(layer, h, k_head_bytes_);
        if (k_tiled()) {
            uint16_t* halves = reinterpret_cast<uint16_t*>(kp) + k_tile_start(cell);
            const int64_t w = k_tile_width(cell);
            for (int64_t d = 0; d < hd; ++d) halves[d * w] = fp32_to_fp16(k[h * hd + d]);
        } else {
            convert_row(p_.type_k, k + h * hd, kp + cell * k_head_bytes_, hd);
        }
        convert_row(p_.type_v, v + h * hd, v_.data() + panel_offset(layer, h, v_head_bytes_) + cell * v_head_bytes_, hd);
    }
}

void KvCache::prefetch_store(int64_t layer, int32_t cell) const {
    if (layer < p_.first_layer || layer >= p_.n_layer) return;
    constexpr int64_t kLine = 64;
    for (int64_t h = 0; h < n_head_kv(); ++h) {
        if (k_tiled()) {
            const uint16_t* halves = reinterpret_cast<const uint16_t*>(k_panel(layer, h)) + k_tile_start(cell);
            const int64_t w = k_tile_width(cell), step = std::max<int64_t>(1, kLine / (2 * w));  // dimensions a line
            for (int64_t d = 0; d < p_.head_dim; d += step) __builtin_prefetch(halves + d * w, 1, 3);
        } else {
            const uint8_t* row = k_panel(layer, h) + cell * k_head_bytes_;
            for (size_t o = 0; o < k_head_bytes_; o += kLine) __builtin_prefetch(row + o, 1, 3);
        }
        const uint8_t* row = v_panel(layer, h) + cell * v_head_bytes_;
        for (size_t o = 0; o < v_head_bytes_; o += kLine) __builtin_prefetch(row + o, 1, 3);
    }
}

void KvCache::k_head_floats(int64_t layer, int64_t cell, int64_t h, float* out) const {
    const uint8_t* kp = k_panel(layer, h);
    if (k_tiled()) {
        const uint16_t* halves = reinterpret_cast<const uint16_t*>(kp) + k_tile_start(cell);
        const int64_t w = k_tile_width(cell);
        for (int64_t d = 0; d < p_.head_dim; ++d) out[d] = fp16_to_fp32(halves[d * w]);
    } else {
        dequantize_row(p_.type_k, kp + cell * k_head_bytes_, out, p_.head_dim);
    }
}

void KvCache::get_k_row(int64_t layer, int64_t cell, uint8_t* row) const {
    for (int64_t h = 0; h < n_head_kv(); ++h) {
        uint8_t* dst = row + h * k_head_bytes_;
        if (k_tiled()) {
            const uint16_t* halves = reinterpret_cast<const uint16_t*>(k_panel(layer, h)) + k_tile_start(cell);
            const int64_t w = k_tile_width(cell);
            for (int64_t d = 0; d < p_.head_dim; ++d) std::memcpy(dst + 2 * d, halves + d * w, 2);
        } else {
            std::memcpy(dst, k_panel(layer, h) + cell * k_head_bytes_, k_head_bytes_);
        }
    }
}

void KvCache::set_k_row(int64_t layer, int64_t cell, const uint8_t* row) {
    for (int64_t h = 0; h < n_head_kv(); ++h) {
        const uint8_t* src = row + h * k_head_bytes_;
        uint8_t* kp = k_.data() + panel_offset(layer, h, k_head_bytes_);
        if (k_tiled()) {
            uint16_t* halves = reinterpret_cast<uint16_t*>(kp) + k_tile_start(cell);
            const int64_t w = k_tile_width(cell);
            for (int64_t d = 0; d < p_.head_dim; ++d) std::memcpy(halves + d * w, src + 2 * d, 2);
        } else {
            std::memcpy(kp + cell * k_head_bytes_, src, k_head_bytes_);
        }
    }
}

void KvCache::get_v_row(int64_t layer, int64_t cell, uint8_t* row) const {
    for (int64_t h = 0; h < n_head_kv(); ++h) {
        std::memcpy(row + h * v_head_bytes_, v_panel(layer, h) + cell * v_head_bytes_, v_head_bytes_);
    }
}

void KvCache::set_v_row(int64_t layer, int64_t cell, const uint8_t* row) {
    for (int64_t h = 0; h < n_head_kv(); ++h) {
        std::memcpy(v_.data() + panel_offset(layer, h, v_head_bytes_) + cell * v_head_bytes_, row + h * v_head_bytes_,
                    v_head_bytes_);
    }
}

void KvCache::update_used_end() {
    while (used_end_ > 0 && seq_[used_end_ - 1] == 0) --used_end_;
}

static bool in_range(int32_t pos, int32_t p0, int32_t p1) {
    return pos >= std::max(p0, 0) && (p1 < 0 || pos < p1);
}

void KvCache::seq_rm(int seq, int32_t p0, int32_t p1) {
    const uint64_t bits = seq < 0 ? ~uint64_t{0} : (uint64_t{1} << seq);
    for (int64_t c = 0; c < used_end_; ++c) {
        if ((seq_[c] & bits) && in_range(pos_[c], p0, p1)) {
            seq_[c] &= ~bits;
            if (seq_[c] == 0) pos_[c] = -1;
        }
    }
    update_used_end();
}

void KvCache::seq_cp(int src, int dst, int32_t p0, int32_t p1) {
    if (src == dst) return;
    const uint64_t s = uint64_t{1} << src, d = uint64_t{1} << dst;
    for (int64_t c = 0; c < used_end_; ++c) {
        if ((seq_[c] & s) && in_range(pos_[c], p0, p1)) seq_[c] |= d;
    }
}

void KvCache::seq_keep(int seq) {
    const uint64_t bits = uint64_t{1} << seq;
    for (int64_t c = 0; c < used_end_; ++c) {
        seq_[c] &= bits;
        if (seq_[c] == 0) pos_[c] = -1;
    }
    update_used_end();
}

void KvCache::clear() {
    std::fill(seq_.begin(), seq_.end(), uint64_t{0});
    std::fill(pos_.begin(), pos_.end(), -1);
    used_end_ = 0;
}

int32_t KvCache::seq_pos_max(int seq) const {
    const uint64_t bits = uint64_t{1} << seq;
    int32_t m = -1;
    for (int64_t c = 0; c < used_end_; ++c) {
        if (seq_[c] & bits) m = std::max(m, pos_[c]);
    }
    return m;
}

}  // namespace bonsai
