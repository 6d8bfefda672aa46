// The architecture table: what differs between llama, qwen2, qwen3 and qwen35 — hyperparameter reading,
// the per-layer tensor list and the forward pass of one batch — one file per architecture
// (llama.cpp, qwen2.cpp, qwen3.cpp, qwen35.cpp). The pieces they share (common hyperparameters, the common
// tensor list, embedding, the attention and SwiGLU blocks, the output head) are in arch_common.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../layers.h"
#include "bonsai/gguf.h"
#include "bonsai/kv_cache.h"
#include "bonsai/model.h"
#include "bonsai/ops.h"
#include "bonsai/recurrent_state.h"
#include "bonsai/thread_pool.h"

namespace bonsai {

class ModelLoader;
class GpuContext;

// One chunk of a batch (at most n_batch tokens) and the scratch buffers it runs in. All buffers
// are owned by the Context and sized for n_batch tokens when it is created.
struct ForwardState {
    int64_t n_tokens = 0;
    const int32_t* token = nullptr;     // [n_tokens]
    const int32_t* pos = nullptr;       // [n_tokens]
    const uint64_t* seq_mask = nullptr; // [n_tokens]
    const int32_t* cell = nullptr;      // [n_tokens] KV cell of each token (already claimed)
    int64_t n_out = 0;
    const int32_t* out_rows = nullptr;  // [n_out] chunk rows whose logits are wanted
    float* logits = nullptr;            // [n_out, n_vocab]
    float* embd = nullptr;              // embeddings mode (set: logits is null): [n_out, n_embd] normed x, no head

    KvCache* kv = nullptr;
    ThreadPool* pool = nullptr;
    ActMode act = ActMode::INT8;
    bool flash_attn = false;

    float* x = nullptr;      // [n, n_embd] residual stream
    float* cur = nullptr;    // [n, max(n_embd, n_embd_q)] normed input / projected output
    float* q = nullptr;      // [n, n_embd_q]
    float* k = nullptr;      // [n, n_embd_kv]
    float* v = nullptr;      // [n, n_embd_kv]
    float* attn = nullptr;   // [n, n_embd_q]
    float* gate = nullptr;   // [n, n_ff]
    float* up = nullptr;     // [n, n_ff]
    float* rope_cs = nullptr;  // [n, n_rot] cos/sin table
    float* attn_scratch = nullptr;
    size_t attn_scratch_per_thread = 0;
    // qwen35 only (null otherwise): the gated attention's query+gate rows and gate, the GDN
    // projections (qkv = conv input/output, z, alpha -> g, beta), its output, and the state.
    float* qg = nullptr;     // [n, 2 * n_embd_q]
    float* qgate = nullptr;  // [n, n_embd_q]
    float* qkv = nullptr;    // [n, ssm_conv_dim]
    float* z = nullptr;      // [n, ssm_v_dim]
    float* alpha = nullptr;  // [n, ssm_n_v_heads]
    float* beta = nullptr;   // [n, ssm_n_v_heads]
    float* o = nullptr;      // [n, ssm_v_dim]
    RecurrentState* rs = nullptr;
    GpuContext* gpu = nullptr;  // device state when the model has GPU layers (CUDA builds)
};

struct ArchSpec {
    const char* name;
    void (*load_hparams)(const GgufFile& f, Hparams& hp);
    void (*load_layer)(ModelLoader& ld, const Hparams& hp, int64_t il, LayerWeights& w);
    void (*forward)(const Model& m, ForwardState& st);
};

extern const ArchSpec kArchLlama;
extern const ArchSpec kArchQwen2;
extern const ArchSpec kArchQwen3;
extern const ArchSpec kArchQwen35;

// The spec of an architecture name; throws listing the supported ones.
const ArchSpec& find_arch(const std::string& name);

// --- shared pieces (arch_common.cpp) ---
// Reads the {arch}.* keys every architecture has (sizes, heads, eps, rope base and scaling).
void read_common_hparams(const GgufFile& f, Hparams& hp);
// attn_norm, attn_q/k/v/output, ffn_norm, ffn_gate/up/down of layer il.
void load_common_layer(ModelLoader& ld, const Hparams& hp, int64_t il, LayerWeights& w);
// x = token_embd[token]; fills the rope table for the chunk's positions.
void begin_forward(const Model& m, ForwardState& st);
// cur = rms_norm(x) * attn_norm; q, k, v = projections of cur (no bias).
void project_qkv(const Model& m, const LayerWeights& w, ForwardState& st);
// Rotates q and k, stores k/v in the cache, attends, x += wo * attention.
void attend(const Model& m, const LayerWeights& w, int64_t il, ForwardState& st);
// The first half of attend: rotates q and k, stores k/v in KV layer kv_layer, attention -> st.attn.
void attention_heads(const Model& m, int64_t kv_layer, ForwardState& st);
// x += wo * st.attn (the second half of attend).
void attention_output(const Model& m, const LayerWeights& w, ForwardState& st);
// Weights that read one input x (at most 4); the folded ones (prism.hadamard) read WHT_B(s ⊙ x).
// The rotation may overwrite x.
void matmul_group(const WeightView* const* ws, const Rotation* const* rs, float* const* ys, int n, float* x,
                  int64_t n_tokens, ForwardState& st);
void matmul_one(const WeightView& w, const Rotation& r, float* x, int64_t n_tokens, float* y, ForwardState& st);
// x += w_down * (silu(w_gate * h) * (w_up * h)) with h = rms_norm(x) * ffn_norm.
void ffn_swiglu(const Model& m, const LayerWeights& w, ForwardState& st);
// logits of the requested rows: output * rms_norm(x) * output_norm; in embeddings mode (st.embd)
// only rms_norm(x) * output_norm of those rows, into st.embd, and the head is skipped.
void output_logits(const Model& m, ForwardState& st);

}  // namespace bonsai
