// qwen35 (Qwen3.5 / Qwen3.6, Ternary-Bonsai 27B; SPEC §6a): a hybrid of Gated DeltaNet (linear
// attention) layers and gated full-attention layers, three GDN layers for every attention layer
// by default (layer il is attention when (il + 1) % full_attention_interval == 0).
//
// Every layer: x += mixer(rms_norm(x) * attn_norm); x += ffn(rms_norm(x) * post_attention_norm).
// Attention mixer: attn_q yields query and output gate interleaved per head; q and k get a
// per-head RMSNorm, NEOX rope on the first rope.dimension_count dims (text positions are the same
// in every M-RoPE section, so this is plain partial rope), causal attention over the KV cache,
// output * sigmoid(gate), attn_output. Only these layers have KV.
// GDN mixer: qkv = attn_qkv x; z = attn_gate x; beta = sigmoid(ssm_beta x);
// g = ssm_a * softplus(ssm_alpha x + ssm_dt.bias); causal depthwise conv1d + SiLU over qkv with the
// sequence's carried window; q, k L2-normalized per head; the gated delta rule against the
// sequence's state; per-head RMSNorm * ssm_norm * silu(z); ssm_out.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "../forward_gpu.h"
#include "../model_loader.h"
#include "arch.h"
#include "bonsai/error.h"

