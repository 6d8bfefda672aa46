// qwen2 (Qwen1.5/2/2.5): the llama block with biases on the q, k and v projections and rotary
// positions in the NEOX (rotate-half) layout, which the Hugging Face weights use unpermuted.
#include "../forward_gpu.h"
#include "../model_loader.h"
#include "arch.h"

namespace bonsai {

namespace {

void qwen2_hparams(const GgufFile& f, Hparams& hp) {
    read_common_hparams(f, hp);
    hp.rope_type = RopeType::NEOX;
}

void qwen2_layer(ModelLoader& ld, const Hparams& hp, int64_t il, LayerWeights& w) {
    load_common_layer(ld, hp, il, w);
    const std::string b = "blk." + std::to_string(il) + ".";
    w.bq = ld.vector(b + "attn_q.bias", hp.n_embd_q());
    w.bk = ld.vector(b + "attn_k.bias", hp.n_embd_kv());
    w.bv = ld.vector(b + "attn_v.bias", hp.n_embd_kv());
}

void qwen2_forward(const Model& m, ForwardState& st) {
    const Hparams& hp = m.hparams();
    begin_forward(m, st);
    for (int64_t il = forward_gpu(m, st); il < hp.n_layer; ++il) {
        const LayerWeights& w = m.layers()[il];
        project_qkv(m, w, st);
        add_bias(st.q, w.bq.data(), st.n_tokens, hp.n_embd_q());
        add_bias(st.k, w.bk.data(), st.n_tokens, hp.n_embd_kv());
        add_bias(st.v, w.bv.data(), st.n_tokens, hp.n_embd_kv());
        attend(m, w, il, st);
        ffn_swiglu(m, w, st);
    }
    if (!gpu_did_output(m, st)) output_logits(m, st);
}

}  // namespace

const ArchSpec kArchQwen2 = {"qwen2", qwen2_hparams, qwen2_layer, qwen2_forward};

}  // namespace bonsai
