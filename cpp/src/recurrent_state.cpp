// Per-sequence recurrent state and its checkpoint (bonsai/recurrent_state.h).
#include "bonsai/recurrent_state.h"

#include <algorithm>

namespace bonsai {

namespace {

size_t floats_per_seq(const Hparams& hp, int64_t first_layer) {
    return static_cast<size_t>(hp.n_state_layer - first_layer) * (hp.conv_state_floats() + hp.delta_state_floats());
}

}  // namespace

RecurrentState::RecurrentState(const Hparams& hp, int n_seq, int64_t first_layer)
    : first_(first_layer), n_layer_(hp.n_state_layer - first_layer), conv_floats_(hp.conv_state_floats()),
      delta_floats_(hp.delta_state_floats()), per_seq_(floats_per_seq(hp, first_layer)),
      live_(per_seq_ * n_seq, 0.0f), ckpt_(per_seq_ * n_seq, 0.0f),
      ckpt_pos_(n_seq, -1) {}

uint64_t RecurrentState::bytes_needed(const Hparams& hp, int n_seq, int64_t first_layer) {
    return 2ull * floats_per_seq(hp, first_layer) * static_cast<uint64_t>(n_seq) * sizeof(float);
}

void RecurrentState::reset(int seq) {
    std::fill_n(live_.begin() + offset(seq), per_seq_, 0.0f);
    ckpt_pos_[seq] = -1;
}

void RecurrentState::copy(int src, int dst) {
    if (src == dst) return;
    std::copy_n(live_.begin() + offset(src), per_seq_, live_.begin() + offset(dst));
    std::copy_n(ckpt_.begin() + offset(src), per_seq_, ckpt_.begin() + offset(dst));
    ckpt_pos_[dst] = ckpt_pos_[src];
}

void RecurrentState::save_checkpoint(int seq, int32_t pos) {
    std::copy_n(live_.begin() + offset(seq), per_seq_, ckpt_.begin() + offset(seq));
    ckpt_pos_[seq] = pos;
}

void RecurrentState::restore_checkpoint(int seq) {
    std::copy_n(ckpt_.begin() + offset(seq), per_seq_, live_.begin() + offset(seq));
}

void RecurrentState::load_checkpoint_of(int src, int dst) {
    std::copy_n(ckpt_.begin() + offset(src), per_seq_, live_.begin() + offset(dst));
    if (src != dst) std::copy_n(ckpt_.begin() + offset(src), per_seq_, ckpt_.begin() + offset(dst));
    ckpt_pos_[dst] = ckpt_pos_[src];
}

}  // namespace bonsai
