// The key/value cache of one context: a fixed pool of cells, allocated once when the context is
// created, each holding the K and V rows of one token for every layer.
//
// Layout: head-major, so that attention reads one kv head's cells as one contiguous stream. For
// each stored layer and kv head h there is a K panel and a V panel of n_cells cells:
//   V, and K stored as Q8_0: cell c's head_dim elements at c * head bytes (Q8_0: blocks of 32
//     along the head);
//   K stored as F16: transposed in tiles of kKTile = 16 cells, so that one load reads one
//     dimension of 16 cells (attention's score pass multiplies it by each query head's element,
//     with no transposition): element d of cell c is the half at t * 16 * head_dim + d * w + c % 16
//     of the panel, t = c / 16, w = 16 (or n_cells % 16 for a last partial tile).
// The whole row of a token (n_embd_kv = n_head_kv * head_dim elements in type_k, heads in order,
// the GPU cache's and the saved state's form) is read and written by get/set_k_row (v likewise).
// K and V types are chosen independently.
//
// Cells carry the token position and the set of sequences that share them (a bit mask, so at most
// 64 sequences); a cell whose mask is empty is free. A token of sequence s at position p attends to
// every cell whose mask contains s and whose position is <= p, so sequences share prompt prefixes
// by seq_cp without copying any K/V bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bonsai/types.h"

namespace bonsai {

struct KvCacheParams {
    int64_t n_cells = 0;    // = context size in tokens, summed over sequences
    int64_t n_layer = 0;
    int64_t first_layer = 0;  // rows are stored for layers [first_layer, n_layer) only (the layers
                              // before it keep their K/V on the GPU); 0 = every layer
    int64_t n_embd_kv = 0;  // n_head_kv * head_dim
    int64_t head_dim = 0;
    GgmlType type_k = TYPE_F16;
    GgmlType type_v = TYPE_F16;
};

class KvCache {
public:
    static constexpr int kMaxSeq = 64;

    // Validates the types (F16 or Q8_0; Q8_0 needs head_dim % 32 == 0) and the sizes; throws
    // bonsai::Error naming the problem. Allocation happens here, once.
    explicit KvCache(const KvCacheParams& p);

    // Bytes the K and V buffers of these parameters take (validates the types too).
    static uint64_t bytes_needed(const KvCacheParams& p);

    const KvCacheParams& params() const { return p_; }
    int64_t n_cells() const { return p_.n_cells; }
    uint64_t bytes() const { return k_.size() + v_.size(); }
    size_t k_row_bytes() const { return k_row_bytes_; }
    size_t v_row_bytes() const { return v_row_bytes_; }

    int32_t cell_pos(int64_t c) const { return pos_[c]; }
    uint64_t cell_seq(int64_t c) const { return seq_[c]; }
    const int32_t* cell_pos_data() const { return pos_.data(); }
    const uint64_t* cell_seq_data() const { return seq_.data(); }
    // Cells at or above this index are all free (the attention loops stop there).
    int64_t used_end() const { return used_end_; }
    int64_t n_free() const;

    // Picks n free cells (lowest first) without claiming them; false if fewer are free.
    bool find_free(int64_t n, std::vector<int32_t>& cells) const;
    // Claims a free cell for a token at `pos` of the sequences in `seq_mask`.
    void claim(int32_t cell, int32_t pos, uint64_t seq_mask);

    // Converts one token's k and v rows (n_embd_kv floats each) into the cache types.
    void store(int64_t layer, int32_t cell, const float* k, const float* v);
    // Asks for the cache lines a later store(layer, cell, ...) writes, with intent to write: an F16
    // K cell's halves lie in head_dim / 2 lines of each head's panel (a line holds two dimensions
    // of a full tile), which the stores would otherwise fetch one by one (a no-op for a layer that
    // is not stored here).
    void prefetch_store(int64_t layer, int32_t cell) const;

    static constexpr int64_t kKTile = 16;  // cells per transposed tile of an F16 K panel
    int64_t n_head_kv() const { return p_.n_embd_kv / p_.head_dim; }
    bool k_tiled() const { return p_.type_k == TYPE_F16; }
    // Bytes of one cell's slice of one head (type_k / type_v, head_dim elements).
    size_t k_head_bytes() const { return k_head_bytes_; }
    size_t v_head_bytes() const { return v_head_bytes_; }
    // The panels of kv head h in a stored layer (see the layout above).
    const uint8_t* k_panel(int64_t layer, int64_t h) const { return k_.data() + panel_offset(layer, h, k_head_bytes_); }
    const uint8_t* v_panel(int64_t layer, int64_t h) const { return v_.data() + panel_offset(layer, h, v_head_bytes_); }
    // Head h's K of a cell as floats (head_dim of them), whichever layout holds it.
    void k_head_floats(int64_t layer, int64_t cell, int64_t h, float* out) const;

    // A token's whole row (k_row_bytes / v_row_bytes: n_embd_kv elements in the cache type, heads
    // in order), copied out of or into the panels: the saved sequence state's form.
    void get_k_row(int64_t layer, int64_t cell, uint8_t* row) const;
    void get_v_row(int64_t layer, int64_t cell, uint8_t* row) const;
    void set_k_row(int64_t layer, int64_t cell, const uint8_t* row);
    void set_v_row(int64_t layer, int64_t cell, const uint8_t* row);

    // Sequence operations; p1 < 0 means "to the end", seq < 0 in seq_rm means every sequence.
    void seq_rm(int seq, int32_t p0, int32_t p1);
    void seq_cp(int src, int dst, int32_t p0, int32_t p1);
    void seq_keep(int seq);
    void clear();
    // Largest position of a sequence in the cache, -1 if it has none.
    int32_t seq_pos_max(int seq) const;

private:
    void update_used_end();
    size_t panel_offset(int64_t layer, int64_t h, size_t head_bytes) const {
        return ((static_cast<size_t>(layer - p_.first_layer) * n_head_kv() + h) * p_.n_cells) * head_bytes;
    }
    // Half index of the cell's dimension 0 in an F16 K panel (the tiled layout above), and the width
    // of its tile: its cells, the stride in halves from one dimension to the next.
    size_t k_tile_start(int64_t cell) const;
    int64_t k_tile_width(int64_t cell) const;

    KvCacheParams p_;
    size_t k_row_bytes_ = 0, v_row_bytes_ = 0, k_head_bytes_ = 0, v_head_bytes_ = 0;
    std::vector<uint8_t> k_, v_;
    std::vector<int32_t> pos_;
    std::vector<uint64_t> seq_;
    int64_t used_end_ = 0;
};

}  // namespace bonsai