namespace bonsai {

namespace {

void qwen35_hparams(const GgufFile& f, Hparams& hp) {
    read_common_hparams(f, hp);
    hp.rope_type = RopeType::NEOX;
    hp.attn_output_gate = true;
    const std::string p = hp.arch + ".";
    auto positive = [&](const std::string& key) {
        const int64_t v = static_cast<int64_t>(f.get_u64(p + key));
        if (v <= 0) throw Error(p + key + " must be positive, got " + std::to_string(v));
        return v;
    };
    hp.ssm_conv_kernel = positive("ssm.conv_kernel");
    hp.ssm_dk = positive("ssm.state_size");
    hp.ssm_n_k_heads = positive("ssm.group_count");
    hp.ssm_n_v_heads = positive("ssm.time_step_rank");
    const int64_t inner = positive("ssm.inner_size");
    if (hp.ssm_conv_kernel > 16) throw Error(p + "ssm.conv_kernel " + std::to_string(hp.ssm_conv_kernel) + " is over 16");
    if (inner % hp.ssm_n_v_heads != 0) {
        throw Error(p + "ssm.inner_size (" + std::to_string(inner) + ") is not a multiple of ssm.time_step_rank (" +
                    std::to_string(hp.ssm_n_v_heads) + ")");
    }
    if (hp.ssm_n_v_heads % hp.ssm_n_k_heads != 0) {
        throw Error(p + "ssm.time_step_rank (" + std::to_string(hp.ssm_n_v_heads) +
                    " V heads) is not a multiple of ssm.group_count (" + std::to_string(hp.ssm_n_k_heads) + " K heads)");
    }
    hp.ssm_dv = inner / hp.ssm_n_v_heads;

    hp.recurrent.assign(hp.n_layer, 0);
    if (f.has(p + "attention.recurrent_layers")) {
        const std::vector<int64_t> flags = f.get_array_i64(p + "attention.recurrent_layers");
        if (static_cast<int64_t>(flags.size()) < hp.n_layer) {
            throw Error(p + "attention.recurrent_layers has " + std::to_string(flags.size()) + " entries for " +
                        std::to_string(hp.n_layer) + " layers");
        }
        for (int64_t il = 0; il < hp.n_layer; ++il) hp.recurrent[il] = flags[il] != 0;
    } else {
        const int64_t interval = static_cast<int64_t>(f.get_u64(p + "full_attention_interval", 4));
        if (interval <= 0) throw Error(p + "full_attention_interval must be positive");
        for (int64_t il = 0; il < hp.n_layer; ++il) hp.recurrent[il] = (il + 1) % interval != 0;
    }
    hp.kv_layer.assign(hp.n_layer, -1);
    hp.state_layer.assign(hp.n_layer, -1);
    hp.n_kv_layer = hp.n_state_layer = 0;
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        if (hp.recurrent[il]) hp.state_layer[il] = static_cast<int32_t>(hp.n_state_layer++);
        else hp.kv_layer[il] = static_cast<int32_t>(hp.n_kv_layer++);
    }
}

void qwen35_layer(ModelLoader& ld, const Hparams& hp, int64_t il, LayerWeights& w) {
    const std::string b = "blk." + std::to_string(il) + ".";
    w.attn_norm = ld.vector(b + "attn_norm.weight", hp.n_embd);
    w.ffn_norm = ld.vector(b + "post_attention_norm.weight", hp.n_embd);
    w.w_gate = ld.matrix(b + "ffn_gate.weight", hp.n_embd, hp.n_ff);
    w.w_up = ld.matrix(b + "ffn_up.weight", hp.n_embd, hp.n_ff);
    w.w_down = ld.matrix(b + "ffn_down.weight", hp.n_ff, hp.n_embd);
    if (!hp.is_recurrent(il)) {
        w.wq = ld.matrix(b + "attn_q.weight", hp.n_embd, 2 * hp.n_embd_q());
        w.wk = ld.matrix(b + "attn_k.weight", hp.n_embd, hp.n_embd_kv());
        w.wv = ld.matrix(b + "attn_v.weight", hp.n_embd, hp.n_embd_kv());
        w.wo = ld.matrix(b + "attn_output.weight", hp.n_embd_q(), hp.n_embd);
        w.q_norm = ld.vector(b + "attn_q_norm.weight", hp.head_dim);
        w.k_norm = ld.vector(b + "attn_k_norm.weight", hp.head_dim);
        return;
    }
    const int64_t conv_dim = hp.ssm_conv_dim(), kernel = hp.ssm_conv_kernel;
    w.w_qkv = ld.matrix(b + "attn_qkv.weight", hp.n_embd, conv_dim);
    w.w_z = ld.matrix(b + "attn_gate.weight", hp.n_embd, hp.ssm_v_dim());
    w.w_alpha = ld.matrix(b + "ssm_alpha.weight", hp.n_embd, hp.ssm_n_v_heads);
    w.w_beta = ld.matrix(b + "ssm_beta.weight", hp.n_embd, hp.ssm_n_v_heads);
    w.w_ssm_out = ld.matrix(b + "ssm_out.weight", hp.ssm_v_dim(), hp.n_embd);
    const std::vector<float> taps = ld.floats_2d(b + "ssm_conv1d.weight", kernel, conv_dim);  // [conv_dim][kernel]
    w.conv_w_t.resize(taps.size());
    for (int64_t c = 0; c < conv_dim; ++c) {
        for (int64_t j = 0; j < kernel; ++j) w.conv_w_t[j * conv_dim + c] = taps[c * kernel + j];
    }
    w.dt_bias = ld.vector(b + "ssm_dt.bias", hp.ssm_n_v_heads);
    w.ssm_a = ld.vector(b + "ssm_a", hp.ssm_n_v_heads);
    w.ssm_norm = ld.vector(b + "ssm_norm.weight", hp.ssm_dv);
}

void gated_attention(const Model& m, const LayerWeights& w, int64_t il, ForwardState& st) {
    const Hparams& hp = m.hparams();
    const int64_t n = st.n_tokens, hd = hp.head_dim, nq = hp.n_embd_q();
    rms_norm(st.x, w.attn_norm.data(), n, hp.n_embd, hp.rms_eps, st.cur);
    const WeightView* ws[3] = {&w.wq, &w.wk, &w.wv};
    const Rotation* rs[3] = {&w.r_q, &w.r_k, &w.r_v};
    float* ys[3] = {st.qg, st.k, st.v};
    matmul_group(ws, rs, ys, 3, st.cur, n, st);
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < hp.n_head; ++h) {
            const float* src = st.qg + t * 2 * nq + h * 2 * hd;
            std::memcpy(st.q + t * nq + h * hd, src, hd * sizeof(float));
            std::memcpy(st.qgate + t * nq + h * hd, src + hd, hd * sizeof(float));
        }
    }
    rms_norm(st.q, w.q_norm.data(), n * hp.n_head, hd, hp.rms_eps, st.q);
    rms_norm(st.k, w.k_norm.data(), n * hp.n_head_kv, hd, hp.rms_eps, st.k);
    attention_heads(m, hp.kv_layer[il], st);
    sigmoid_mul(st.attn, st.qgate, n * nq);
    attention_output(m, w, st);
}

