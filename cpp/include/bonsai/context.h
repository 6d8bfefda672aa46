// A Context runs a shared, immutable Model: it owns everything mutable — the KV cache, the scratch
// buffers of one batch chunk, the thread pool and the logits of the last decode. Both the cache
// and the scratch buffers are allocated once, here, for n_ctx cells and n_batch tokens; creating a
// context that does not fit in the available memory is refused with the numbers.
//
// decode() takes tokens of one or more sequences (each token has its own position and sequence
// id), validates the whole batch before touching any state, then runs it in chunks of n_batch
// tokens. Positions of a sequence must increase past what the cache already holds for it.
//
// embed() is the embeddings mode: the same forward, but the output rows are the final hidden state
// after output_norm (the vector the LM head multiplies) and the head itself is never run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bonsai/kv_cache.h"
#include "bonsai/model.h"
#include "bonsai/ops.h"
#include "bonsai/recurrent_state.h"
#include "bonsai/thread_pool.h"
#include "bonsai/types.h"

namespace bonsai {

struct ContextParams {
    int n_ctx = 4096;        // KV cells (tokens, summed over all sequences)
    int n_batch = 512;       // tokens per forward chunk
    int n_seq_max = 1;       // sequences ids 0 .. n_seq_max-1 (at most 64)
    int n_threads = 0;       // 0 = hardware concurrency
    GgmlType type_k = TYPE_F16;  // F16 or Q8_0
    GgmlType type_v = TYPE_F16;
    ActMode act_mode = ActMode::INT8;  // activations of the matmuls: per-token INT8 or float
    bool flash_attn = false;           // one-pass online-softmax attention
    bool cuda_graph = true;            // GPU layers: replay each step shape as a captured CUDA graph
};

struct Batch {
    std::vector<int32_t> token;
    std::vector<int32_t> pos;
    std::vector<int32_t> seq_id;
    std::vector<uint8_t> logits;  // 1 = keep this token's logits; empty = only the last token

    void add(int32_t tok, int32_t p, int32_t seq, bool want_logits) {
        token.push_back(tok);
        pos.push_back(p);
        seq_id.push_back(seq);
        logits.push_back(want_logits ? 1 : 0);
    }
    void clear() {
        token.clear();
        pos.clear();
        seq_id.clear();
        logits.clear();
    }
    size_t size() const { return token.size(); }
};

struct ContextMemory {
    uint64_t kv_bytes = 0;       // K and V buffers (host; the layers that run on the CPU)
    uint64_t compute_bytes = 0;  // activation scratch for n_batch tokens + attention scratch
    uint64_t logits_bytes = 0;   // output buffer currently allocated
    uint64_t recurrent_bytes = 0;  // qwen35: conv + delta state of every sequence, with one checkpoint each
    // Device memory of the offloaded layers (CUDA builds; one allocation, see gpu_backend.h).
    uint64_t gpu_kv_bytes = 0;
    uint64_t gpu_recurrent_bytes = 0;  // qwen35: the offloaded GDN layers' state, checkpoints included
    uint64_t gpu_compute_bytes = 0;
    uint64_t gpu_logits_bytes = 0;
    uint64_t gpu_allocated_bytes = 0;  // gpu_kv + gpu_recurrent + gpu_compute + gpu_logits
};

// How embed() pools the per-token hidden states; the values of llama.cpp's <arch>.pooling_type key.
enum class Pooling : int {
    NONE = 0,  // one vector per token
    MEAN = 1,  // the mean over the tokens
    CLS = 2,   // the first token's
    LAST = 3,  // the last token's
    RANK = 4,  // a reranker's score head: not supported (refused)
};

// The file's <arch>.pooling_type, NONE when the key is absent (llama.cpp's default for a model that
// does not declare one). Throws for a value outside 0..4.
Pooling model_pooling(const Model& model);
// "none", "mean", "cls", "last", "rank"; and back (throws naming the accepted names).
const char* pooling_name(Pooling p);
Pooling parse_pooling(const std::string& name);
// Pools n rows of width n_embd (row-major) into out: NONE copies all n rows, MEAN / CLS / LAST
// give one row. Throws for RANK and for n == 0.
void pool_rows(const float* rows, int64_t n, int64_t n_embd, Pooling pooling, std::vector<float>& out);

class GpuContext;

class Context {
public:
    Context(std::shared_ptr<const Model> model, const ContextParams& params);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    // Runs the batch; afterwards logits(i) is valid for every flagged token i of it.
    void decode(const Batch& batch);
    // Logits (n_vocab floats) of token i of the last batch; i < 0 counts outputs from the end
    // (-1 = the last flagged token). Throws if the token was not flagged.
    const float* logits(int32_t i) const;
    int64_t n_outputs() const { return n_outputs_; }
    // Embeddings of one input: its tokens run as sequence seq at positions 0..n-1 and the rows are
    // the hidden states after output_norm, pooled by `pooling` ([n, n_embd] for NONE, else
    // [1, n_embd]); the LM head is skipped. seq must be empty and is emptied again afterwards, also
    // when the call fails, so the KV cells and recurrent state of every other sequence are
    // untouched. The last batch's logits are gone afterwards (n_outputs() == 0).
    std::vector<float> embed(const std::vector<int32_t>& tokens, int seq, Pooling pooling);
    // All output rows of the last batch, in batch order: [n_outputs, n_vocab].
    const float* all_logits() const { return logits_.data(); }

