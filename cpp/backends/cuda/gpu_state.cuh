// The device-side state behind bonsai/cuda/gpu_backend.h: the offloaded weights of a Model
// (GpuModel, one allocation) and the KV cache + compute buffers of a Context (GpuContext, one
// allocation). Layouts are described in gpu_model.cu and gpu_context.cu.
#pragma once

#include <memory>
#include <vector>

#include "bonsai/context.h"
#include "bonsai/cuda/gpu_backend.h"
#include "device_pool.cuh"
#include "ops_cuda.cuh"
#include "step_graphs.cuh"
#include "step_io.cuh"

namespace bonsai {

struct GpuLayer {
    cuda::DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;  // qwen35: wq has 2 * n_embd_q rows (query | gate per head)
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* bq = nullptr;      // qwen2 biases (null otherwise)
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* q_norm = nullptr;  // qwen3 / qwen35 per-head norms (null otherwise)
    const float* k_norm = nullptr;
    // prism.hadamard rotations of the folded weights' inputs (block 0 = not folded)
    cuda::GpuRotation r_q, r_k, r_v, r_o, r_gate, r_up, r_down;
    // qwen35 Gated DeltaNet layers (recurrent = true; wq..wo then empty)
    bool recurrent = false;
    cuda::DeviceMatrix w_qkv, w_z, w_alpha, w_beta, w_ssm_out;  // attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out
    const float* conv_w_t = nullptr;  // conv taps transposed, [kernel][conv_dim]
    const float* dt_bias = nullptr;   // [n_v_heads]
    const float* ssm_a = nullptr;     // [n_v_heads]
    const float* ssm_norm = nullptr;  // [dv]
    cuda::GpuRotation r_qkv, r_z, r_ssm_out;
};

class GpuModel {
public:
    std::vector<GpuLayer> layers;          // layers [0, n_gpu)
    bool output = false;                   // head on the GPU
    cuda::DeviceMatrix head;               // output.weight (or a copy of token_embd when tied)
    const float* output_norm = nullptr;
    cuda::GpuRotation head_rot;            // rotation of the head's input (folded or tied to a folded token_embd)
    bool gdn_v_grouped = false;            // prism.hadamard.gdn_v_grouped: a folded ssm_out reads grouped V heads
    GpuWeightsMemory mem;
    std::unique_ptr<cuda::DeviceAllocation> alloc;
};

// Pinned host staging of one step's inputs (forward.cu copies them to the device pieces of the
// same names with cudaMemcpyAsync): sizes as on the device, n_used a single int32.
struct StepStaging {
    float* x = nullptr;
    float* rope = nullptr;
    int32_t* tok_pos = nullptr;
    int32_t* tok_cell = nullptr;
    int32_t* out_rows = nullptr;
    uint64_t* tok_mask = nullptr;
    int32_t* cell_pos = nullptr;
    uint64_t* cell_seq = nullptr;
    int32_t* n_used = nullptr;
    int32_t* tok_slot = nullptr;  // qwen35 only: each token's sequence (its recurrent state slot)
};

class GpuContext {
public:
    std::shared_ptr<const GpuModel> weights;  // keeps the weights alive
    int64_t n_ctx = 0, n_batch = 0;
    GpuModel const* model = nullptr;
    ActMode act = ActMode::INT8;
    GgmlType type_k = TYPE_F16, type_v = TYPE_F16;
    size_t k_row_bytes = 0, v_row_bytes = 0;
    uint8_t* k = nullptr;         // [n_gpu][n_ctx][k_row_bytes]
    uint8_t* v = nullptr;         // [n_gpu][n_ctx][v_row_bytes]
    // (qwen35: K/V of the offloaded attention layers only, indexed by Hparams::kv_layer)
    // qwen35: the offloaded GDN layers' recurrent state, RecurrentState's layout for layers
    // [0, n_state): per sequence, n_state conv windows then n_state delta states
    float* rs_live = nullptr;     // [n_seq][rs_per_seq]
    float* rs_ckpt = nullptr;     // [n_seq][rs_per_seq] one checkpoint per sequence
    int64_t rs_n_state = 0;       // offloaded GDN layers
    int64_t rs_per_seq = 0;       // floats of one sequence's state
    int64_t rs_conv_floats = 0, rs_delta_floats = 0;  // per layer (Hparams::conv/delta_state_floats)
    float* qg = nullptr;          // qwen35 [nb, 2 n_embd_q]: attn_q output, query | gate per head
    float* qgate = nullptr;       // qwen35 [nb, n_embd_q]
    float* qkv = nullptr;         // qwen35 [nb, conv_dim]
    float* z = nullptr;           // qwen35 [nb, v_dim]
    float* alpha = nullptr;       // qwen35 [nb, n_v_heads] (becomes g)
    float* beta = nullptr;        // qwen35 [nb, n_v_heads]
    float* o = nullptr;           // qwen35 [nb, v_dim]
    int32_t* tok_slot = nullptr;  // qwen35 [nb]: each token's sequence id
    float* x = nullptr;           // [nb, n_embd]
    float* cur = nullptr;         // [nb, n_embd]
    float* q = nullptr;           // [nb, n_embd_q]
    float* kc = nullptr;          // [nb, n_embd_kv]
    float* vc = nullptr;          // [nb, n_embd_kv]
    float* attn = nullptr;        // [nb, n_embd_q]
    float* gate = nullptr;        // [nb, n_ff]
    float* up = nullptr;          // [nb, n_ff]
    float* rope = nullptr;        // [nb, n_rot]
    cuda::ActScratch act_scratch; // q [nb * max(n_embd, n_embd_q, n_ff)], scale [nb]
    int32_t* tok_pos = nullptr;   // [nb]
    uint64_t* tok_mask = nullptr; // [nb]
    int32_t* tok_cell = nullptr;  // [nb]
    int32_t* out_rows = nullptr;  // [nb]
    int32_t* cell_pos = nullptr;  // [n_ctx]
    uint64_t* cell_seq = nullptr; // [n_ctx]
    int32_t* n_used = nullptr;    // [1] used cells of this step (kernels read it; see forward.cu)
    bool flash_attn = false;      // flash_attention.cu instead of attention.cu
    float* attn_partial = nullptr;  // [attn_partial_floats] flash split partials
    int64_t attn_partial_floats = 0;
    float* logits = nullptr;      // [logits_rows, n_vocab] when the head is on the GPU
    int64_t logits_rows = 0;
    GpuContextMemory mem;
    std::unique_ptr<cuda::DeviceAllocation> alloc;
    std::unique_ptr<cuda::OwnedStream> stream;      // every launch and copy of a step
    std::unique_ptr<cuda::PinnedAllocation> pinned;  // holds `staging`
    StepStaging staging;
    cuda::StepGraphs graphs;                         // enabled by ContextParams::cuda_graph
};

}  // namespace bonsai
