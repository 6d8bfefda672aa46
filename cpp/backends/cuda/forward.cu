// The GPU layer runner: one batch chunk through the offloaded layers [0, n_gpu), called from the
// architecture forward loops (cpp/src/forward_gpu.cpp dispatches here).
//
// Per chunk, everything on the context's own stream: the host writes the step's inputs into the
// pinned staging buffers (embeddings the host gathered, the host-built rope table, the tokens'
// positions / sequence masks / KV cells / output rows, the cache's cell positions and sequence
// masks, the used-cell count) and the step enqueues: async copies of those into the device
// pieces; every offloaded layer with the same steps and order as the CPU (arch_common.cpp, qwen2
// biases after the projections, qwen3 q/k norms before the rotation; with INT8 activations the
// attention / FFN norm also quantizes its output once for q/k/v and for gate/up; attention by
// flash_attention.cu when the context asked for flash attention, else attention.cu; the inputs of
// prism.hadamard-folded weights rotated by hadamard.cu first, as on the CPU); and, when
// the output head is on the GPU and the wanted rows fit in one pass (n_out <= logits_rows), the
// output norm + head. Attention grids are sized for the n_ctx cells of the context and read this
// step's used-cell count from device memory, so the enqueued work depends only on the shape
// (n_tokens, n_out): with ContextParams::cuda_graph it is captured once per shape and replayed
// (step_graphs.cuh). Plain and graph steps run the same kernels with the same arguments, so their
// results are bit-identical. After the step the wanted logits (or x, when CPU layers follow: the
// one crossing per boundary) are copied back outside the graph; heads over more rows than one
// pass run 64 rows at a time with plain launches. One stream synchronize ends the step and
// reports any asynchronous fault.
//
// qwen35 (cpp/src/arch/qwen35.cpp, the same ops in the same order): a gated attention layer
// projects query|gate with attn_q (2 n_embd_q rows), splits them per head (two strided copies),
// norms q and k per head, ropes, stores K/V in the layer's KV slot (Hparams::kv_layer), attends and
// multiplies by sigmoid(gate) before attn_output; a Gated DeltaNet layer projects qkv, z, alpha,
// beta from the normed x, runs conv1d + SiLU, the per-head L2 norms of each token's q|k rows (one
// launch per token: the rows are contiguous only within a token), the gates, the gated delta
// rule, the gated RMSNorm, the grouped V-head order when a folded ssm_out asks for it, and
// ssm_out. The recurrent state of token t is its sequence's block (tok_slot[t]) of the context's
// device state, so a chunk may interleave sequences as on the CPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "../../src/arch/arch.h"
#include "bonsai/kv_cache.h"
#include "cuda_common.cuh"
#include "gpu_state.cuh"

