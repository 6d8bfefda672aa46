// The per-Context device allocation (GpuContext): KV cache of the offloaded layers and every GPU
// compute buffer, for n_ctx cells and nb = n_batch tokens per chunk.
//
// Layout, each piece 256-byte aligned, in this order:
//   KV      K [n_gpu][n_ctx][row_bytes(type_k, n_embd_kv)], V likewise (the host cache layout;
//           qwen35: n_gpu = the offloaded attention layers, Hparams::kv_layers_below)
//   recurrent (qwen35 with offloaded GDN layers) live state [n_seq_max][per_seq] float32, then one
//           checkpoint of the same size: RecurrentState's per-sequence layout for the offloaded
//           GDN layers [0, n_state): n_state conv windows [kernel-1][conv_dim], then n_state delta
//           states [n_v_heads][dv][dk]
//   compute x, cur [nb, n_embd] | q, attn [nb, n_embd_q] | k, v [nb, n_embd_kv] | gate, up
//           [nb, n_ff] | rope table [nb, n_rot] | int8 activations [nb * max(n_embd, n_embd_q,
//           n_ff)] + scales [nb] | token pos, cell, output row (int32 [nb]) and sequence mask
//           (uint64 [nb]) | cell pos (int32 [n_ctx]) and sequence masks (uint64 [n_ctx]) | the
//           step's used-cell count (int32 [1]) | qwen35 models only: token sequence ids (int32
//           [nb]), query+gate [nb, 2 n_embd_q], gate [nb, n_embd_q], qkv [nb, conv_dim], z [nb, v_dim],
//           alpha, beta [nb, n_v_heads], o [nb, v_dim] | with
//           flash attention, its split partials (float [flash_partial_floats(head_dim)], fixed:
//           the split count adapts so that no grid needs more)
//   logits  [min(nb, 64), n_vocab] float32, only with the output head on the GPU (the head runs
//           over the wanted rows 64 at a time)
// Host side: one pinned allocation with the staging buffers of the step inputs (x, rope table,
// token pos / cell / output rows / masks, cell pos / masks, used-cell count; StepStaging), and
// the context's own stream. Neither is device memory, so neither is in the figures.
// Neither attention kernel keeps a score matrix (one-pass online softmax), so nothing grows with
// n_ctx except the KV cache and the cell metadata.
#include <algorithm>
#include <cstdio>

#include "bonsai/model.h"
#include "cuda_common.cuh"
#include "gpu_state.cuh"

