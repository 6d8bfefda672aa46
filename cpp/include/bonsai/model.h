// A loaded model: the mapped GGUF file, the hyperparameters, one weight view per tensor the
// architecture needs, and the vocabulary.
//
// A Model is immutable after Model::load() returns and is shared (std::shared_ptr<const Model>)
// by every Context that runs it; all mutable state (KV cache, scratch buffers, sequences) lives in
// Context. Matrices stay in the file mapping (zero copy); only the small one-dimensional tensors
// (norm weights, biases, rope frequency factors) are converted to float32 copies at load.
//
// Loading validates the whole file before anything runs: the architecture (llama, qwen2, qwen3),
// every hyperparameter, and every expected tensor's presence, shape and type (one bonsai::Error
// naming the tensor). Files whose weights were pre-rotated by a Hadamard transform
// (`prism.hadamard.*` metadata, bonsai/hadamard.h) are run with the matching activation rotation:
// each folded weight carries the Rotation of its input, and every inconsistency in the contract is
// refused at load, since a wrong rotation gives fluent but wrong output.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bonsai/hadamard.h"
#include "bonsai/huge_buffer.h"
#include "bonsai/ops.h"
#include "bonsai/types.h"

namespace bonsai {

class GgufFile;
class Vocab;
struct ArchSpec;
class GpuModel;

struct ModelParams {
    bool use_mmap = true;        // false: read the file into memory (--no-mmap)
    // With a mapped file: copy the weights the CPU streams for every token into memory backed by
    // 2 MiB pages (Linux transparent huge pages), when the kernel offers them and the copy takes
    // at most half of the available memory (false: --no-huge-pages, decode straight from the mapping).
    bool huge_pages = true;
    // While copying them, reorder the PTQ1_0 matrices of 1024 or more columns and the Q8_0 ones into
    // the orders the AVX-512 kernels read fastest (backends/cpu/repack.h; same bytes, same results;
    // only when the AVX-512 path is active; false: --no-repack, as llama.cpp's option of that name).
    bool repack = true;
    int n_gpu_layers = 0;        // the first n layers run on the GPU (CUDA builds); -1 or > n_layer = all
    std::string tokenizer_path;  // SentencePiece tokenizer.model overriding the embedded vocabulary
    bool verbose = false;        // print the per-layer device / type table while loading
};

enum class RopeType {
    NORMAL,  // rotate adjacent pairs (x[2i], x[2i+1]) (llama; weights permuted by the converter)
    NEOX,    // rotate halves (x[i], x[i + n_rot/2]) (qwen2, qwen3)
};

struct Hparams {
    std::string arch;            // "llama", "qwen2", "qwen3", "qwen35"
    int64_t n_vocab = 0;
    int64_t n_ctx_train = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;        // per-head size of q and k (key_length), also of v
    int64_t n_ff = 0;
    int64_t n_rot = 0;           // rotated dimensions per head (rope.dimension_count)
    float rms_eps = 1e-6f;
    float rope_theta = 10000.0f;
    float rope_freq_scale = 1.0f;  // positions are multiplied by this (1 / linear scaling factor)
    RopeType rope_type = RopeType::NORMAL;
    bool tied_output = false;    // output head shares token_embd.weight

    // qwen35 (SPEC §6a): layer il is a Gated DeltaNet (recurrent) layer when recurrent[il] != 0;
    // the others are gated full-attention layers, the only ones with KV. kv_layer[il] is the
    // layer's index in the KV cache (-1 for a recurrent layer), state_layer[il] its index among the
    // recurrent layers (-1 for an attention layer). Empty / identity for the other architectures.
    std::vector<uint8_t> recurrent;
    std::vector<int32_t> kv_layer, state_layer;
    int64_t n_kv_layer = 0;       // layers with KV (n_layer for the dense architectures)
    int64_t n_state_layer = 0;    // recurrent layers
    bool attn_output_gate = false;  // attn_q holds query and output gate per head (2 x head_dim)
    int64_t ssm_conv_kernel = 0;  // ssm.conv_kernel
    int64_t ssm_dk = 0;           // ssm.state_size: head size of the GDN q and k
    int64_t ssm_n_k_heads = 0;    // ssm.group_count
    int64_t ssm_n_v_heads = 0;    // ssm.time_step_rank
    int64_t ssm_dv = 0;           // ssm.inner_size / ssm.time_step_rank
    int64_t ssm_conv_dim() const { return 2 * ssm_n_k_heads * ssm_dk + ssm_n_v_heads * ssm_dv; }
    int64_t ssm_v_dim() const { return ssm_n_v_heads * ssm_dv; }
    // floats of one sequence's recurrent state in one recurrent layer: conv window, delta state
    int64_t conv_state_floats() const { return (ssm_conv_kernel - 1) * ssm_conv_dim(); }
    int64_t delta_state_floats() const { return ssm_n_v_heads * ssm_dv * ssm_dk; }
    bool is_recurrent(int64_t il) const { return !recurrent.empty() && recurrent[il] != 0; }
    // Attention (KV) / recurrent layers among layers [0, n): with n = n_gpu_layers, the ones whose
    // KV / recurrent state live on the GPU (the host keeps the rest, from that index on).
    int64_t kv_layers_below(int64_t n) const {
        int64_t k = 0;
        for (int64_t il = 0; il < n; ++il) k += !is_recurrent(il);
        return k;
    }
    int64_t state_layers_below(int64_t n) const { return n - kv_layers_below(n); }