namespace bonsai {

namespace {

constexpr int64_t kMaxGraphTokens = 64;  // larger chunks (prefill) are not worth a graph each

template <typename T>
void stage(T* dst, const T* src, int64_t n) {
    if (n > 0) std::memcpy(dst, src, sizeof(T) * n);
}

template <typename T>
void upload(T* dst, const T* src, int64_t n, const char* what) {
    if (n > 0)
        cuda::check(cudaMemcpyAsync(dst, src, sizeof(T) * n, cudaMemcpyHostToDevice, cuda::stream()),
                    std::string("upload of ") + what);
}

void run_head(const Hparams& hp, const GpuModel& g, GpuContext& c, ActMode act, int64_t r0, int64_t cnt) {
    cuda::rms_norm(c.x, c.out_rows + r0, g.output_norm, cnt, hp.n_embd, hp.rms_eps, c.cur);
    if (g.head_rot.active()) cuda::hadamard_rotate(c.cur, cnt, hp.n_embd, g.head_rot);
    cuda::matmul(g.head, c.cur, cnt, c.logits, act, c.act_scratch);
}

struct RotatedMatmul {
    const cuda::DeviceMatrix* w;
    float* y;
    const cuda::GpuRotation* r;
};

// cur = rms_norm(x) * norm, then y_i = W_i cur for each (W_i, y_i). When every W_i takes the INT8
// path, the norm kernel quantizes cur once for all of them (bit-identical to quantizing per matrix).
// prism.hadamard: the folded W_i read WHT_B(s ⊙ cur) instead, rotated once for all of them after the
// unfolded ones have read cur (then quantized once, when they take the INT8 path).
void normed_matmuls(GpuContext& c, ActMode act, const float* norm, float eps, int64_t n,
                    std::initializer_list<RotatedMatmul> mats) {
    const int64_t ne = mats.begin()->w->cols;  // n_embd: every matrix here reads the normalised x
    bool int8 = true, any_rot = false;
    const cuda::GpuRotation* rot = nullptr;
    for (const auto& m : mats) {
        int8 = int8 && cuda::int8_path(*m.w, act);
        if (m.r->active()) rot = m.r, any_rot = true;
    }
    if (int8 && !any_rot) {
        cuda::rms_norm_quantize(c.x, norm, n, ne, eps, c.cur, c.act_scratch);
        for (const auto& m : mats) cuda::matmul_quantized(*m.w, n, m.y, c.act_scratch);
        return;
    }
    cuda::rms_norm(c.x, nullptr, norm, n, ne, eps, c.cur);
    for (const auto& m : mats)
        if (!m.r->active()) cuda::matmul(*m.w, c.cur, n, m.y, act, c.act_scratch);
    if (!rot) return;
    cuda::hadamard_rotate(c.cur, n, ne, *rot);
    if (int8) cuda::quantize_act(c.cur, n, ne, c.act_scratch);
    for (const auto& m : mats) {
        if (!m.r->active()) continue;
        if (int8)
            cuda::matmul_quantized(*m.w, n, m.y, c.act_scratch);
        else
            cuda::matmul(*m.w, c.cur, n, m.y, act, c.act_scratch);
    }
}

// y = W x, with x rotated in place first when W is folded (x is not read afterwards).
void matmul_rotated(const cuda::DeviceMatrix& w, const cuda::GpuRotation& r, float* x, int64_t n, float* y,
                    ActMode act, const cuda::ActScratch& s) {
    if (r.active()) cuda::hadamard_rotate(x, n, w.cols, r);
    cuda::matmul(w, x, n, y, act, s);
}

// x += W_down (silu(W_gate h) * W_up h), h = rms_norm(x) * ffn_norm.
void ffn_swiglu(const Hparams& hp, GpuContext& c, ActMode act, const GpuLayer& L, int64_t n) {
    normed_matmuls(c, act, L.ffn_norm, hp.rms_eps, n, {{&L.w_gate, c.gate, &L.r_gate}, {&L.w_up, c.up, &L.r_up}});
    cuda::swiglu(c.gate, c.up, n * hp.n_ff, c.gate);
    matmul_rotated(L.w_down, L.r_down, c.gate, n, c.cur, act, c.act_scratch);
    cuda::add_inplace(c.x, c.cur, n * hp.n_embd);
}

// Rows of `width` floats, `height` of them, from src (rows src_pitch floats apart) to dst (rows
// dst_pitch floats apart), device to device on the step's stream.
void copy_rows(float* dst, int64_t dst_pitch, const float* src, int64_t src_pitch, int64_t width, int64_t height,
               const char* what) {
    cuda::check(cudaMemcpy2DAsync(dst, sizeof(float) * dst_pitch, src, sizeof(float) * src_pitch,
                                  sizeof(float) * width, height, cudaMemcpyDeviceToDevice, cuda::stream()),
                what);
}

// qwen35 gated attention (qwen35.cpp gated_attention); `a` holds the step's attention arguments.
void gated_attention(const Hparams& hp, GpuContext& c, ActMode act, const GpuLayer& L, int64_t il, int64_t n,
                     cuda::AttentionDev& a) {
    const int64_t hd = hp.head_dim, nq = hp.n_embd_q(), nkv = hp.n_embd_kv();
    normed_matmuls(c, act, L.attn_norm, hp.rms_eps, n,
                   {{&L.wq, c.qg, &L.r_q}, {&L.wk, c.kc, &L.r_k}, {&L.wv, c.vc, &L.r_v}});
    // row (t, h) of qg holds query then gate of head h of token t: 2 hd floats at (t n_head + h) 2 hd
    copy_rows(c.q, hd, c.qg, 2 * hd, hd, n * hp.n_head, "qwen35 query split");
    copy_rows(c.qgate, hd, c.qg + hd, 2 * hd, hd, n * hp.n_head, "qwen35 gate split");
    cuda::rms_norm(c.q, nullptr, L.q_norm, n * hp.n_head, hd, hp.rms_eps, c.q);
    cuda::rms_norm(c.kc, nullptr, L.k_norm, n * hp.n_head_kv, hd, hp.rms_eps, c.kc);
    const bool neox = hp.rope_type == RopeType::NEOX;
    cuda::rope(c.q, n, hp.n_head, hd, hp.n_rot, neox, c.rope);
    cuda::rope(c.kc, n, hp.n_head_kv, hd, hp.n_rot, neox, c.rope);
    const int64_t kl = hp.kv_layer[il];  // the offloaded attention layers hold KV slots [0, n_gpu_kv)
    uint8_t* k_layer = c.k + static_cast<size_t>(kl) * c.n_ctx * c.k_row_bytes;
    uint8_t* v_layer = c.v + static_cast<size_t>(kl) * c.n_ctx * c.v_row_bytes;
    cuda::store_kv_rows(c.kc, n, nkv, c.tok_cell, c.type_k, k_layer, c.k_row_bytes);
    cuda::store_kv_rows(c.vc, n, nkv, c.tok_cell, c.type_v, v_layer, c.v_row_bytes);
    a.k = k_layer;
    a.v = v_layer;
    if (c.flash_attn)
        cuda::flash_attention(a);
    else
        cuda::attention(a);
    cuda::sigmoid_mul(c.attn, c.qgate, n * nq);
    matmul_rotated(L.wo, L.r_o, c.attn, n, c.cur, act, c.act_scratch);
    cuda::add_inplace(c.x, c.cur, n * hp.n_embd);
}

// qwen35 Gated DeltaNet (qwen35.cpp gated_delta_net) of offloaded layer il.
void gated_delta_net(const Hparams& hp, const GpuModel& g, GpuContext& c, ActMode act, int64_t il, int64_t n) {
    const GpuLayer& L = g.layers[il];
    const int64_t conv_dim = hp.ssm_conv_dim(), hv = hp.ssm_n_v_heads, nk = hp.ssm_n_k_heads;
    const int64_t dk = hp.ssm_dk, dv = hp.ssm_dv, v_dim = hp.ssm_v_dim();
    const int64_t sl = hp.state_layer[il];  // < c.rs_n_state: the offloaded GDN layers come first
    const cuda::GpuRotation none{};
    normed_matmuls(c, act, L.attn_norm, hp.rms_eps, n,
                   {{&L.w_qkv, c.qkv, &L.r_qkv}, {&L.w_z, c.z, &L.r_z}, {&L.w_alpha, c.alpha, &none},
                    {&L.w_beta, c.beta, &none}});
    cuda::SlotStates conv;
    conv.base = c.rs_live + sl * c.rs_conv_floats;
    conv.slots = c.tok_slot;
    conv.stride = c.rs_per_seq;
    cuda::gdn_conv1d_silu(c.qkv, n, conv_dim, L.conv_w_t, hp.ssm_conv_kernel, conv);
    for (int64_t t = 0; t < n; ++t) cuda::l2_norm_rows(c.qkv + t * conv_dim, 2 * nk, dk, 1e-6f);
    cuda::gdn_gates(c.alpha, c.beta, L.dt_bias, L.ssm_a, n, hv);
    cuda::DeltaRuleDev d;
    d.qkv = c.qkv;
    d.qkv_stride = conv_dim;
    d.g = c.alpha;
    d.beta = c.beta;
    d.n_tokens = n;
    d.n_k_heads = nk;
    d.n_v_heads = hv;
    d.dk = dk;
    d.dv = dv;
    d.scale = 1.0f / std::sqrt(static_cast<float>(dk));
    d.states.base = c.rs_live + c.rs_n_state * c.rs_conv_floats + sl * c.rs_delta_floats;
    d.states.slots = c.tok_slot;
    d.states.stride = c.rs_per_seq;
    d.out = c.o;
    cuda::gated_delta_rule(d);
    cuda::rms_norm_gated(c.o, L.ssm_norm, c.z, n * hv, dv, hp.rms_eps);
    float* in = c.o;
    if (L.r_ssm_out.active() && g.gdn_v_grouped) {
        // tiled V-head order (head h = r nk + k) to grouped (k rep + r), as qwen35.cpp's
        // tiled_to_grouped; into z, which rms_norm_gated has consumed
        const int64_t rep = hv / nk;
        for (int64_t r = 0; r < rep; ++r)
            for (int64_t k = 0; k < nk; ++k)
                copy_rows(c.z + (k * rep + r) * dv, v_dim, c.o + (r * nk + k) * dv, v_dim, dv, n,
                          "qwen35 grouped V heads");
        in = c.z;
    }
    matmul_rotated(L.w_ssm_out, L.r_ssm_out, in, n, c.cur, act, c.act_scratch);
    cuda::add_inplace(c.x, c.cur, n * hp.n_embd);
}

// Enqueues the uploads and the layers of one step of n tokens (and the head when head_rows > 0).
void enqueue_step(const Hparams& hp, GpuContext& c, ActMode act, int64_t n, int64_t n_out, int64_t cells,
                  int64_t head_rows) {
    const GpuModel& g = *c.model;
    const StepStaging& h = c.staging;
    const int64_t ne = hp.n_embd, nq = hp.n_embd_q(), nkv = hp.n_embd_kv();
    upload(c.x, h.x, n * ne, "embeddings");
    upload(c.rope, h.rope, n * hp.n_rot, "rope table");
    upload(c.tok_pos, h.tok_pos, n, "positions");
    upload(c.tok_mask, h.tok_mask, n, "sequence masks");
    upload(c.tok_cell, h.tok_cell, n, "KV cells");
    upload(c.out_rows, h.out_rows, n_out, "output rows");
    upload(c.cell_pos, h.cell_pos, cells, "cell positions");
    upload(c.cell_seq, h.cell_seq, cells, "cell sequences");
    upload(c.n_used, h.n_used, 1, "used-cell count");
    if (c.tok_slot) upload(c.tok_slot, h.tok_slot, n, "token sequences");

    const cuda::ActScratch& s = c.act_scratch;
    const bool neox = hp.rope_type == RopeType::NEOX;
    cuda::AttentionDev a;
    a.q = c.q;
    a.n_tokens = n;
    a.pos = c.tok_pos;
    a.seq_mask = c.tok_mask;
    a.cell_pos = c.cell_pos;
    a.cell_seq = c.cell_seq;
    a.n_used = c.n_ctx;
    a.n_used_dev = c.n_used;
    a.k_row_bytes = c.k_row_bytes;
    a.v_row_bytes = c.v_row_bytes;
    a.type_k = c.type_k;
    a.type_v = c.type_v;
    a.n_head = hp.n_head;
    a.n_head_kv = hp.n_head_kv;
    a.head_dim = hp.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
    a.out = c.attn;
    a.partial = c.attn_partial;
    a.partial_floats = c.attn_partial_floats;

    for (size_t il = 0; il < g.layers.size(); ++il) {
        const GpuLayer& L = g.layers[il];
        if (hp.attn_output_gate) {  // qwen35
            if (L.recurrent)
                gated_delta_net(hp, g, c, act, static_cast<int64_t>(il), n);
            else
                gated_attention(hp, c, act, L, static_cast<int64_t>(il), n, a);
            ffn_swiglu(hp, c, act, L, n);
            continue;
        }
        normed_matmuls(c, act, L.attn_norm, hp.rms_eps, n,
                       {{&L.wq, c.q, &L.r_q}, {&L.wk, c.kc, &L.r_k}, {&L.wv, c.vc, &L.r_v}});
        if (L.bq) {
            cuda::add_bias(c.q, L.bq, n, nq);
            cuda::add_bias(c.kc, L.bk, n, nkv);
            cuda::add_bias(c.vc, L.bv, n, nkv);
        }
        if (L.q_norm) {
            cuda::rms_norm(c.q, nullptr, L.q_norm, n * hp.n_head, hp.head_dim, hp.rms_eps, c.q);
            cuda::rms_norm(c.kc, nullptr, L.k_norm, n * hp.n_head_kv, hp.head_dim, hp.rms_eps, c.kc);
        }
        cuda::rope(c.q, n, hp.n_head, hp.head_dim, hp.n_rot, neox, c.rope);
        cuda::rope(c.kc, n, hp.n_head_kv, hp.head_dim, hp.n_rot, neox, c.rope);
        uint8_t* k_layer = c.k + static_cast<size_t>(il) * c.n_ctx * c.k_row_bytes;
        uint8_t* v_layer = c.v + static_cast<size_t>(il) * c.n_ctx * c.v_row_bytes;
        cuda::store_kv_rows(c.kc, n, nkv, c.tok_cell, c.type_k, k_layer, c.k_row_bytes);
        cuda::store_kv_rows(c.vc, n, nkv, c.tok_cell, c.type_v, v_layer, c.v_row_bytes);
        a.k = k_layer;
        a.v = v_layer;
        if (c.flash_attn)
            cuda::flash_attention(a);
        else
            cuda::attention(a);
        matmul_rotated(L.wo, L.r_o, c.attn, n, c.cur, act, s);
        cuda::add_inplace(c.x, c.cur, n * ne);
        ffn_swiglu(hp, c, act, L, n);
    }
    if (head_rows > 0) run_head(hp, g, c, act, 0, head_rows);
}

void copy_back(void* dst, const void* src, size_t bytes, const char* what) {
    cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda::stream()), what);
}

}  // namespace

