// Pieces every supported architecture shares: the common {arch}.* hyperparameters, the common
// per-layer tensor list, and the pre-norm transformer blocks (embedding, attention with rotary
// positions over the KV cache, SwiGLU feed-forward, output head) that the per-architecture
// forward passes are assembled from.
#include <cmath>

#include "../model_loader.h"
#include "../op_profile.h"
#include "arch.h"
#include "bonsai/error.h"

namespace bonsai {

// Tokens of a step up to which attention_heads prefetches the next KV layer's store lines.
constexpr int64_t kPrefetchStoreTokens = 4;

const ArchSpec& find_arch(const std::string& name) {
    for (const ArchSpec* a : {&kArchLlama, &kArchQwen2, &kArchQwen3, &kArchQwen35}) {
        if (name == a->name) return *a;
    }
    throw Error("unsupported model architecture '" + name + "'; this engine runs llama, qwen2, qwen3 and qwen35");
}

void read_common_hparams(const GgufFile& f, Hparams& hp) {
    const std::string p = hp.arch + ".";
    hp.n_ctx_train = static_cast<int64_t>(f.get_u64(p + "context_length"));
    hp.n_embd = static_cast<int64_t>(f.get_u64(p + "embedding_length"));
    hp.n_layer = static_cast<int64_t>(f.get_u64(p + "block_count"));
    hp.n_ff = static_cast<int64_t>(f.get_u64(p + "feed_forward_length"));
    hp.n_head = static_cast<int64_t>(f.get_u64(p + "attention.head_count"));
    hp.n_head_kv = static_cast<int64_t>(f.get_u64(p + "attention.head_count_kv",
                                                  static_cast<uint64_t>(hp.n_head)));
    hp.rms_eps = f.get_f32(p + "attention.layer_norm_rms_epsilon");
    hp.rope_theta = f.get_f32(p + "rope.freq_base", 10000.0f);
    if (hp.n_head <= 0) throw Error(p + "attention.head_count must be positive");
    hp.head_dim = static_cast<int64_t>(f.get_u64(p + "attention.key_length",
                                                 static_cast<uint64_t>(hp.n_embd / hp.n_head)));
    const int64_t v_len = static_cast<int64_t>(f.get_u64(p + "attention.value_length",
                                                         static_cast<uint64_t>(hp.head_dim)));
    if (v_len != hp.head_dim) {
        throw Error(p + "attention.value_length (" + std::to_string(v_len) + ") differs from key_length (" +
                    std::to_string(hp.head_dim) + "); this engine needs them equal");
    }
    hp.n_rot = static_cast<int64_t>(f.get_u64(p + "rope.dimension_count", static_cast<uint64_t>(hp.head_dim)));

    const std::string scaling = f.get_string(p + "rope.scaling.type", "none");
    if (scaling == "linear") {
        const float factor = f.get_f32(p + "rope.scaling.factor");
        if (!(factor > 0.0f)) throw Error(p + "rope.scaling.factor must be positive");
        hp.rope_freq_scale = 1.0f / factor;
    } else if (scaling != "none") {
        throw Error(p + "rope.scaling.type '" + scaling + "' is not supported (only none and linear)");
    }
}

void load_common_layer(ModelLoader& ld, const Hparams& hp, int64_t il, LayerWeights& w) {
    const std::string b = "blk." + std::to_string(il) + ".";
    w.attn_norm = ld.vector(b + "attn_norm.weight", hp.n_embd);
    w.wq = ld.matrix(b + "attn_q.weight", hp.n_embd, hp.n_embd_q());
    w.wk = ld.matrix(b + "attn_k.weight", hp.n_embd, hp.n_embd_kv());
    w.wv = ld.matrix(b + "attn_v.weight", hp.n_embd, hp.n_embd_kv());
    w.wo = ld.matrix(b + "attn_output.weight", hp.n_embd_q(), hp.n_embd);
    w.ffn_norm = ld.vector(b + "ffn_norm.weight", hp.n_embd);
    w.w_gate = ld.matrix(b + "ffn_gate.weight", hp.n_embd, hp.n_ff);
    w.w_up = ld.matrix(b + "ffn_up.weight", hp.n_embd, hp.n_ff);
    w.w_down = ld.matrix(b + "ffn_down.weight", hp.n_ff, hp.n_embd);
}

static size_t weight_bytes(const WeightView& w) { return static_cast<size_t>(w.rows) * w.row_bytes; }

static RopeParams rope_params(const Model& m) {
    const Hparams& hp = m.hparams();
    RopeParams r;
    r.type = hp.rope_type;
    r.n_rot = hp.n_rot;
    r.theta_base = hp.rope_theta;
    r.freq_scale = hp.rope_freq_scale;
    r.freq_factors = m.rope_freqs().empty() ? nullptr : m.rope_freqs().data();
    return r;
}

// The rotation WHT_B(s ⊙ x) is computed once for all the folded weights of a group; the unfolded
// ones run first, because the rotation may overwrite x.
void matmul_group(const WeightView* const* ws, const Rotation* const* rs, float* const* ys, int n, float* x,
                  int64_t n_tokens, ForwardState& st) {
    constexpr int kMax = 4;
    if (n > kMax) throw Error("matmul_group: at most 4 weights share an input");
    const WeightView* plain_w[kMax];
    float* plain_y[kMax];
    const WeightView* rot_w[kMax];
    float* rot_y[kMax];
    int n_plain = 0, n_rot = 0;
    const Rotation* rot = nullptr;
    for (int i = 0; i < n; ++i) {
        if (rs[i]->active()) {
            rot = rs[i];  // one input width, so one rotation
            rot_w[n_rot] = ws[i];
            rot_y[n_rot++] = ys[i];
        } else {
            plain_w[n_plain] = ws[i];
            plain_y[n_plain++] = ys[i];
        }
    }
    if (n_plain > 0) matmul_shared_input(plain_w, plain_y, n_plain, x, n_tokens, st.act, *st.pool);
    if (n_rot > 0) matmul_rotated(rot_w, rot_y, n_rot, x, n_tokens, *rot, st.act, *st.pool);
}

void matmul_one(const WeightView& w, const Rotation& r, float* x, int64_t n_tokens, float* y, ForwardState& st) {
    const WeightView* ws[1] = {&w};
    const Rotation* rs[1] = {&r};
    float* ys[1] = {y};
    matmul_group(ws, rs, ys, 1, x, n_tokens, st);
}

void begin_forward(const Model& m, ForwardState& st) {
    OpScope op(OpKind::EMBED, st.n_tokens);
    get_rows(m.tok_embd(), st.token, st.n_tokens, st.x);
    if (m.embd_rotation().active()) hadamard_unrotate(st.x, st.n_tokens, m.hparams().n_embd, m.embd_rotation(), *st.pool);
    rope_table(st.pos, st.n_tokens, rope_params(m), st.rope_cs);
}

void project_qkv(const Model& m, const LayerWeights& w, ForwardState& st) {
    const Hparams& hp = m.hparams();
    {
        OpScope op(OpKind::NORM, st.n_tokens);
        rms_norm(st.x, w.attn_norm.data(), st.n_tokens, hp.n_embd, hp.rms_eps, st.cur);
    }
    const WeightView* ws[3] = {&w.wq, &w.wk, &w.wv};
    const Rotation* rs[3] = {&w.r_q, &w.r_k, &w.r_v};
    float* ys[3] = {st.q, st.k, st.v};
    OpScope op(OpKind::QKV, st.n_tokens, weight_bytes(w.wq) + weight_bytes(w.wk) + weight_bytes(w.wv));
    matmul_group(ws, rs, ys, 3, st.cur, st.n_tokens, st);
}

void attend(const Model& m, const LayerWeights& w, int64_t il, ForwardState& st) {
    attention_heads(m, il, st);
    attention_output(m, w, st);
}

void attention_heads(const Model& m, int64_t il, ForwardState& st) {
    const Hparams& hp = m.hparams();
    const RopeParams rp = rope_params(m);
    {
        OpScope op(OpKind::ROPE_KV, st.n_tokens);
        rope_apply(st.q, st.n_tokens, hp.n_head, hp.head_dim, rp, st.rope_cs);
        rope_apply(st.k, st.n_tokens, hp.n_head_kv, hp.head_dim, rp, st.rope_cs);
        for (int64_t t = 0; t < st.n_tokens; ++t) {
            st.kv->store(il, st.cell[t], st.k + t * hp.n_embd_kv(), st.v + t * hp.n_embd_kv());
        }
        // The next KV layer's lines for the same cells arrive while this layer finishes (decode only:
        // a prompt's tokens fill whole tiles, which stay in cache across its stores).
        if (st.n_tokens <= kPrefetchStoreTokens) {
            for (int64_t t = 0; t < st.n_tokens; ++t) st.kv->prefetch_store(il + 1, st.cell[t]);
        }
    }
    AttentionArgs a;
    a.q = st.q;
    a.n_tokens = st.n_tokens;
    a.pos = st.pos;
    a.seq_mask = st.seq_mask;
    a.kv = st.kv;
    a.layer = il;
    a.n_head = hp.n_head;
    a.n_head_kv = hp.n_head_kv;
    a.head_dim = hp.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
    a.flash = st.flash_attn;
    a.out = st.attn;
    OpScope op(OpKind::ATTENTION, st.n_tokens);
    attention(a, st.attn_scratch, st.attn_scratch_per_thread, *st.pool);
}

void attention_output(const Model& m, const LayerWeights& w, ForwardState& st) {
    {
        OpScope op(OpKind::ATTN_OUT, st.n_tokens, weight_bytes(w.wo));
        matmul_one(w.wo, w.r_o, st.attn, st.n_tokens, st.cur, st);
    }
    OpScope op(OpKind::RESIDUAL, st.n_tokens);
    add_inplace(st.x, st.cur, st.n_tokens * m.hparams().n_embd);
}

void ffn_swiglu(const Model& m, const LayerWeights& w, ForwardState& st) {
    const Hparams& hp = m.hparams();
    {
        OpScope op(OpKind::NORM, st.n_tokens);
        rms_norm(st.x, w.ffn_norm.data(), st.n_tokens, hp.n_embd, hp.rms_eps, st.cur);
    }
    const WeightView* ws[2] = {&w.w_gate, &w.w_up};
    const Rotation* rs[2] = {&w.r_gate, &w.r_up};
    float* ys[2] = {st.gate, st.up};
    {
        OpScope op(OpKind::GATE_UP, st.n_tokens, weight_bytes(w.w_gate) + weight_bytes(w.w_up));
        matmul_group(ws, rs, ys, 2, st.cur, st.n_tokens, st);
    }
    {
        OpScope op(OpKind::SWIGLU, st.n_tokens);
        swiglu(st.gate, st.up, st.n_tokens * hp.n_ff, st.gate);
    }
    {
        OpScope op(OpKind::DOWN, st.n_tokens, weight_bytes(w.w_down));
        matmul_one(w.w_down, w.r_down, st.gate, st.n_tokens, st.cur, st);
    }
    OpScope op(OpKind::RESIDUAL, st.n_tokens);
    add_inplace(st.x, st.cur, st.n_tokens * hp.n_embd);
}

void output_logits(const Model& m, ForwardState& st) {
    if (st.n_out == 0) return;
    const Hparams& hp = m.hparams();
    // embeddings: the normed rows are the result (st.cur may not exist: all layers on the GPU)
    float* normed = st.embd ? st.embd : st.cur;
    {
        OpScope op(OpKind::NORM, st.n_tokens);
        for (int64_t i = 0; i < st.n_out; ++i) {
            rms_norm(st.x + static_cast<int64_t>(st.out_rows[i]) * hp.n_embd, m.output_norm().data(), 1,
                     hp.n_embd, hp.rms_eps, normed + i * hp.n_embd);
        }
    }
    if (st.embd) return;
    OpScope op(OpKind::HEAD, st.n_tokens, weight_bytes(m.output()));
    matmul_one(m.output(), m.output_rotation(), st.cur, st.n_out, st.logits, st);
}

}  // namespace bonsai