    int64_t n_embd_q() const { return n_head * head_dim; }
    int64_t n_embd_kv() const { return n_head_kv * head_dim; }
};

struct LayerWeights {
    WeightView wq, wk, wv, wo;            // attn_q/k/v/output.weight
    WeightView w_gate, w_up, w_down;      // ffn_gate/up/down.weight
    std::vector<float> attn_norm, ffn_norm;
    std::vector<float> bq, bk, bv;        // qwen2 only (empty otherwise)
    std::vector<float> q_norm, k_norm;    // qwen3 only: per-head RMSNorm weights [head_dim]
    // qwen35 Gated DeltaNet layers (ffn_norm holds post_attention_norm in every qwen35 layer)
    WeightView w_qkv, w_z, w_alpha, w_beta, w_ssm_out;  // attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out
    std::vector<float> conv_w_t;   // ssm_conv1d taps transposed: [kernel][conv_dim]
    std::vector<float> dt_bias, ssm_a, ssm_norm;  // [n_v_heads], [n_v_heads], [dv]
    // prism.hadamard: the input rotation of each folded weight (block 0 = not folded)
    Rotation r_q, r_k, r_v, r_o, r_gate, r_up, r_down;
    Rotation r_qkv, r_z, r_ssm_out;
};

struct ModelMemory {
    uint64_t weights_bytes = 0;                   // every tensor the engine uses
    std::map<std::string, uint64_t> bytes_by_type;  // type name -> bytes
    uint64_t file_bytes = 0;
    bool mapped = true;                           // weights are in a file mapping (not a copy)
    uint64_t huge_page_bytes = 0;                 // of them, copied out of the mapping into huge pages
    uint64_t repacked_bytes = 0;                  // of those (or, read into memory, of all), repacked for the
                                                  // AVX-512 kernels (--no-repack: 0)
    // GPU offload (CUDA builds): the first n_gpu_layers layers, and the output head when every
    // layer is offloaded, also live in one device allocation. The file mapping above still holds
    // every tensor on the host (offloaded pages are read once, for the upload).
    int n_gpu_layers = 0;
    bool gpu_output = false;
    uint64_t gpu_weights_bytes = 0;                       // packed matrices + 1-D tensors as f32
    std::map<std::string, uint64_t> gpu_bytes_by_type;    // type name -> device bytes
    uint64_t gpu_allocated_bytes = 0;                     // the allocation (with 256-B alignment)
};

class Model {
public:
    static std::shared_ptr<const Model> load(const std::string& path, const ModelParams& params = {});
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const Hparams& hparams() const { return hp_; }
    const ModelParams& params() const { return params_; }
    const GgufFile& gguf() const { return *gguf_; }
    const Vocab& vocab() const { return *vocab_; }
    const ArchSpec& arch() const { return *arch_; }

    const WeightView& tok_embd() const { return tok_embd_; }
    const WeightView& output() const { return output_; }
    const std::vector<float>& output_norm() const { return output_norm_; }
    const std::vector<float>& rope_freqs() const { return rope_freqs_; }  // empty if none
    const std::vector<LayerWeights>& layers() const { return layers_; }
    // prism.hadamard: the contract, the inverse applied after the token_embd lookup and the
    // rotation of the output head's input (block 0 = none).
    const HadamardContract& hadamard() const { return hadamard_; }
    const Rotation& embd_rotation() const { return embd_rot_; }
    const Rotation& output_rotation() const { return output_rot_; }

    // Layers [0, n_gpu_layers()) run on the GPU; 0 in CPU-only builds or without a device.
    int n_gpu_layers() const { return n_gpu_layers_; }
    // The output head runs on the GPU (every layer is offloaded).
    bool gpu_output() const { return n_gpu_layers_ > 0 && n_gpu_layers_ == hp_.n_layer; }
    const GpuModel* gpu() const { return gpu_.get(); }
    std::shared_ptr<const GpuModel> gpu_ptr() const { return gpu_; }

    ModelMemory memory_report() const;
    // One line per layer ("layer  3: GPU  attn_q Q8_0 ...") plus embedding/output lines.
    std::string layer_table() const;
    // One line: weight memory per device, by type on the GPU.
    std::string memory_table() const;

private:
    Model() = default;
    friend class ModelLoader;
    void offload(const ModelParams& params);  // uploads the first layers to the GPU (CUDA builds)
    void bind_hadamard();                     // the contract's names -> the weights' rotations
    void copy_to_huge_pages();                // the CPU's streamed weights -> cpu_weights_
    void repack_in_place();                   // the same weights of a file read into memory, repacked
    std::vector<WeightView*> cpu_streamed_views();
    bool repacks(const WeightView* v) const;  // whether the AVX-512 path keeps v in its own order

    ModelParams params_;
    Hparams hp_;
    std::unique_ptr<GgufFile> gguf_;
    std::unique_ptr<Vocab> vocab_;
    const ArchSpec* arch_ = nullptr;
    WeightView tok_embd_{}, output_{};
    std::vector<float> output_norm_, rope_freqs_;
    std::vector<LayerWeights> layers_;
    HadamardContract hadamard_;
    Rotation embd_rot_{}, output_rot_{};
    std::vector<std::pair<GgmlType, uint64_t>> used_tensors_;  // type and bytes of every tensor read
    int n_gpu_layers_ = 0;
    std::shared_ptr<const GpuModel> gpu_;  // device weights (CUDA builds with offloaded layers)
    HugeBuffer cpu_weights_;               // the copies made by copy_to_huge_pages (or empty)
    uint64_t repacked_bytes_ = 0;          // weights repacked (PTQ1_0_R16, Q8_0_R4) by either of those
};

}  // namespace bonsai