int64_t gpu_forward(const Model& m, GpuContext& c, ForwardState& st) {
    const Hparams& hp = m.hparams();
    const GpuModel& g = *c.model;
    const int64_t n = st.n_tokens, n_gpu = static_cast<int64_t>(g.layers.size());
    if (n <= 0) return n_gpu;
    if (n > c.n_batch)
        throw Error("gpu_forward: a chunk of " + std::to_string(n) + " tokens exceeds n_batch " + std::to_string(c.n_batch));
    const KvCache& kv = *st.kv;
    const int64_t n_used = kv.used_end();
    if (n_used > c.n_ctx) throw Error("gpu_forward: the KV cache has more cells than the device cache");
    const bool embd = st.embd != nullptr;  // embeddings: x comes back, the CPU norms it, no head
    const int64_t n_out = g.output && !embd ? st.n_out : 0;
    const bool one_pass_head = n_out > 0 && n_out <= c.logits_rows;
    const bool graph = c.graphs.enabled() && n <= kMaxGraphTokens && (n_out == 0 || one_pass_head);

    // the previous step has synchronized, so the staging buffers are free
    StepStaging& h = c.staging;
    stage(h.x, st.x, n * hp.n_embd);
    stage(h.rope, st.rope_cs, n * hp.n_rot);
    stage(h.tok_pos, st.pos, n);
    stage(h.tok_mask, st.seq_mask, n);
    stage(h.tok_cell, st.cell, n);
    stage(h.out_rows, st.out_rows, n_out);
    stage(h.cell_pos, kv.cell_pos_data(), n_used);
    stage(h.cell_seq, kv.cell_seq_data(), n_used);
    *h.n_used = static_cast<int32_t>(n_used);
    if (c.tok_slot)
        for (int64_t t = 0; t < n; ++t) h.tok_slot[t] = __builtin_ctzll(st.seq_mask[t]);  // one sequence per token

    cuda::StreamScope scope(c.stream->get());
    const int64_t head_rows = one_pass_head ? n_out : 0;
    // a graph copies the metadata of every cell (its size is fixed); plain steps only the used ones
    const auto enqueue = [&](int64_t cells) { enqueue_step(hp, c, st.act, n, n_out, cells, head_rows); };
    const uint64_t key = static_cast<uint64_t>(n) << 32 | static_cast<uint64_t>(n_out);
    if (!(graph && c.graphs.run(key, c.stream->get(), [&] { enqueue(c.n_ctx); }))) enqueue(n_used);

    if (!g.output || embd) {
        copy_back(st.x, c.x, sizeof(float) * n * hp.n_embd, "GPU layers (copying the activations back)");
    } else if (one_pass_head) {
        copy_back(st.logits, c.logits, sizeof(float) * n_out * hp.n_vocab,
                  "GPU output head (copying the logits back)");
    } else {
        for (int64_t r0 = 0; r0 < n_out; r0 += c.logits_rows) {
            const int64_t cnt = std::min(c.logits_rows, n_out - r0);
            run_head(hp, g, c, st.act, r0, cnt);
            copy_back(st.logits + r0 * hp.n_vocab, c.logits, sizeof(float) * cnt * hp.n_vocab,
                      "GPU output head (copying the logits back)");
            cuda::check(cudaStreamSynchronize(c.stream->get()), "GPU output head");
        }
    }
    cuda::check(cudaStreamSynchronize(c.stream->get()), "GPU forward");
    return n_gpu;
}

}  // namespace bonsai
