// Context: batch validation, KV cell assignment, chunked forward passes and the output logits (or,
// for embed(), the pooled hidden states after output_norm).
//
// Compute buffer layout (one float vector, sized for n_batch tokens):
//   x [nb, n_embd] | cur [nb, n_embd] | q [nb, n_embd_q] | k, v [nb, n_embd_kv] | attn [nb, n_embd_q]
//   | gate, up [nb, n_ff] | rope table [nb, n_rot] | attention scratch [n_threads, per-thread size]
// When every layer runs on the GPU only x (the gathered embeddings) and the rope table remain on
// the host. With GPU layers the host KV cache holds only the CPU layers (first_layer = n_gpu) and
// the device memory comes from one allocation per context (bonsai/cuda/gpu_backend.h).
#include "bonsai/context.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <unordered_map>

#include "arch/arch.h"
#ifdef BONSAI_CUDA
#include "bonsai/cuda/gpu_backend.h"
#endif
#include "bonsai/error.h"
#include "sys_memory.h"

namespace bonsai {

namespace {

#ifdef BONSAI_CUDA
// The device figures of a context (planned or allocated) into its memory report.
void add_gpu_memory(ContextMemory& m, const GpuContextMemory& g) {
    m.gpu_kv_bytes = g.kv_bytes;
    m.gpu_recurrent_bytes = g.recurrent_bytes;
    m.gpu_compute_bytes = g.compute_bytes;
    m.gpu_logits_bytes = g.logits_bytes;
    m.gpu_allocated_bytes = g.allocated_bytes;
}
#endif

int resolve_threads(int n) {
    if (n > 0) return n;
    const unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? static_cast<int>(hw) : 1;
}

struct ComputeLayout {
    size_t x, cur, q, k, v, attn, gate, up, rope, scratch, per_thread, total;
    size_t qg, qgate, qkv, z, alpha, beta, o;  // qwen35 only (empty otherwise)
};

ComputeLayout compute_layout(const Hparams& hp, int64_t nb, int64_t n_cells, int n_threads, bool all_gpu) {
    ComputeLayout l{};
    if (all_gpu) {  // the host only gathers embeddings and builds the rope table
        l.x = 0;
        l.rope = nb * hp.n_embd;
        l.total = l.rope + nb * hp.n_rot;
        l.cur = l.q = l.k = l.v = l.attn = l.gate = l.up = l.scratch = l.total;
        l.qg = l.qgate = l.qkv = l.z = l.alpha = l.beta = l.o = l.total;
        return l;
    }
    size_t off = 0;
    auto take = [&](size_t n) {
        const size_t at = off;
        off += n;
        return at;
    };
    l.x = take(nb * hp.n_embd);
    l.cur = take(nb * hp.n_embd);
    l.q = take(nb * hp.n_embd_q());
    l.k = take(nb * hp.n_embd_kv());
    l.v = take(nb * hp.n_embd_kv());
    l.attn = take(nb * hp.n_embd_q());
    l.gate = take(nb * hp.n_ff);
    l.up = take(nb * hp.n_ff);
    l.rope = take(nb * hp.n_rot);
    l.per_thread = attention_scratch_floats(n_cells, hp.n_head, hp.n_head_kv, hp.head_dim);
    l.scratch = take(l.per_thread * n_threads);
    const bool gated = hp.attn_output_gate;
    const bool gdn = hp.n_state_layer > 0;
    l.qg = take(gated ? nb * 2 * hp.n_embd_q() : 0);
    l.qgate = take(gated ? nb * hp.n_embd_q() : 0);
    l.qkv = take(gdn ? nb * hp.ssm_conv_dim() : 0);
    l.z = take(gdn ? nb * hp.ssm_v_dim() : 0);
    l.alpha = take(gdn ? nb * hp.ssm_n_v_heads : 0);
    l.beta = take(gdn ? nb * hp.ssm_n_v_heads : 0);
    l.o = take(gdn ? nb * hp.ssm_v_dim() : 0);
    l.total = off;
    return l;
}

void validate_params(const ContextParams& p) {
    if (p.n_ctx <= 0) throw Error("n_ctx must be positive, got " + std::to_string(p.n_ctx));
    if (p.n_batch <= 0) throw Error("n_batch must be positive, got " + std::to_string(p.n_batch));
    if (p.n_seq_max < 1 || p.n_seq_max > KvCache::kMaxSeq) {
        throw Error("n_seq_max must be between 1 and " + std::to_string(KvCache::kMaxSeq) + ", got " +
                    std::to_string(p.n_seq_max));
    }
    if (p.n_threads < 0) throw Error("n_threads must be >= 0 (0 = all cores), got " + std::to_string(p.n_threads));
}

KvCacheParams kv_params(const Model& m, const ContextParams& p) {
    const Hparams& hp = m.hparams();
    KvCacheParams k;
    k.n_cells = p.n_ctx;
    k.n_layer = hp.kv_layer.empty() ? hp.n_layer : hp.n_kv_layer;  // hybrid models: attention layers only
    k.first_layer = hp.kv_layer.empty() ? m.n_gpu_layers() : hp.kv_layers_below(m.n_gpu_layers());
    k.n_embd_kv = hp.n_embd_kv();
    k.head_dim = hp.head_dim;
    k.type_k = p.type_k;
    k.type_v = p.type_v;
    return k;
}

}  // namespace

ContextMemory Context::plan_memory(const Model& model, const ContextParams& params) {
    validate_params(params);
    const Hparams& hp = model.hparams();
    const int64_t nb = std::min(params.n_batch, params.n_ctx);
    ContextMemory m;
    m.kv_bytes = KvCache::bytes_needed(kv_params(model, params));
    m.compute_bytes = compute_layout(hp, nb, params.n_ctx, resolve_threads(params.n_threads), model.gpu_output())
                          .total * sizeof(float);
    m.logits_bytes = static_cast<uint64_t>(params.n_seq_max) * hp.n_vocab * sizeof(float);
    if (hp.n_state_layer > 0)
        m.recurrent_bytes = RecurrentState::bytes_needed(hp, params.n_seq_max, hp.state_layers_below(model.n_gpu_layers()));
#ifdef BONSAI_CUDA
    if (model.n_gpu_layers() > 0) {
        ContextParams p = params;
        p.n_batch = static_cast<int>(nb);
        add_gpu_memory(m, gpu_context_plan(model, p));
    }
#endif
    return m;
}

Context::Context(std::shared_ptr<const Model> model, const ContextParams& params)
    : model_(std::move(model)), params_(params) {
    if (!model_) throw Error("Context needs a loaded model");
    params_.n_batch = std::min(params_.n_batch, std::max(params_.n_ctx, 1));
    const ContextMemory need = plan_memory(*model_, params_);
    const uint64_t total = need.kv_bytes + need.compute_bytes + need.logits_bytes + need.recurrent_bytes;
    const uint64_t avail = mem_available_bytes();
    if (avail > 0 && total > avail) {
        throw Error("context of " + std::to_string(params_.n_ctx) + " tokens needs " + format_bytes(total) +
                    " (KV cache " + format_bytes(need.kv_bytes) + ", compute buffers " +
                    format_bytes(need.compute_bytes) +
                    (need.recurrent_bytes ? ", recurrent state " + format_bytes(need.recurrent_bytes) : std::string()) +
                    ") but only " + format_bytes(avail) +
                    " of memory is available; use a smaller --ctx-size or --cache-type-k/v q8_0");
    }
#ifdef BONSAI_CUDA
    if (model_->gpu()) {  // first, so that a request the GPU cannot hold allocates nothing on the host
        gpu_ = gpu_context_create(*model_, params_);
        if (model_->params().verbose) {
            const GpuContextMemory g = gpu_context_memory(*gpu_);
            std::fprintf(stderr, "context: GPU KV cache %.1f MiB, compute %.1f MiB, logits %.1f MiB (one allocation of "
                         "%.1f MiB); CPU KV cache %.1f MiB, compute %.1f MiB\n", g.kv_bytes / 1048576.0,
                         g.compute_bytes / 1048576.0, g.logits_bytes / 1048576.0, g.allocated_bytes / 1048576.0,
                         need.kv_bytes / 1048576.0, need.compute_bytes / 1048576.0);
        }
    }
#endif
    const int n_threads = resolve_threads(params_.n_threads);
    pool_ = std::make_unique<ThreadPool>(n_threads);
    pool_->set_inputs_outlive_pool(true);  // the weights belong to model_, released after pool_
    kv_ = std::make_unique<KvCache>(kv_params(*model_, params_));
    // the host state holds the CPU layers' part (all of it without GPU layers); the device state the
    // offloaded layers' part (gpu_context.cu); every operation goes to both (state_* below)
    if (model_->hparams().n_state_layer > 0) {
        const Hparams& hp = model_->hparams();
        rs_ = std::make_unique<RecurrentState>(hp, params_.n_seq_max, hp.state_layers_below(model_->n_gpu_layers()));
    }
    const ComputeLayout l =
        compute_layout(model_->hparams(), params_.n_batch, params_.n_ctx, n_threads, model_->gpu_output());
    compute_.assign(l.total, 0.0f);
    attn_scratch_per_thread_ = l.per_thread;
    logits_.reserve(static_cast<size_t>(params_.n_seq_max) * model_->hparams().n_vocab);
}

Context::~Context() = default;

void Context::check_seq(int seq, const char* what) const {
    if (seq < 0 || seq >= params_.n_seq_max) {
        throw Error(std::string(what) + ": sequence id " + std::to_string(seq) + " is outside 0.." +
                    std::to_string(params_.n_seq_max - 1) + " (raise n_seq_max)");
    }
}

void Context::decode(const Batch& batch) { decode_rows(batch, false, logits_); }

void Context::decode_rows(const Batch& batch, bool embeddings, std::vector<float>& out) {
    const size_t n = batch.token.size();
    if (n == 0) throw Error("decode: the batch is empty");
    if (batch.pos.size() != n || batch.seq_id.size() != n || (!batch.logits.empty() && batch.logits.size() != n)) {
        throw Error("decode: batch arrays differ in length (token " + std::to_string(n) + ", pos " +
                    std::to_string(batch.pos.size()) + ", seq_id " + std::to_string(batch.seq_id.size()) +
                    ", logits " + std::to_string(batch.logits.size()) + ")");
    }
    const int64_t n_vocab = model_->hparams().n_vocab;
    std::unordered_map<int, int32_t> last_pos;
    for (size_t i = 0; i < n; ++i) {
        if (batch.token[i] < 0 || batch.token[i] >= n_vocab) {
            throw Error("decode: token id " + std::to_string(batch.token[i]) + " at batch index " +
                        std::to_string(i) + " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
        }
        const int seq = batch.seq_id[i];
        check_seq(seq, "decode");
        if (batch.pos[i] < 0) {
            throw Error("decode: position " + std::to_string(batch.pos[i]) + " at batch index " +
                        std::to_string(i) + " is negative");
        }
        auto it = last_pos.find(seq);
        const int32_t prev = it != last_pos.end() ? it->second : kv_->seq_pos_max(seq);
        if (batch.pos[i] <= prev) {
            throw Error("decode: position " + std::to_string(batch.pos[i]) + " of sequence " + std::to_string(seq) +
                        " does not follow its previous position " + std::to_string(prev) +
                        "; positions of a sequence must increase (seq_rm the tail to rewrite it)");
        }
        last_pos[seq] = batch.pos[i];
    }
    std::vector<int32_t> cells;
    if (!kv_->find_free(static_cast<int64_t>(n), cells)) {
        throw Error("decode: context overflow: the batch needs " + std::to_string(n) + " KV cells but only " +
                    std::to_string(kv_->n_free()) + " of n_ctx = " + std::to_string(params_.n_ctx) +
                    " are free; use a larger context or remove tokens with seq_rm");
    }

    out_index_.assign(n, -1);
    n_outputs_ = 0;
    for (size_t i = 0; i < n; ++i) {
        const bool want = batch.logits.empty() ? (i + 1 == n) : batch.logits[i] != 0;
        if (want) out_index_[i] = static_cast<int32_t>(n_outputs_++);
    }
    const int64_t width = embeddings ? model_->hparams().n_embd : n_vocab;  // floats per output row
    out.resize(static_cast<size_t>(n_outputs_) * width);

    // Processing order: batch order, except that with recurrent layers the last token of every
    // sequence that has two or more tokens here (a prompt) runs after the others, so that the
    // sequence's state can be checkpointed just before it (bonsai/recurrent_state.h).
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    size_t n_first = n;
    std::vector<std::pair<int, int32_t>> checkpoints;  // (seq, position) after the first pass
    if (rs_) {
        std::unordered_map<int, size_t> count, last;
        for (size_t i = 0; i < n; ++i) {
            ++count[batch.seq_id[i]];
            last[batch.seq_id[i]] = i;
        }
        std::vector<uint8_t> deferred(n, 0);
        for (const auto& [seq, c] : count) {
            if (c >= 2) deferred[last[seq]] = 1;
        }
        order.clear();
        for (size_t i = 0; i < n; ++i) if (!deferred[i]) order.push_back(i);
        n_first = order.size();
        for (size_t i = 0; i < n; ++i) if (deferred[i]) order.push_back(i);
        std::unordered_map<int, int32_t> before_last;
        for (size_t j = 0; j < n_first; ++j) {
            const size_t i = order[j];
            if (count[batch.seq_id[i]] >= 2) before_last[batch.seq_id[i]] = batch.pos[i];
        }
        for (const auto& [seq, p] : before_last) checkpoints.emplace_back(seq, p);
    }
    const bool identity = n_first == n || std::is_sorted(order.begin(), order.end());
    Batch run;
    std::vector<int32_t> run_cells(n);
    std::vector<uint8_t> want(n);
    for (size_t j = 0; j < n; ++j) {
        const size_t i = order[j];
        run.add(batch.token[i], batch.pos[i], batch.seq_id[i], out_index_[i] >= 0);
        run_cells[j] = cells[i];
        want[j] = out_index_[i] >= 0;
    }

    size_t claimed = 0;
    try {
        int64_t outs_before = 0;
        auto run_range = [&](size_t begin, size_t end) {
            for (size_t b = begin; b < end; b += params_.n_batch) {
                const size_t e = std::min(end, b + static_cast<size_t>(params_.n_batch));
                for (size_t j = b; j < e; ++j) {
                    kv_->claim(run_cells[j], run.pos[j], uint64_t{1} << run.seq_id[j]);
                    ++claimed;
                }
                decode_chunk(run, b, e, run_cells, want, outs_before,
                             embeddings ? out.data() + outs_before * width : nullptr);
                for (size_t j = b; j < e; ++j) outs_before += want[j];
            }
        };
        run_range(0, n_first);
        for (const auto& [seq, p] : checkpoints) state_save_checkpoint(seq, p);
        run_range(n_first, n);
    } catch (...) {
        for (size_t j = 0; j < claimed; ++j) kv_->claim(run_cells[j], -1, 0);
        if (rs_) {  // the state has absorbed part of the batch: those sequences start over
            for (size_t i = 0; i < n; ++i) {
                kv_->seq_rm(batch.seq_id[i], -1, -1);
                state_reset(batch.seq_id[i]);
            }
        }
        n_outputs_ = 0;
        throw;
    }
    if (!identity && n_outputs_ > 0) {  // output rows were written in processing order
        std::vector<float> produced(out);
        int64_t k = 0;
        for (size_t j = 0; j < n; ++j) {
            if (!want[j]) continue;
            std::copy_n(produced.begin() + k * width, width, out.begin() + out_index_[order[j]] * width);
            ++k;
        }
    }
}

void Context::decode_chunk(const Batch& batch, size_t begin, size_t end, const std::vector<int32_t>& cells,
                           const std::vector<uint8_t>& want, int64_t first_out, float* embd) {
    const Hparams& hp = model_->hparams();
    const int64_t n = static_cast<int64_t>(end - begin);
    std::vector<uint64_t> masks(n);
    std::vector<int32_t> out_rows;
    for (int64_t i = 0; i < n; ++i) {
        masks[i] = uint64_t{1} << batch.seq_id[begin + i];
        if (want[begin + i]) out_rows.push_back(static_cast<int32_t>(i));
    }
    const ComputeLayout l = compute_layout(hp, params_.n_batch, params_.n_ctx, pool_->size(), model_->gpu_output());
    float* base = compute_.data();

    ForwardState st;
    st.n_tokens = n;
    st.token = batch.token.data() + begin;
    st.pos = batch.pos.data() + begin;
    st.seq_mask = masks.data();
    st.cell = cells.data() + begin;
    st.n_out = static_cast<int64_t>(out_rows.size());
    st.out_rows = out_rows.data();
    st.logits = embd ? nullptr : logits_.data() + first_out * hp.n_vocab;
    st.embd = embd;
    st.kv = kv_.get();
    st.pool = pool_.get();
    st.act = params_.act_mode;
    st.flash_attn = params_.flash_attn;
    st.x = base + l.x;
    st.cur = base + l.cur;
    st.q = base + l.q;
    st.k = base + l.k;
    st.v = base + l.v;
    st.attn = base + l.attn;
    st.gate = base + l.gate;
    st.up = base + l.up;
    st.rope_cs = base + l.rope;
    st.attn_scratch = base + l.scratch;
    st.attn_scratch_per_thread = l.per_thread;
    st.gpu = gpu_.get();
    st.qg = base + l.qg;
    st.qgate = base + l.qgate;
    st.qkv = base + l.qkv;
    st.z = base + l.z;
    st.alpha = base + l.alpha;
    st.beta = base + l.beta;
    st.o = base + l.o;
    st.rs = rs_.get();
    model_->arch().forward(*model_, st);
}

std::vector<float> Context::embed(const std::vector<int32_t>& tokens, int seq, Pooling pooling) {
    check_seq(seq, "embed");
    if (tokens.empty()) throw Error("embed: the input has no tokens");
    if (pooling == Pooling::RANK) {
        throw Error("embed: pooling 'rank' is a reranker's score head, which this engine does not run; "
                    "use none, mean, cls or last");
    }
    if (kv_->seq_pos_max(seq) >= 0) {
        throw Error("embed: sequence " + std::to_string(seq) + " holds tokens; embeddings run on an empty "
                    "sequence (seq_rm it first, or use a free one)");
    }
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n > kv_->n_free()) {
        throw Error("embed: the input has " + std::to_string(n) + " tokens but only " +
                    std::to_string(kv_->n_free()) + " of n_ctx = " + std::to_string(params_.n_ctx) +
                    " KV cells are free; truncate the input or use a larger context");
    }
    Batch b;
    for (int64_t i = 0; i < n; ++i) {
        const bool want = pooling == Pooling::NONE || pooling == Pooling::MEAN ||
                          (pooling == Pooling::CLS && i == 0) || (pooling == Pooling::LAST && i + 1 == n);
        b.add(tokens[i], static_cast<int32_t>(i), seq, want);
    }
    try {
        decode_rows(b, true, embd_);
    } catch (...) {
        n_outputs_ = 0;
        out_index_.clear();
        seq_rm(seq, -1, -1);
        throw;
    }
    const int64_t rows = n_outputs_;
    n_outputs_ = 0;  // the rows are embeddings, not logits: logits(i) must not hand them out
    out_index_.clear();
    seq_rm(seq, -1, -1);
    std::vector<float> result;
    // the flagged rows are the ones pooling reads: all of them (none, mean) or the one token
    pool_rows(embd_.data(), rows, model_->hparams().n_embd,
              pooling == Pooling::CLS || pooling == Pooling::LAST ? Pooling::NONE : pooling, result);
    return result;
}

Pooling model_pooling(const Model& model) {
    const std::string key = model.hparams().arch + ".pooling_type";
    const uint64_t v = model.gguf().get_u64(key, 0);
    if (v > 4) {
        throw Error(key + " = " + std::to_string(v) + " is not a pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)");
    }
    return static_cast<Pooling>(v);
}

const char* pooling_name(Pooling p) {
    switch (p) {
        case Pooling::NONE: return "none";
        case Pooling::MEAN: return "mean";
        case Pooling::CLS: return "cls";
        case Pooling::LAST: return "last";
        case Pooling::RANK: return "rank";
    }
    return "unknown";
}

Pooling parse_pooling(const std::string& name) {
    for (Pooling p : {Pooling::NONE, Pooling::MEAN, Pooling::CLS, Pooling::LAST, Pooling::RANK}) {
        if (name == pooling_name(p)) return p;
    }
    throw Error("unknown pooling '" + name + "'; use none, mean, cls or last");
}

void pool_rows(const float* rows, int64_t n, int64_t n_embd, Pooling pooling, std::vector<float>& out) {
    if (n <= 0) throw Error("pool_rows: no rows to pool");
    switch (pooling) {
        case Pooling::NONE:
            out.assign(rows, rows + n * n_embd);
            return;
        case Pooling::CLS:
            out.assign(rows, rows + n_embd);
            return;
        case Pooling::LAST:
            out.assign(rows + (n - 1) * n_embd, rows + n * n_embd);
            return;
        case Pooling::MEAN: {
            std::vector<double> sum(n_embd, 0.0);  // double: long inputs do not lose the small rows
            for (int64_t t = 0; t < n; ++t) {
                for (int64_t j = 0; j < n_embd; ++j) sum[j] += rows[t * n_embd + j];
            }
            out.resize(n_embd);
            for (int64_t j = 0; j < n_embd; ++j) out[j] = static_cast<float>(sum[j] / static_cast<double>(n));
            return;
        }
        case Pooling::RANK: break;
    }
    throw Error(std::string("pool_rows: pooling '") + pooling_name(pooling) + "' is not supported");
}

const float* Context::logits(int32_t i) const {
    const int64_t n_vocab = model_->hparams().n_vocab;
    if (i < 0) {
        if (-static_cast<int64_t>(i) > n_outputs_) {
            throw Error("logits(" + std::to_string(i) + "): the last batch produced only " +
                        std::to_string(n_outputs_) + " output rows");
        }
        return logits_.data() + (n_outputs_ + i) * n_vocab;
    }
    if (static_cast<size_t>(i) >= out_index_.size() || out_index_[i] < 0) {
        throw Error("logits(" + std::to_string(i) + "): token " + std::to_string(i) +
                    " of the last batch was not flagged for logits");
    }
    return logits_.data() + static_cast<int64_t>(out_index_[i]) * n_vocab;
}

// Recurrent models: which removals keep the state exact (see context.h); checked for every
// sequence involved before anything changes.
void Context::check_recurrent_rm(int seq, int32_t p0, int32_t p1) const {
    const int32_t pos_max = kv_->seq_pos_max(seq);
    const int32_t from = std::max<int32_t>(p0, 0);
    if (from > pos_max || (p1 >= 0 && p1 <= from)) return;  // removes nothing
    if (p1 >= 0 && p1 <= pos_max) {
        throw Error("seq_rm: sequence " + std::to_string(seq) + " of this recurrent (" + model_->hparams().arch +
                    ") model can only drop a tail: removing positions [" + std::to_string(from) + ", " +
                    std::to_string(p1) + ") would keep later tokens whose state depends on them");
    }
    if (from == 0 || rs_->checkpoint_pos(seq) == from - 1) return;
    throw Error("seq_rm: the recurrent state of sequence " + std::to_string(seq) + " cannot be rewound to position " +
                std::to_string(from) + " (its checkpoint is at " + std::to_string(rs_->checkpoint_pos(seq)) +
                "); keep seq_reusable() tokens, or remove the whole sequence");
}

void Context::apply_recurrent_rm(int seq, int32_t p0, int32_t p1) {
    const int32_t pos_max = kv_->seq_pos_max(seq);
    const int32_t from = std::max<int32_t>(p0, 0);
    if (from > pos_max || (p1 >= 0 && p1 <= from)) return;
    if (from == 0) state_reset(seq);
    else state_restore_checkpoint(seq);
}

void Context::state_reset(int seq) {
    rs_->reset(seq);
#ifdef BONSAI_CUDA
    if (gpu_) gpu_state_reset(*gpu_, seq);
#endif
}

void Context::state_copy(int src, int dst) {
    rs_->copy(src, dst);
#ifdef BONSAI_CUDA
    if (gpu_) gpu_state_copy(*gpu_, src, dst);
#endif
}

void Context::state_save_checkpoint(int seq, int32_t pos) {
    rs_->save_checkpoint(seq, pos);
#ifdef BONSAI_CUDA
    if (gpu_) gpu_state_save_checkpoint(*gpu_, seq);
#endif
}

void Context::state_restore_checkpoint(int seq) {
    rs_->restore_checkpoint(seq);
#ifdef BONSAI_CUDA
    if (gpu_) gpu_state_restore_checkpoint(*gpu_, seq);
#endif
}

void Context::state_load_checkpoint_of(int src, int dst) {
    rs_->load_checkpoint_of(src, dst);
#ifdef BONSAI_CUDA
    if (gpu_) gpu_state_load_checkpoint_of(*gpu_, src, dst);
#endif
}

void Context::seq_rm(int seq, int32_t p0, int32_t p1) {
    if (seq >= 0) check_seq(seq, "seq_rm");
    if (rs_) {
        const int first = seq < 0 ? 0 : seq, last = seq < 0 ? params_.n_seq_max - 1 : seq;
        for (int s = first; s <= last; ++s) check_recurrent_rm(s, p0, p1);
        for (int s = first; s <= last; ++s) apply_recurrent_rm(s, p0, p1);
    }
    kv_->seq_rm(seq, p0, p1);
}

void Context::seq_cp(int src, int dst, int32_t p0, int32_t p1) {
    check_seq(src, "seq_cp");
    check_seq(dst, "seq_cp");
    if (rs_ && src != dst) {
        const int32_t pos_max = kv_->seq_pos_max(src);
        if (kv_->seq_pos_max(dst) >= 0) {
            throw Error("seq_cp: sequence " + std::to_string(dst) + " of this recurrent (" + model_->hparams().arch +
                        ") model is not empty; seq_rm it first (a recurrent state cannot merge two histories)");
        }
        const bool from_start = p0 <= 0;
        const int32_t ckpt = rs_->checkpoint_pos(src);
        if (from_start && (p1 < 0 || p1 > pos_max)) {
            state_copy(src, dst);
        } else if (from_start && ckpt >= 0 && p1 == ckpt + 1) {
            state_load_checkpoint_of(src, dst);
        } else {
            throw Error("seq_cp: this recurrent (" + model_->hparams().arch + ") model can copy sequence " +
                        std::to_string(src) + " whole or up to its checkpoint (" + std::to_string(ckpt + 1) +
                        " tokens), not positions [" + std::to_string(p0) + ", " + std::to_string(p1) +
                        "); use seq_reusable()");
        }
    }
    kv_->seq_cp(src, dst, p0, p1);
}

void Context::seq_keep(int seq) {
    check_seq(seq, "seq_keep");
    if (rs_) {
        for (int s = 0; s < params_.n_seq_max; ++s) if (s != seq) state_reset(s);
    }
    kv_->seq_keep(seq);
}

void Context::clear() {
    kv_->clear();
    if (rs_) {
        for (int s = 0; s < params_.n_seq_max; ++s) state_reset(s);
    }
    n_outputs_ = 0;
    out_index_.clear();
}

int32_t Context::seq_pos_max(int seq) const {
    check_seq(seq, "seq_pos_max");
    return kv_->seq_pos_max(seq);
}

int32_t Context::seq_reusable(int seq, int32_t n) const {
    check_seq(seq, "seq_reusable");
    if (n <= 0) return 0;
    if (!rs_ || n > kv_->seq_pos_max(seq)) return n;
    const int32_t ckpt = rs_->checkpoint_pos(seq);
    return ckpt >= 0 && ckpt + 1 <= n ? ckpt + 1 : 0;
}

ContextMemory Context::memory_report() const {
    ContextMemory m;
    m.kv_bytes = kv_->bytes();
    m.compute_bytes = compute_.size() * sizeof(float);
    m.logits_bytes = logits_.capacity() * sizeof(float);
    m.recurrent_bytes = rs_ ? rs_->bytes() : 0;
#ifdef BONSAI_CUDA
    if (gpu_) {
        add_gpu_memory(m, gpu_context_memory(*gpu_));
    }
#endif
    return m;
}

}  // namespace bonsai