// The GDN output from tiled V-head order (head h = r * n_k + k) to grouped order (k * rep + r),
// the order a Hadamard-folded ssm_out expects when prism.hadamard.gdn_v_grouped is set.
void tiled_to_grouped(const Hparams& hp, float* o, int64_t n) {
    const int64_t nk = hp.ssm_n_k_heads, rep = hp.ssm_n_v_heads / nk, dv = hp.ssm_dv, row = hp.ssm_v_dim();
    std::vector<float> tmp_row(row);
    float* tmp = tmp_row.data();
    for (int64_t t = 0; t < n; ++t) {
        float* r = o + t * row;
        for (int64_t rr = 0; rr < rep; ++rr) {
            for (int64_t k = 0; k < nk; ++k) std::memcpy(tmp + (k * rep + rr) * dv, r + (rr * nk + k) * dv, dv * sizeof(float));
        }
        std::memcpy(r, tmp, row * sizeof(float));
    }
}

void gated_delta_net(const Model& m, const LayerWeights& w, int64_t il, ForwardState& st) {
    const Hparams& hp = m.hparams();
    const int64_t n = st.n_tokens, conv_dim = hp.ssm_conv_dim(), hv = hp.ssm_n_v_heads;
    const int64_t sl = hp.state_layer[il];
    rms_norm(st.x, w.attn_norm.data(), n, hp.n_embd, hp.rms_eps, st.cur);
    const WeightView* ws[4] = {&w.w_qkv, &w.w_z, &w.w_alpha, &w.w_beta};
    const Rotation none{};
    const Rotation* rs[4] = {&w.r_qkv, &w.r_z, &none, &none};
    float* ys[4] = {st.qkv, st.z, st.alpha, st.beta};
    matmul_group(ws, rs, ys, 4, st.cur, n, st);

    std::vector<float*> conv(n), delta(n);
    for (int64_t t = 0; t < n; ++t) {
        const int seq = __builtin_ctzll(st.seq_mask[t]);  // one sequence per token
        conv[t] = st.rs->conv(seq, sl);
        delta[t] = st.rs->delta(seq, sl);
    }
    gdn_conv1d_silu(st.qkv, n, conv_dim, w.conv_w_t.data(), hp.ssm_conv_kernel, conv.data(), *st.pool);
    st.pool->parallel_for(n, [&](int64_t t0, int64_t t1, int) {  // the q | k heads of each token
        for (int64_t t = t0; t < t1; ++t) l2_norm_rows(st.qkv + t * conv_dim, 2 * hp.ssm_n_k_heads, hp.ssm_dk, 1e-6f);
    });
    gdn_gates(st.alpha, st.beta, w.dt_bias.data(), w.ssm_a.data(), n, hv);

    DeltaRuleArgs a;
    a.qkv = st.qkv;
    a.qkv_stride = conv_dim;
    a.g = st.alpha;
    a.beta = st.beta;
    a.n_tokens = n;
    a.n_k_heads = hp.ssm_n_k_heads;
    a.n_v_heads = hv;
    a.dk = hp.ssm_dk;
    a.dv = hp.ssm_dv;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hp.ssm_dk));
    a.state = delta.data();
    a.out = st.o;
    gated_delta_rule(a, *st.pool);
    const int64_t dv = hp.ssm_dv;
    st.pool->parallel_for(n * hv, [&](int64_t r0, int64_t r1, int) {  // one row per token and V head
        rms_norm_gated(st.o + r0 * dv, w.ssm_norm.data(), st.z + r0 * dv, r1 - r0, dv, hp.rms_eps);
    });
    if (w.r_ssm_out.active() && m.hadamard().gdn_v_grouped) tiled_to_grouped(hp, st.o, n);
    matmul_one(w.w_ssm_out, w.r_ssm_out, st.o, n, st.cur, st);
    add_inplace(st.x, st.cur, n * hp.n_embd);
}

void qwen35_forward(const Model& m, ForwardState& st) {
    const Hparams& hp = m.hparams();
    begin_forward(m, st);
    for (int64_t il = forward_gpu(m, st); il < hp.n_layer; ++il) {  // the same layers on the GPU: forward.cu
        const LayerWeights& w = m.layers()[il];
        if (hp.is_recurrent(il)) gated_delta_net(m, w, il, st);
        else gated_attention(m, w, il, st);
        ffn_swiglu(m, w, st);
    }
    if (!gpu_did_output(m, st)) output_logits(m, st);
}

}  // namespace

const ArchSpec kArchQwen35 = {"qwen35", qwen35_hparams, qwen35_layer, qwen35_forward};

}  // namespace bonsai