    // Models with recurrent layers (qwen35) keep a state per sequence that cannot be rewound to an
    // arbitrary position: seq_rm may drop a sequence's tail only back to its checkpoint (see
    // bonsai/recurrent_state.h) or to 0, and seq_cp copies a whole sequence, or its prefix up to the
    // checkpoint, into an empty one; anything else is refused before any state changes.
    void seq_rm(int seq, int32_t p0 = -1, int32_t p1 = -1);
    void seq_cp(int src, int dst, int32_t p0 = -1, int32_t p1 = -1);
    void seq_keep(int seq);
    void clear();
    int32_t seq_pos_max(int seq) const;  // -1 if the sequence is empty
    // The longest prefix of at most n tokens of sequence seq that can be kept exactly (seq_rm(seq,
    // m, -1) and seq_cp(seq, other, 0, m) succeed for the returned m): n for attention-only models;
    // for recurrent ones n when it keeps every token, else the checkpoint's prefix, else 0.
    int32_t seq_reusable(int seq, int32_t n) const;
    bool recurrent() const { return rs_ != nullptr; }

    // A copy of sequence seq's state as bytes (context_state.cpp): its KV rows with their positions
    // and, for recurrent models, its recurrent state and checkpoint, behind a header naming the
    // model and cache layout. load_seq_state replaces sequence seq with such a copy, so it then
    // continues exactly as the saved sequence would have; a copy from another model or cache layout,
    // or one that does not fit, is refused before anything changes. Host-only (no GPU layers).
    std::vector<uint8_t> save_seq_state(int seq) const;
    void load_seq_state(int seq, const uint8_t* data, size_t size);

    const Model& model() const { return *model_; }
    std::shared_ptr<const Model> model_ptr() const { return model_; }
    const ContextParams& params() const { return params_; }
    int n_ctx() const { return params_.n_ctx; }
    int n_threads() const { return pool_->size(); }
    const KvCache& kv_cache() const { return *kv_; }
    ContextMemory memory_report() const;

    // Bytes a context of these parameters allocates for this model (KV + compute), for planning.
    static ContextMemory plan_memory(const Model& model, const ContextParams& params);

private:
    void check_seq(int seq, const char* what) const;
    // decode(), writing width floats per flagged token into out: the logits (n_vocab) or, with
    // embeddings, the normed hidden state (n_embd) without the head.
    void decode_rows(const Batch& batch, bool embeddings, std::vector<float>& out);
    void decode_chunk(const Batch& batch, size_t begin, size_t end, const std::vector<int32_t>& cells,
                      const std::vector<uint8_t>& want, int64_t first_out, float* embd);
    void check_recurrent_rm(int seq, int32_t p0, int32_t p1) const;
    void apply_recurrent_rm(int seq, int32_t p0, int32_t p1);
    // RecurrentState's operations on the host state and, with offloaded GDN layers, on the
    // device state (gpu_backend.h), so that both copies always describe the same history.
    void state_reset(int seq);
    void state_copy(int src, int dst);
    void state_save_checkpoint(int seq, int32_t pos);
    void state_restore_checkpoint(int seq);
    void state_load_checkpoint_of(int src, int dst);

    std::shared_ptr<const Model> model_;
    ContextParams params_;
    std::unique_ptr<ThreadPool> pool_;
    std::unique_ptr<KvCache> kv_;
    std::unique_ptr<RecurrentState> rs_;  // qwen35: the GDN layers' state (null for other models)
    std::vector<float> compute_;
    size_t attn_scratch_per_thread_ = 0;
    std::vector<float> logits_;
    std::vector<float> embd_;  // embed(): the output rows before pooling [n_out, n_embd]
    std::vector<int32_t> out_index_;  // batch index -> output row, -1 if not flagged
    int64_t n_outputs_ = 0;
    std::shared_ptr<GpuContext> gpu_;  // device KV + buffers when the model has GPU layers
};

}  // namespace bonsai
