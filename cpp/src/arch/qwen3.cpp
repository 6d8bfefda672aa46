// qwen3: the llama block with NEOX rotary positions, an explicit head size
// (attention.key_length, which need not be n_embd / n_head) and an RMSNorm over each head of q and
// k (attn_q_norm / attn_k_norm, one weight vector of head_dim shared by all heads) applied after the
// projections and before the rotation. No q/k/v biases.
#include "../forward_gpu.h"
#include "../model_loader.h"
#include "arch.h"

namespace bonsai {

namespace {

void qwen3_hparams(const GgufFile& f, Hparams& hp) {
    read_common_hparams(f, hp);
    hp.rope_type = RopeType::NEOX;
}

void qwen3_layer(ModelLoader& ld, const Hparams& hp, int64_t il, LayerWeights& w) {
    load_common_layer(ld, hp, il, w);
    const std::string b = "blk." + std::to_string(il) + ".";
    w.q_norm = ld.vector(b + "attn_q_norm.weight", hp.head_dim);
    w.k_norm = ld.vector(b + "attn_k_norm.weight", hp.head_dim);
}

void qwen3_forward(const Model& m, ForwardState& st) {
    const Hparams& hp = m.hparams();
    begin_forward(m, st);
    for (int64_t il = forward_gpu(m, st); il < hp.n_layer; ++il) {
        const LayerWeights& w = m.layers()[il];
        project_qkv(m, w, st);
        rms_norm(st.q, w.q_norm.data(), st.n_tokens * hp.n_head, hp.head_dim, hp.rms_eps, st.q);
        rms_norm(st.k, w.k_norm.data(), st.n_tokens * hp.n_head_kv, hp.head_dim, hp.rms_eps, st.k);
        attend(m, w, il, st);
        ffn_swiglu(m, w, st);
    }
    if (!gpu_did_output(m, st)) output_logits(m, st);
}

}  // namespace

const ArchSpec kArchQwen3 = {"qwen3", qwen3_hparams, qwen3_layer, qwen3_forward};

}  // namespace bonsai
