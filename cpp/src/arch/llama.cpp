// llama (Llama 1/2/3, Mistral): pre-norm decoder, RMSNorm, rotary positions in the "normal"
// (adjacent-pair) layout — the converter permutes the q/k rows from Hugging Face's rotate_half
// order, as llama.cpp's does — grouped-query attention, SwiGLU feed-forward, optional rope_freqs
// (llama3 frequency factors) and an optional tied output head.
#include "../forward_gpu.h"
#include "../model_loader.h"
#include "arch.h"

namespace bonsai {

namespace {

void llama_hparams(const GgufFile& f, Hparams& hp) {
    read_common_hparams(f, hp);
    hp.rope_type = RopeType::NORMAL;
}

void llama_layer(ModelLoader& ld, const Hparams& hp, int64_t il, LayerWeights& w) {
    load_common_layer(ld, hp, il, w);
}

void llama_forward(const Model& m, ForwardState& st) {
    begin_forward(m, st);
    for (int64_t il = forward_gpu(m, st); il < m.hparams().n_layer; ++il) {
        const LayerWeights& w = m.layers()[il];
        project_qkv(m, w, st);
        attend(m, w, il, st);
        ffn_swiglu(m, w, st);
    }
    if (!gpu_did_output(m, st)) output_logits(m, st);
}

}  // namespace

const ArchSpec kArchLlama = {"llama", llama_hparams, llama_layer, llama_forward};

}  // namespace bonsai
