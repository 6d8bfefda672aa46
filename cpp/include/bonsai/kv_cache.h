// The key/value cache of one context: a fixed pool of cells, allocated once when the context is
// created, each holding the K and V rows of one token for every layer.
//
// Layout: k_[layer][cell] is one row of n_embd_kv = n_head_kv * head_dim elements stored in
// type_k (F16, or Q8_0 blocks of 32 along the row, so head h's slice starts at block
// h * head_dim / 32); v_ likewise in type_v. K and V types are chosen independently.
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
    const uint8_t* k_row(int64_t layer, int64_t cell) const {
        return k_.data() + (static_cast<size_t>(layer - p_.first_layer) * p_.n_cells + cell) * k_row_bytes_;
    }
    const uint8_t* v_row(int64_t layer, int64_t cell) const {
        return v_.data() + (static_cast<size_t>(layer - p_.first_layer) * p_.n_cells + cell) * v_row_bytes_;
    }

    // Writable rows, for restoring a saved sequence (Context::load_seq_state).
    uint8_t* k_row_mut(int64_t layer, int64_t cell) { return const_cast<uint8_t*>(k_row(layer, cell)); }
    uint8_t* v_row_mut(int64_t layer, int64_t cell) { return const_cast<uint8_t*>(v_row(layer, cell)); }

    // Sequence operations; p1 < 0 means "to the end", seq < 0 in seq_rm means every sequence.
    void seq_rm(int seq, int32_t p0, int32_t p1);
    void seq_cp(int src, int dst, int32_t p0, int32_t p1);
    void seq_keep(int seq);
    void clear();
    // Largest position of a sequence in the cache, -1 if it has none.
    int32_t seq_pos_max(int seq) const;

private:
    void update_used_end();

    KvCacheParams p_;
    size_t k_row_bytes_ = 0, v_row_bytes_ = 0;
    std::vector<uint8_t> k_, v_;
    std::vector<int32_t> pos_;
    std::vector<uint64_t> seq_;
    int64_t used_end_ = 0;
};

}  // namespace bonsai
