// The GPU layer runner: one batch chunk through the offloaded layers [0, n_gpu), called from the
// architecture forward loops (cpp/src/forward_gpu.cpp dispatches here).
//
// Per chunk: upload the embeddings the host gathered (x), the host-built rope table, the tokens'
// positions / sequence masks / KV cells and the cell metadata of the cache (positions and
// sequence masks of cells [0, used_end)); run every offloaded layer with the same steps and order
// as the CPU (arch_common.cpp, qwen2 biases after the projections, qwen3 q/k norms before the
// rotation); then either copy x back for the CPU layers (the one crossing per boundary) or, when
// the output head is on the GPU too, normalise the wanted rows, apply the head 64 rows at a time
// and copy only those logits back. The default stream orders everything; the final copies
// synchronize, and one cudaDeviceSynchronize reports any asynchronous fault before returning.
#include <algorithm>
#include <cmath>

#include "../../src/arch/arch.h"
#include "bonsai/kv_cache.h"
#include "cuda_common.cuh"
#include "gpu_state.cuh"

namespace bonsai {

namespace {

template <typename T>
void upload(T* dst, const T* src, int64_t n, const char* what) {
    if (n > 0) cuda::check(cudaMemcpy(dst, src, sizeof(T) * n, cudaMemcpyHostToDevice), std::string("upload of ") + what);
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
    const int64_t ne = hp.n_embd, nq = hp.n_embd_q(), nkv = hp.n_embd_kv();

    upload(c.x, st.x, n * ne, "embeddings");
    upload(c.rope, st.rope_cs, n * hp.n_rot, "rope table");
    upload(c.tok_pos, st.pos, n, "positions");
    upload(c.tok_mask, st.seq_mask, n, "sequence masks");
    upload(c.tok_cell, st.cell, n, "KV cells");
    upload(c.cell_pos, kv.cell_pos_data(), n_used, "cell positions");
    upload(c.cell_seq, kv.cell_seq_data(), n_used, "cell sequences");

    const ActMode act = st.act;
    const cuda::ActScratch& s = c.act_scratch;
    const bool neox = hp.rope_type == RopeType::NEOX;
    cuda::AttentionDev a;
    a.q = c.q;
    a.n_tokens = n;
    a.pos = c.tok_pos;
    a.seq_mask = c.tok_mask;
    a.cell_pos = c.cell_pos;
    a.cell_seq = c.cell_seq;
    a.n_used = n_used;
    a.k_row_bytes = c.k_row_bytes;
    a.v_row_bytes = c.v_row_bytes;
    a.type_k = c.type_k;
    a.type_v = c.type_v;
    a.n_head = hp.n_head;
    a.n_head_kv = hp.n_head_kv;
    a.head_dim = hp.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
    a.out = c.attn;

    for (int64_t il = 0; il < n_gpu; ++il) {
        const GpuLayer& L = g.layers[il];
        cuda::rms_norm(c.x, nullptr, L.attn_norm, n, ne, hp.rms_eps, c.cur);
        cuda::matmul(L.wq, c.cur, n, c.q, act, s);
        cuda::matmul(L.wk, c.cur, n, c.kc, act, s);
        cuda::matmul(L.wv, c.cur, n, c.vc, act, s);
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
        cuda::attention(a);
        cuda::matmul(L.wo, c.attn, n, c.cur, act, s);
        cuda::add_inplace(c.x, c.cur, n * ne);
        cuda::rms_norm(c.x, nullptr, L.ffn_norm, n, ne, hp.rms_eps, c.cur);
        cuda::matmul(L.w_gate, c.cur, n, c.gate, act, s);
        cuda::matmul(L.w_up, c.cur, n, c.up, act, s);
        cuda::swiglu(c.gate, c.up, n * hp.n_ff, c.gate);
        cuda::matmul(L.w_down, c.gate, n, c.cur, act, s);
        cuda::add_inplace(c.x, c.cur, n * ne);
    }

    if (!g.output) {
        cuda::check(cudaMemcpy(st.x, c.x, sizeof(float) * n * ne, cudaMemcpyDeviceToHost),
                    "GPU layers (copying the activations back)");
    } else if (st.n_out > 0) {
        upload(c.out_rows, st.out_rows, st.n_out, "output rows");
        for (int64_t r0 = 0; r0 < st.n_out; r0 += c.logits_rows) {
            const int64_t cnt = std::min(c.logits_rows, st.n_out - r0);
            cuda::rms_norm(c.x, c.out_rows + r0, g.output_norm, cnt, ne, hp.rms_eps, c.cur);
            cuda::matmul(g.head, c.cur, cnt, c.logits, act, s);
            cuda::check(cudaMemcpy(st.logits + r0 * hp.n_vocab, c.logits, sizeof(float) * cnt * hp.n_vocab,
                                   cudaMemcpyDeviceToHost),
                        "GPU layers and output head (copying the logits back)");
        }
    }
    cuda::check(cudaDeviceSynchronize(), "GPU forward");
    return n_gpu;
}

}  // namespace bonsai
