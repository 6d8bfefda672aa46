// Saving and restoring one sequence of a Context (bonsai/context.h: save_seq_state / load_seq_state).
//
// The bytes are, in order (native byte order; a state is only meant for the process or machine
// that made it):
//   magic "BSQS", u32 version,
//   u32 length + the layout text (architecture, sizes, cache types, row bytes, recurrent floats),
//   u32 n_tokens, i32 pos[n_tokens] (ascending),
//   for each KV layer stored on the host: K rows [n_tokens], then V rows [n_tokens],
//   recurrent models only: i32 checkpoint position, live state floats, checkpoint floats.
// The layout text must match the loading context's exactly, so a state from another model shape
// or another cache type is refused with both layouts in the message.
#include <algorithm>
#include <cstring>
#include <string>

#include "bonsai/context.h"
#include "bonsai/error.h"

namespace bonsai {

namespace {

constexpr char kMagic[4] = {'B', 'S', 'Q', 'S'};
constexpr uint32_t kVersion = 1;

template <typename T>
void put(std::vector<uint8_t>& out, const T& x) {
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    out.insert(out.end(), p, p + sizeof(T));
}

void put_bytes(std::vector<uint8_t>& out, const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    out.insert(out.end(), p, p + n);
}

// Reads the blob front to back; any read past the end is a truncated state.
class Reader {
public:
    Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
    const uint8_t* take(size_t n) {
        if (n > size_ - at_) throw Error("load_seq_state: the state is truncated (" + std::to_string(size_) + " bytes)");
        const uint8_t* p = data_ + at_;
        at_ += n;
        return p;
    }
    template <typename T>
    T get() {
        T x;
        std::memcpy(&x, take(sizeof(T)), sizeof(T));
        return x;
    }
    bool done() const { return at_ == size_; }

private:
    const uint8_t* data_;
    size_t size_, at_ = 0;
};

}  // namespace

static std::string state_layout(const Context& ctx, const KvCache& kv, size_t recurrent_floats) {
    const Hparams& h = ctx.model().hparams();
    const KvCacheParams& k = kv.params();
    return "arch=" + h.arch + " n_vocab=" + std::to_string(h.n_vocab) + " n_embd=" + std::to_string(h.n_embd) +
           " n_layer=" + std::to_string(h.n_layer) + " n_head=" + std::to_string(h.n_head) +
           " n_head_kv=" + std::to_string(h.n_head_kv) + " head_dim=" + std::to_string(h.head_dim) +
           " n_ff=" + std::to_string(h.n_ff) + " kv_layers=" + std::to_string(k.first_layer) + ".." +
           std::to_string(k.n_layer) + " type_k=" + std::to_string(k.type_k) +
           " type_v=" + std::to_string(k.type_v) + " k_row=" + std::to_string(kv.k_row_bytes()) +
           " v_row=" + std::to_string(kv.v_row_bytes()) + " recurrent_floats=" + std::to_string(recurrent_floats);
}

std::vector<uint8_t> Context::save_seq_state(int seq) const {
    check_seq(seq, "save_seq_state");
    if (gpu_) throw Error("save_seq_state: the model has layers on the GPU, whose state is not copied; use n_gpu_layers=0");
    const size_t rs_floats = rs_ ? rs_->seq_floats() : 0;
    std::vector<int32_t> cells;
    const uint64_t bit = uint64_t{1} << seq;
    for (int64_t c = 0; c < kv_->used_end(); ++c) {
        if (kv_->cell_seq(c) & bit) cells.push_back(static_cast<int32_t>(c));
    }
    std::sort(cells.begin(), cells.end(), [&](int32_t a, int32_t b) { return kv_->cell_pos(a) < kv_->cell_pos(b); });

    std::vector<uint8_t> out;
    put_bytes(out, kMagic, sizeof(kMagic));
    put(out, kVersion);
    const std::string layout = state_layout(*this, *kv_, rs_floats);
    put(out, static_cast<uint32_t>(layout.size()));
    put_bytes(out, layout.data(), layout.size());
    put(out, static_cast<uint32_t>(cells.size()));
    for (int32_t c : cells) put(out, kv_->cell_pos(c));
    const KvCacheParams& kp = kv_->params();
    std::vector<uint8_t> row(std::max(kv_->k_row_bytes(), kv_->v_row_bytes()));
    for (int64_t il = kp.first_layer; il < kp.n_layer; ++il) {
        for (int32_t c : cells) {
            kv_->get_k_row(il, c, row.data());
            put_bytes(out, row.data(), kv_->k_row_bytes());
        }
        for (int32_t c : cells) {
            kv_->get_v_row(il, c, row.data());
            put_bytes(out, row.data(), kv_->v_row_bytes());
        }
    }
    if (rs_) {
        auto& rs = const_cast<RecurrentState&>(*rs_);  // seq_data is read here, not written
        put(out, rs.checkpoint_pos(seq));
        put_bytes(out, rs.seq_data(seq, false), rs_floats * sizeof(float));
        put_bytes(out, rs.seq_data(seq, true), rs_floats * sizeof(float));
    }
    return out;
}

void Context::load_seq_state(int seq, const uint8_t* data, size_t size) {
    check_seq(seq, "load_seq_state");
    if (gpu_) throw Error("load_seq_state: the model has layers on the GPU, whose state is not copied; use n_gpu_layers=0");
    const size_t rs_floats = rs_ ? rs_->seq_floats() : 0;
    Reader r(data, size);
    if (std::memcmp(r.take(sizeof(kMagic)), kMagic, sizeof(kMagic)) != 0) {
        throw Error("load_seq_state: not a saved sequence state (bad magic)");
    }
    const uint32_t version = r.get<uint32_t>();
    if (version != kVersion) throw Error("load_seq_state: state version " + std::to_string(version) + " is not supported");
    const uint32_t layout_len = r.get<uint32_t>();
    const std::string saved(reinterpret_cast<const char*>(r.take(layout_len)), layout_len);
    const std::string mine = state_layout(*this, *kv_, rs_floats);
    if (saved != mine) {
        throw Error("load_seq_state: the state was saved from a different model or cache layout (" + saved +
                    ") than this context's (" + mine + ")");
    }
    const uint32_t n = r.get<uint32_t>();
    std::vector<int32_t> pos(n);
    for (uint32_t i = 0; i < n; ++i) pos[i] = r.get<int32_t>();
    for (uint32_t i = 1; i < n; ++i) {
        if (pos[i] <= pos[i - 1]) throw Error("load_seq_state: the saved positions are not increasing");
    }
    const KvCacheParams& kp = kv_->params();
    const size_t n_kv_layers = static_cast<size_t>(kp.n_layer - kp.first_layer);
    const uint8_t* rows = r.take(n_kv_layers * n * (kv_->k_row_bytes() + kv_->v_row_bytes()));
    int32_t ckpt_pos = -1;
    const uint8_t* live = nullptr;
    const uint8_t* ckpt = nullptr;
    if (rs_) {
        ckpt_pos = r.get<int32_t>();
        live = r.take(rs_floats * sizeof(float));
        ckpt = r.take(rs_floats * sizeof(float));
    }
    if (!r.done()) throw Error("load_seq_state: unexpected bytes after the state");

    // The sequence's own cells (not shared with another sequence) are freed and may be reused.
    const uint64_t bit = uint64_t{1} << seq;
    int64_t available = kv_->n_free();
    for (int64_t c = 0; c < kv_->used_end(); ++c) available += kv_->cell_seq(c) == bit;
    if (static_cast<int64_t>(n) > available) {
        throw Error("load_seq_state: the state holds " + std::to_string(n) + " tokens but only " +
                    std::to_string(available) + " cells are free; use a context with a larger n_ctx");
    }
    kv_->seq_rm(seq, -1, -1);
    std::vector<int32_t> cells;
    kv_->find_free(n, cells);
    if (rs_) rs_->reset(seq);
    for (uint32_t i = 0; i < n; ++i) kv_->claim(cells[i], pos[i], bit);
    for (size_t l = 0; l < n_kv_layers; ++l) {
        const int64_t il = kp.first_layer + static_cast<int64_t>(l);
        for (uint32_t i = 0; i < n; ++i, rows += kv_->k_row_bytes()) kv_->set_k_row(il, cells[i], rows);
        for (uint32_t i = 0; i < n; ++i, rows += kv_->v_row_bytes()) kv_->set_v_row(il, cells[i], rows);
    }
    if (rs_) {
        std::memcpy(rs_->seq_data(seq, false), live, rs_floats * sizeof(float));
        std::memcpy(rs_->seq_data(seq, true), ckpt, rs_floats * sizeof(float));
        rs_->set_checkpoint_pos(seq, ckpt_pos);
    }
}

}  // namespace bonsai
