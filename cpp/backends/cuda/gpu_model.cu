// Upload of the offloaded weights (GpuModel).
//
// Layout of the single device allocation, in this order, each piece 256-byte aligned:
//   for each layer il < n_gpu: attn_q, attn_k, attn_v, attn_output (qwen35 Gated DeltaNet layers:
//     attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out instead), ffn_gate, ffn_up, ffn_down
//     (packed bytes exactly as in the file, rows row_bytes apart), then attn_norm, ffn_norm and the
//     architecture's 1-D tensors (qwen2 q/k/v biases, qwen3 / qwen35 q/k norms; GDN layers: the
//     transposed conv taps [kernel][conv_dim], ssm_dt.bias, ssm_a, ssm_norm) as float32, as the
//     host holds them (LayerWeights);
//   then, with the output head: output_norm (float32) and output.weight (packed; for a tied head a
//     copy of token_embd, which also stays on the host for the embedding gather);
//   then, for a prism.hadamard-rotated model, every sign vector of the contract (float32).
// One planning pass computes the offsets, a second fills the pointers and copies the bytes.
#include <map>

#include "../../src/arch/arch.h"
#include "bonsai/model.h"
#include "cuda_common.cuh"
#include "gpu_state.cuh"

namespace bonsai {

namespace {

struct Uploader {
    cuda::ArenaPlan plan;
    uint8_t* base = nullptr;  // null in the planning pass
    GpuWeightsMemory* mem = nullptr;

    void copy(size_t off, const void* src, size_t bytes) {
        if (base && bytes) cuda::check(cudaMemcpy(base + off, src, bytes, cudaMemcpyHostToDevice), "weight upload");
    }
    cuda::DeviceMatrix matrix(const WeightView& w) {
        const size_t bytes = w.row_bytes * static_cast<size_t>(w.rows);
        const size_t off = plan.take(bytes);
        copy(off, w.data, bytes);
        if (mem) {
            mem->weights_bytes += bytes;
            mem->bytes_by_type[type_traits(w.type)->name] += bytes;
        }
        return cuda::DeviceMatrix{w.type, base + off, w.rows, w.cols, w.row_bytes};
    }
    const float* vec(const std::vector<float>& v) {
        if (v.empty()) return nullptr;
        const size_t bytes = v.size() * sizeof(float);
        const size_t off = plan.take(bytes);
        copy(off, v.data(), bytes);
        if (mem) {
            mem->weights_bytes += bytes;
            mem->bytes_by_type["F32"] += bytes;
        }
        return reinterpret_cast<const float*>(base + off);
    }
};

void fill(const Model& m, int n_layers, bool output, Uploader& up, GpuModel& g) {
    g.layers.assign(n_layers, GpuLayer{});
    for (int il = 0; il < n_layers; ++il) {
        const LayerWeights& w = m.layers()[il];
        GpuLayer& L = g.layers[il];
        L.recurrent = m.hparams().is_recurrent(il);
        if (L.recurrent) {
            L.w_qkv = up.matrix(w.w_qkv);
            L.w_z = up.matrix(w.w_z);
            L.w_alpha = up.matrix(w.w_alpha);
            L.w_beta = up.matrix(w.w_beta);
            L.w_ssm_out = up.matrix(w.w_ssm_out);
        } else {
            L.wq = up.matrix(w.wq);
            L.wk = up.matrix(w.wk);
            L.wv = up.matrix(w.wv);
            L.wo = up.matrix(w.wo);
        }
        L.w_gate = up.matrix(w.w_gate);
        L.w_up = up.matrix(w.w_up);
        L.w_down = up.matrix(w.w_down);
        L.attn_norm = up.vec(w.attn_norm);
        L.ffn_norm = up.vec(w.ffn_norm);
        L.bq = up.vec(w.bq);
        L.bk = up.vec(w.bk);
        L.bv = up.vec(w.bv);
        L.q_norm = up.vec(w.q_norm);
        L.k_norm = up.vec(w.k_norm);
        L.conv_w_t = up.vec(w.conv_w_t);
        L.dt_bias = up.vec(w.dt_bias);
        L.ssm_a = up.vec(w.ssm_a);
        L.ssm_norm = up.vec(w.ssm_norm);
    }
    g.gdn_v_grouped = m.hadamard().gdn_v_grouped;
    g.output = output;
    if (output) {
        g.output_norm = up.vec(m.output_norm());
        g.head = up.matrix(m.output());
    }
    // the host rotations point into the contract's sign vectors; map each to its device copy
    std::map<const float*, const float*> dev_signs;
    for (const auto& kv : m.hadamard().signs) dev_signs[kv.second.data()] = up.vec(kv.second);
    auto rot = [&dev_signs](const Rotation& r) {
        cuda::GpuRotation d;
        d.block = r.block;
        d.signs = r.signs ? dev_signs.at(r.signs) : nullptr;
        return d;
    };
    for (int il = 0; il < n_layers; ++il) {
        const LayerWeights& w = m.layers()[il];
        GpuLayer& L = g.layers[il];
        L.r_q = rot(w.r_q);
        L.r_k = rot(w.r_k);
        L.r_v = rot(w.r_v);
        L.r_o = rot(w.r_o);
        L.r_gate = rot(w.r_gate);
        L.r_up = rot(w.r_up);
        L.r_down = rot(w.r_down);
        L.r_qkv = rot(w.r_qkv);
        L.r_z = rot(w.r_z);
        L.r_ssm_out = rot(w.r_ssm_out);
    }
    if (output) g.head_rot = rot(m.output_rotation());
}

}  // namespace

std::shared_ptr<const GpuModel> gpu_model_upload(const Model& m, int n_layers, bool output) {
    if (n_layers <= 0 || n_layers > m.hparams().n_layer)
        throw Error("gpu_model_upload: layer count " + std::to_string(n_layers) + " is outside 1.." +
                    std::to_string(m.hparams().n_layer));
    if (m.hparams().head_dim > cuda::kMaxHeadDim)
        throw Error("the CUDA backend's attention supports head sizes up to " + std::to_string(cuda::kMaxHeadDim) +
                    ", this model's is " + std::to_string(m.hparams().head_dim) +
                    "; run it on the CPU (n_gpu_layers 0)");
    auto g = std::make_shared<GpuModel>();
    Uploader planner;
    GpuModel scratch;
    fill(m, n_layers, output, planner, scratch);
    g->alloc = std::make_unique<cuda::DeviceAllocation>(
        planner.plan.total, "the weights of " + std::to_string(n_layers) + " layer(s)" + (output ? " and the output head" : ""));
    Uploader up;
    up.base = g->alloc->data();
    up.mem = &g->mem;
    fill(m, n_layers, output, up, *g);
    cuda::check(cudaDeviceSynchronize(), "weight upload");
    g->mem.n_layers = n_layers;
    g->mem.output = output;
    g->mem.allocated_bytes = g->alloc->size();
    return g;
}

GpuWeightsMemory gpu_model_memory(const GpuModel& g) { return g.mem; }

GpuDeviceInfo cuda_device_info() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        throw Error("no CUDA device is available");
    }
    cudaDeviceProp prop{};
    cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    GpuDeviceInfo info;
    info.name = prop.name;
    cuda::device_memory(&info.free_bytes, &info.total_bytes);
    return info;
}

}  // namespace bonsai
