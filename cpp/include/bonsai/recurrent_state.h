// The recurrent state of a hybrid model's Gated DeltaNet layers (qwen35, SPEC §6a), per sequence:
// for every recurrent layer the conv window (the last kernel-1 inputs of the conv1d, f32) and the
// delta-rule state (n_v_heads x dv x dk, f32). Allocated once with the context, like the KV cache.
//
// Unlike K/V, the state at an earlier position cannot be rebuilt from what the cache holds, so each
// sequence also keeps one checkpoint: a copy of its whole state at a known position. Context takes
// it when a decode call gives a sequence a prompt (two or more tokens), at the prompt's second-to-
// last token, so that a later prompt sharing that prefix resumes exactly from it. Removing tokens
// is exact only back to the checkpoint (or everything); Context refuses anything else.
//
// With GPU layers the state of the offloaded recurrent layers [0, first_layer) lives on the device
// (same per-sequence layout, cpp/backends/cuda/gpu_context.cu) and this object stores only layers
// [first_layer, n_state_layer), like KvCache's first_layer; it still keeps every sequence's
// checkpoint position, and Context applies each operation to both copies.
#pragma once

#include <cstdint>
#include <vector>

#include "bonsai/model.h"

namespace bonsai {

class RecurrentState {
public:
    RecurrentState(const Hparams& hp, int n_seq, int64_t first_layer = 0);

    // Bytes the state of n_seq sequences takes, checkpoints included (layers from first_layer on).
    static uint64_t bytes_needed(const Hparams& hp, int n_seq, int64_t first_layer = 0);
    uint64_t bytes() const { return (live_.size() + ckpt_.size()) * sizeof(float); }

    // The conv window / delta state of sequence seq in recurrent layer sl (Hparams::state_layer,
    // sl >= first_layer).
    float* conv(int seq, int64_t sl) { return live_.data() + offset(seq) + (sl - first_) * conv_floats_; }
    float* delta(int seq, int64_t sl) {
        return live_.data() + offset(seq) + n_layer_ * conv_floats_ + (sl - first_) * delta_floats_;
    }

    // The whole state of sequence seq (every stored layer, conv then delta), live or checkpoint:
    // seq_floats() floats, for saving and restoring a sequence (Context::save_seq_state).
    size_t seq_floats() const { return per_seq_; }
    float* seq_data(int seq, bool checkpoint) { return (checkpoint ? ckpt_ : live_).data() + offset(seq); }
    void set_checkpoint_pos(int seq, int32_t pos) { ckpt_pos_[seq] = pos; }

    void reset(int seq);              // zero state, no checkpoint
    void copy(int src, int dst);      // state and checkpoint of src into dst
    void save_checkpoint(int seq, int32_t pos);
    int32_t checkpoint_pos(int seq) const { return ckpt_pos_[seq]; }  // -1: none
    void restore_checkpoint(int seq); // the live state becomes the checkpoint's
    void load_checkpoint_of(int src, int dst);  // dst's live state and checkpoint become src's checkpoint

private:
    size_t offset(int seq) const { return static_cast<size_t>(seq) * per_seq_; }

    int64_t first_ = 0, n_layer_ = 0, conv_floats_ = 0, delta_floats_ = 0;  // n_layer_: layers stored here
    size_t per_seq_ = 0;
    std::vector<float> live_, ckpt_;
    std::vector<int32_t> ckpt_pos_;
};

}  // namespace bonsai