namespace bonsai {

namespace {

constexpr int64_t kLogitsRows = 64;

// Computes the layout; with base == nullptr only the sizes are meaningful.
GpuContextMemory layout(const Model& m, const ContextParams& p, uint8_t* base, GpuContext* c) {
    const Hparams& hp = m.hparams();
    const int64_t n_gpu = m.n_gpu_layers();
    const int64_t n_gpu_kv = hp.kv_layer.empty() ? n_gpu : hp.kv_layers_below(n_gpu);
    const int64_t n_gpu_state = hp.state_layers_below(n_gpu);
    const bool hybrid = hp.n_state_layer > 0;
    const int64_t nb = std::min(p.n_batch, p.n_ctx), n_ctx = p.n_ctx;
    const size_t krb = type_row_bytes(p.type_k, hp.n_embd_kv()), vrb = type_row_bytes(p.type_v, hp.n_embd_kv());
    cuda::ArenaPlan plan;
    auto f32 = [&](int64_t n) { return reinterpret_cast<float*>(base + plan.take(sizeof(float) * n)); };
    auto i32 = [&](int64_t n) { return reinterpret_cast<int32_t*>(base + plan.take(sizeof(int32_t) * n)); };
    auto u64 = [&](int64_t n) { return reinterpret_cast<uint64_t*>(base + plan.take(sizeof(uint64_t) * n)); };
    GpuContext tmp;
    GpuContext& g = c ? *c : tmp;
    g.k = base + plan.take(krb * n_gpu_kv * n_ctx);
    g.v = base + plan.take(vrb * n_gpu_kv * n_ctx);
    GpuContextMemory mem;
    mem.kv_bytes = plan.total;
    g.rs_n_state = n_gpu_state;
    g.rs_conv_floats = hp.conv_state_floats();
    g.rs_delta_floats = hp.delta_state_floats();
    g.rs_per_seq = n_gpu_state * (g.rs_conv_floats + g.rs_delta_floats);
    if (g.rs_per_seq > 0) {
        g.rs_live = f32(g.rs_per_seq * p.n_seq_max);
        g.rs_ckpt = f32(g.rs_per_seq * p.n_seq_max);
    }
    const size_t before_compute = (plan.total + cuda::kAlign - 1) / cuda::kAlign * cuda::kAlign;
    mem.recurrent_bytes = g.rs_per_seq > 0 ? before_compute - mem.kv_bytes : 0;
    g.x = f32(nb * hp.n_embd);
    g.cur = f32(nb * hp.n_embd);
    g.q = f32(nb * hp.n_embd_q());
    g.attn = f32(nb * hp.n_embd_q());
    g.kc = f32(nb * hp.n_embd_kv());
    g.vc = f32(nb * hp.n_embd_kv());
    g.gate = f32(nb * hp.n_ff);
    g.up = f32(nb * hp.n_ff);
    g.rope = f32(nb * hp.n_rot);
    // the widest input of an INT8 matmul: n_embd, attn_output's n_embd_q, ffn_down's n_ff, ssm_out's v_dim
    const int64_t act_elems = nb * std::max({hp.n_embd, hp.n_embd_q(), hp.n_ff, hp.ssm_v_dim()});
    g.act_scratch.q = reinterpret_cast<int8_t*>(base + plan.take(act_elems));
    g.act_scratch.scale = f32(nb);
    g.act_scratch.max_elems = act_elems;
    g.act_scratch.max_tokens = nb;
    g.tok_pos = i32(nb);
    g.tok_cell = i32(nb);
    g.out_rows = i32(nb);
    g.tok_mask = u64(nb);
    g.cell_pos = i32(n_ctx);
    g.cell_seq = u64(n_ctx);
    g.n_used = i32(1);
    if (hybrid) {
        g.tok_slot = i32(nb);
        g.qg = f32(nb * 2 * hp.n_embd_q());
        g.qgate = f32(nb * hp.n_embd_q());
        g.qkv = f32(nb * hp.ssm_conv_dim());
        g.z = f32(nb * hp.ssm_v_dim());
        g.alpha = f32(nb * hp.ssm_n_v_heads);
        g.beta = f32(nb * hp.ssm_n_v_heads);
        g.o = f32(nb * hp.ssm_v_dim());
    }
    g.flash_attn = p.flash_attn;
    g.attn_partial_floats = p.flash_attn ? cuda::flash_partial_floats(hp.head_dim) : 0;
    if (p.flash_attn) g.attn_partial = f32(g.attn_partial_floats);
    const size_t before_logits = (plan.total + cuda::kAlign - 1) / cuda::kAlign * cuda::kAlign;
    mem.compute_bytes = before_logits - mem.kv_bytes - mem.recurrent_bytes;
    g.logits_rows = m.gpu_output() ? std::min(nb, kLogitsRows) : 0;
    if (g.logits_rows > 0) g.logits = f32(g.logits_rows * hp.n_vocab);
    mem.logits_bytes = g.logits_rows > 0 ? plan.total - before_logits : 0;
    mem.allocated_bytes = before_logits + mem.logits_bytes;
    g.n_ctx = n_ctx;
    g.n_batch = nb;
    g.act = p.act_mode;
    g.type_k = p.type_k;
    g.type_v = p.type_v;
    g.k_row_bytes = krb;
    g.v_row_bytes = vrb;
    return mem;
}

// Lays out the pinned staging of one step; with base == nullptr only the size is meaningful.
size_t staging_layout(const Hparams& hp, int64_t nb, int64_t n_ctx, uint8_t* base, StepStaging& s) {
    cuda::ArenaPlan plan;
    s.x = reinterpret_cast<float*>(base + plan.take(sizeof(float) * nb * hp.n_embd));
    s.rope = reinterpret_cast<float*>(base + plan.take(sizeof(float) * nb * hp.n_rot));
    s.tok_pos = reinterpret_cast<int32_t*>(base + plan.take(sizeof(int32_t) * nb));
    s.tok_cell = reinterpret_cast<int32_t*>(base + plan.take(sizeof(int32_t) * nb));
    s.out_rows = reinterpret_cast<int32_t*>(base + plan.take(sizeof(int32_t) * nb));
    s.tok_mask = reinterpret_cast<uint64_t*>(base + plan.take(sizeof(uint64_t) * nb));
    s.cell_pos = reinterpret_cast<int32_t*>(base + plan.take(sizeof(int32_t) * n_ctx));
    s.cell_seq = reinterpret_cast<uint64_t*>(base + plan.take(sizeof(uint64_t) * n_ctx));
    s.n_used = reinterpret_cast<int32_t*>(base + plan.take(sizeof(int32_t)));
    s.tok_slot = reinterpret_cast<int32_t*>(base + plan.take(sizeof(int32_t) * nb));
    return plan.total;
}

}  // namespace

GpuContextMemory gpu_context_plan(const Model& m, const ContextParams& p) {
    if (m.n_gpu_layers() <= 0) return GpuContextMemory{};
    return layout(m, p, nullptr, nullptr);
}

std::shared_ptr<GpuContext> gpu_context_create(const Model& m, const ContextParams& p) {
    if (!m.gpu()) throw Error("gpu_context_create: the model has no layers on the GPU");
    const GpuContextMemory need = layout(m, p, nullptr, nullptr);
    auto c = std::make_shared<GpuContext>();
    c->alloc = std::make_unique<cuda::DeviceAllocation>(
        need.allocated_bytes, "a context of " + std::to_string(p.n_ctx) + " tokens (KV cache " +
                                  cuda::format_mib(need.kv_bytes) + ", compute buffers " +
                                  cuda::format_mib(need.compute_bytes + need.logits_bytes) + ")");
    c->mem = layout(m, p, c->alloc->data(), c.get());
    c->weights = m.gpu_ptr();
    c->model = c->weights.get();
    cuda::check(cudaMemset(c->alloc->data(), 0, c->alloc->size()), "clearing the context's device memory");
    // the context's stream is non-blocking: finish the legacy-stream work (weight uploads, the
    // clearing above) before any step can start on it
    cuda::check(cudaDeviceSynchronize(), "clearing the context's device memory");
    StepStaging none;
    const size_t staging_bytes = staging_layout(m.hparams(), c->n_batch, c->n_ctx, nullptr, none);
    c->pinned = std::make_unique<cuda::PinnedAllocation>(staging_bytes);
    staging_layout(m.hparams(), c->n_batch, c->n_ctx, c->pinned->data(), c->staging);
    c->stream = std::make_unique<cuda::OwnedStream>();
    // qwen35 runs without CUDA graphs: its step (per-token L2 norms, strided copies, recurrent
    // state) has never been checked under capture, so every step is a plain launch sequence
    c->graphs.set_enabled(p.cuda_graph && m.hparams().n_state_layer == 0);
    if (p.cuda_graph && m.hparams().n_state_layer > 0 && m.params().verbose)
        std::fprintf(stderr, "note: CUDA graphs are not used for the %s architecture (plain launches)\n",
                     m.hparams().arch.c_str());
    return c;
}

GpuContextMemory gpu_context_memory(const GpuContext& c) { return c.mem; }

namespace {

// Device-to-device copy / clear of one sequence's state block on the context's stream, waited for.
void state_copy_block(GpuContext& c, float* dst, const float* src, const char* what) {
    if (dst == src) return;
    cuda::check(cudaMemcpyAsync(dst, src, sizeof(float) * c.rs_per_seq, cudaMemcpyDeviceToDevice, c.stream->get()),
                what);
}

float* live_of(GpuContext& c, int seq) { return c.rs_live + static_cast<int64_t>(seq) * c.rs_per_seq; }
float* ckpt_of(GpuContext& c, int seq) { return c.rs_ckpt + static_cast<int64_t>(seq) * c.rs_per_seq; }

void state_wait(GpuContext& c, const char* what) { cuda::check(cudaStreamSynchronize(c.stream->get()), what); }

}  // namespace

void gpu_state_reset(GpuContext& c, int seq) {
    if (c.rs_per_seq == 0) return;
    cuda::check(cudaMemsetAsync(live_of(c, seq), 0, sizeof(float) * c.rs_per_seq, c.stream->get()),
                "clearing a sequence's recurrent state");
    state_wait(c, "clearing a sequence's recurrent state");
}

void gpu_state_copy(GpuContext& c, int src, int dst) {
    if (c.rs_per_seq == 0 || src == dst) return;
    state_copy_block(c, live_of(c, dst), live_of(c, src), "copying a recurrent state");
    state_copy_block(c, ckpt_of(c, dst), ckpt_of(c, src), "copying a recurrent state");
    state_wait(c, "copying a recurrent state");
}

void gpu_state_save_checkpoint(GpuContext& c, int seq) {
    if (c.rs_per_seq == 0) return;
    state_copy_block(c, ckpt_of(c, seq), live_of(c, seq), "saving a recurrent-state checkpoint");
    state_wait(c, "saving a recurrent-state checkpoint");
}

void gpu_state_restore_checkpoint(GpuContext& c, int seq) {
    if (c.rs_per_seq == 0) return;
    state_copy_block(c, live_of(c, seq), ckpt_of(c, seq), "restoring a recurrent-state checkpoint");
    state_wait(c, "restoring a recurrent-state checkpoint");
}

void gpu_state_load_checkpoint_of(GpuContext& c, int src, int dst) {
    if (c.rs_per_seq == 0) return;
    state_copy_block(c, live_of(c, dst), ckpt_of(c, src), "loading a recurrent-state checkpoint");
    if (src != dst) state_copy_block(c, ckpt_of(c, dst), ckpt_of(c, src), "loading a recurrent-state checkpoint");
    state_wait(c, "loading a recurrent-state checkpoint");
}

}  // namespace bonsai
