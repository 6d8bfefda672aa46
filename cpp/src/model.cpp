// Model loading: open the file, pick the architecture, read and check the hyperparameters, bind
// every tensor the architecture needs (validated by ModelLoader), load the vocabulary.
#include "bonsai/model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "../backends/cpu/repack.h"
#include "arch/arch.h"
#ifdef BONSAI_CUDA
#include "bonsai/cuda/dequantize.h"
#include "bonsai/cuda/gpu_backend.h"
#endif
#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/ops.h"
#include "bonsai/quants.h"
#include "bonsai/vocab.h"
#include "model_loader.h"
#include "sys_memory.h"

namespace bonsai {

namespace {

std::string shape_str(const std::vector<int64_t>& ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

void check_hparams(const Hparams& hp) {
    auto need = [&](bool ok, const std::string& what) {
        if (!ok) throw Error("invalid " + hp.arch + " hyperparameters: " + what);
    };
    need(hp.n_embd > 0, "embedding_length must be positive");
    need(hp.n_layer > 0, "block_count must be positive");
    need(hp.n_ff > 0, "feed_forward_length must be positive");
    need(hp.n_head > 0 && hp.n_head_kv > 0, "head counts must be positive");
    need(hp.n_head % hp.n_head_kv == 0, "attention.head_count (" + std::to_string(hp.n_head) +
         ") must be a multiple of attention.head_count_kv (" + std::to_string(hp.n_head_kv) + ")");
    need(hp.head_dim > 0, "head size must be positive");
    need(hp.n_rot > 0 && hp.n_rot % 2 == 0 && hp.n_rot <= hp.head_dim,
         "rope.dimension_count (" + std::to_string(hp.n_rot) + ") must be even and <= the head size (" +
         std::to_string(hp.head_dim) + ")");
    need(hp.rms_eps > 0.0f, "attention.layer_norm_rms_epsilon must be positive");
    need(hp.rope_theta > 0.0f, "rope.freq_base must be positive");
    need(hp.n_vocab > 0, "the vocabulary is empty");
}

// Threads for copying or repacking `bytes` of weights at load: one per 64 MiB, at most 8 and the
// CPU's count.
size_t load_threads(uint64_t bytes) {
    return std::clamp<size_t>(static_cast<size_t>(bytes / (64u << 20)), 1,
                              std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

// fn(lo, hi) over [0, total) in ranges of `per`, the first on this thread, each other on one of
// its own, up to n_threads in all.
template <class F>
void split_over_threads(size_t total, size_t per, size_t n_threads, F fn) {
    std::vector<std::thread> threads;
    for (size_t t = 1; t < n_threads && t * per < total; ++t)
        threads.emplace_back(fn, t * per, std::min(total, (t + 1) * per));
    fn(size_t{0}, std::min(total, per));
    for (std::thread& th : threads) th.join();
}

}  // namespace

bool ModelLoader::has(const std::string& name) const { return gguf().find_tensor(name) != nullptr; }

const GgufTensor& ModelLoader::tensor(const std::string& name) const {
    const GgufTensor* t = gguf().find_tensor(name);
    if (!t) {
        throw Error("tensor '" + name + "' is missing from " + gguf().path() + " (required by the " +
                    m_.hp_.arch + " architecture); re-convert the model");
    }
    if (!t->supported) {
        throw Error("tensor '" + name + "' has type " + ggml_type_label(t->file_id) +
                    ", which this engine has no kernel for; re-convert it to F16, Q8_0 or a ternary type");
    }
    return *t;
}

WeightView ModelLoader::matrix(const std::string& name, int64_t cols, int64_t rows) {
    const GgufTensor& t = tensor(name);
    if (t.ne.size() != 2 || t.ne[0] != cols || t.ne[1] != rows) {
        throw Error("tensor '" + name + "' has shape " + shape_str(t.ne) + ", expected [" +
                    std::to_string(cols) + ", " + std::to_string(rows) + "] from the hyperparameters");
    }
    const TypeTraits* tr = type_traits(t.type);
    if (!tr || cols % tr->block_size != 0) {
        throw Error("tensor '" + name + "' of type " + ggml_type_label(t.file_id) + " has rows of " +
                    std::to_string(cols) + " elements, not a multiple of the block size");
    }
    WeightView w{};
    w.type = t.type;
    w.data = t.data;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = type_row_bytes(t.type, cols);
    if (t.nbytes < static_cast<uint64_t>(w.row_bytes) * rows) {
        throw Error("tensor '" + name + "' holds " + std::to_string(t.nbytes) + " bytes, fewer than its shape needs");
    }
    m_.used_tensors_.emplace_back(t.type, static_cast<uint64_t>(w.row_bytes) * rows);
    return w;
}

std::vector<float> ModelLoader::vector(const std::string& name, int64_t n) {
    const GgufTensor& t = tensor(name);
    if (t.n_elements() != n || t.ne.empty() || t.ne[0] != n) {
        throw Error("tensor '" + name + "' has shape " + shape_str(t.ne) + ", expected [" +
                    std::to_string(n) + "] from the hyperparameters");
    }
    const TypeTraits* tr = type_traits(t.type);
    if (!tr || n % tr->block_size != 0) {
        throw Error("tensor '" + name + "' of type " + ggml_type_label(t.file_id) + " cannot hold " +
                    std::to_string(n) + " elements; store it as F32");
    }
    std::vector<float> out(n);
    dequantize_row(t.type, t.data, out.data(), n);
    m_.used_tensors_.emplace_back(t.type, t.nbytes);
    return out;
}

std::vector<float> ModelLoader::floats_2d(const std::string& name, int64_t ne0, int64_t ne1) {
    const GgufTensor& t = tensor(name);
    if (t.ne.size() != 2 || t.ne[0] != ne0 || t.ne[1] != ne1) {
        throw Error("tensor '" + name + "' has shape " + shape_str(t.ne) + ", expected [" + std::to_string(ne0) +
                    ", " + std::to_string(ne1) + "] from the hyperparameters");
    }
    const TypeTraits* tr = type_traits(t.type);
    if (!tr || ne0 % tr->block_size != 0) {
        throw Error("tensor '" + name + "' of type " + ggml_type_label(t.file_id) + " has rows of " +
                    std::to_string(ne0) + " elements, not a multiple of the block size; store it as F32");
    }
    std::vector<float> out(static_cast<size_t>(ne0 * ne1));
    const size_t row_bytes = type_row_bytes(t.type, ne0);
    for (int64_t r = 0; r < ne1; ++r) dequantize_row(t.type, t.data + r * row_bytes, out.data() + r * ne0, ne0);
    m_.used_tensors_.emplace_back(t.type, t.nbytes);
    return out;
}

Model::~Model() = default;

std::shared_ptr<const Model> Model::load(const std::string& path, const ModelParams& params) {
    std::shared_ptr<Model> m(new Model());
    m->params_ = params;
    if (params.n_gpu_layers < -1)
        throw Error("n_gpu_layers must be >= -1 (-1 = all layers), got " + std::to_string(params.n_gpu_layers));
    m->gguf_ = GgufFile::open(path, params.use_mmap);
    const GgufFile& f = *m->gguf_;

    m->hadamard_ = HadamardContract::read(f);
    if (!f.has("general.architecture")) {
        throw Error(path + " has no general.architecture key; it is not a model file (re-convert it)");
    }
    Hparams& hp = m->hp_;
    hp.arch = f.get_string("general.architecture");
    m->arch_ = &find_arch(hp.arch);
    m->arch_->load_hparams(f, hp);

    const GgufTensor* emb = f.find_tensor("token_embd.weight");
    if (!emb) throw Error("tensor 'token_embd.weight' is missing from " + path + "; re-convert the model");
    const std::string vkey = hp.arch + ".vocab_size";
    hp.n_vocab = f.has(vkey) ? static_cast<int64_t>(f.get_u64(vkey))
                             : (emb->ne.size() == 2 ? emb->ne[1] : 0);
    check_hparams(hp);
    // Every block has several tensors: a block count above the file's tensor count is corrupt, and
    // is refused before anything is sized by it (layers_ below).
    if (static_cast<uint64_t>(hp.n_layer) > f.tensors().size()) {
        throw Error(path + ": " + hp.arch + ".block_count is " + std::to_string(hp.n_layer) + " but the file holds " +
                    std::to_string(f.tensors().size()) + " tensors in all; the file is corrupt, re-convert it");
    }

    ModelLoader ld(*m);
    m->tok_embd_ = ld.matrix("token_embd.weight", hp.n_embd, hp.n_vocab);
    m->output_norm_ = ld.vector("output_norm.weight", hp.n_embd);
    hp.tied_output = !ld.has("output.weight");
    m->output_ = hp.tied_output ? m->tok_embd_ : ld.matrix("output.weight", hp.n_embd, hp.n_vocab);
    if (ld.has("rope_freqs.weight")) m->rope_freqs_ = ld.vector("rope_freqs.weight", hp.n_rot / 2);
    m->layers_.resize(hp.n_layer);
    for (int64_t il = 0; il < hp.n_layer; ++il) m->arch_->load_layer(ld, hp, il, m->layers_[il]);
    if (m->hadamard_.present) m->bind_hadamard();

    m->vocab_ = std::make_unique<Vocab>(Vocab::from_gguf(f));
    m->vocab_->check_compatible(hp.n_vocab);
    if (!params.tokenizer_path.empty()) {
        auto override_vocab = std::make_unique<Vocab>(Vocab::from_spm_model_file(params.tokenizer_path));
        override_vocab->check_replaces(*m->vocab_, hp.n_vocab);
        m->vocab_ = std::move(override_vocab);
    }
    m->offload(params);
    if (params.huge_pages && m->gguf_->mapping()->is_mapped() && huge_pages_available()) m->copy_to_huge_pages();
    if (!m->gguf_->mapping()->is_mapped()) m->repack_in_place();
    if (params.verbose) {
        std::fprintf(stderr, "%s: %s, %lld layers, vocab %lld\n%s%s", path.c_str(), hp.arch.c_str(),
                     static_cast<long long>(hp.n_layer), static_cast<long long>(hp.n_vocab), m->layer_table().c_str(),
                     m->memory_table().c_str());
    }
    return m;
}

// Every name of prism.hadamard.weight_names must be one of this model's linear weights; each gets
// the rotation of its input width. A rotated token_embd (inverse_weight_names) is unrotated after
// the lookup, and when the head is tied to it the head reads the same stored rows WHT_B(s ⊙ e), so
// the head's input is rotated like a folded matmul's: (s ⊙ WHT_B(z)) · h = z · WHT_B(s ⊙ h).
void Model::bind_hadamard() {
    const HadamardContract& c = hadamard_;
    std::vector<std::pair<std::string, std::pair<const WeightView*, Rotation*>>> linear;
    for (size_t il = 0; il < layers_.size(); ++il) {
        LayerWeights& w = layers_[il];
        const std::string b = "blk." + std::to_string(il) + ".";
        linear.push_back({b + "attn_q.weight", {&w.wq, &w.r_q}});
        linear.push_back({b + "attn_k.weight", {&w.wk, &w.r_k}});
        linear.push_back({b + "attn_v.weight", {&w.wv, &w.r_v}});
        linear.push_back({b + "attn_output.weight", {&w.wo, &w.r_o}});
        linear.push_back({b + "ffn_gate.weight", {&w.w_gate, &w.r_gate}});
        linear.push_back({b + "ffn_up.weight", {&w.w_up, &w.r_up}});
        linear.push_back({b + "ffn_down.weight", {&w.w_down, &w.r_down}});
        if (hp_.is_recurrent(static_cast<int64_t>(il))) {  // qwen35 GDN layers
            linear.push_back({b + "attn_qkv.weight", {&w.w_qkv, &w.r_qkv}});
            linear.push_back({b + "attn_gate.weight", {&w.w_z, &w.r_z}});
            linear.push_back({b + "ssm_out.weight", {&w.w_ssm_out, &w.r_ssm_out}});
        }
    }
    if (!hp_.tied_output) linear.push_back({"output.weight", {&output_, &output_rot_}});
    for (const std::string& name : c.weight_names) {
        auto it = linear.begin();
        while (it != linear.end() && it->first != name) ++it;
        if (it == linear.end()) {
            std::string why = "; it must name a linear weight of this " + hp_.arch +
                              " model (blk.N.attn_q/attn_k/attn_v/attn_output/ffn_gate/ffn_up/ffn_down.weight" +
                              (hp_.recurrent.empty() ? "" : ", blk.N.attn_qkv/attn_gate/ssm_out.weight of a GDN layer") +
                              (hp_.tied_output ? "; the output head is tied to token_embd.weight, which is folded "
                                                 "through inverse_weight_names" : ", output.weight") + ")";
            if (name == "token_embd.weight") why = "; token_embd.weight is an embedding: list it in "
                                                   "prism.hadamard.inverse_weight_names instead";
            throw Error(gguf_->path() + ": prism.hadamard.weight_names lists '" + name + "', which is not a folded "
                        "linear weight of this file" + why + " (re-convert the model)");
        }
        *it->second.second = c.rotation_for(name, it->second.first->cols);
    }
    if (c.inverse_token_embd) {
        embd_rot_ = c.rotation_for("token_embd.weight", hp_.n_embd);
        if (hp_.tied_output) output_rot_ = embd_rot_;
    }
    used_tensors_.emplace_back(TYPE_F32, static_cast<uint64_t>(c.sign_floats()) * sizeof(float));
}

// The weights the CPU streams once per decoded token: every linear weight of the CPU's layers and,
// unless the GPU runs it, the output head (and the token embedding when the head is tied to it:
// the same bytes).
std::vector<WeightView*> Model::cpu_streamed_views() {
    std::vector<WeightView*> views;
    for (int64_t il = n_gpu_layers_; il < hp_.n_layer; ++il) {
        LayerWeights& w = layers_[static_cast<size_t>(il)];
        for (WeightView* v : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down, &w.w_qkv, &w.w_z,
                              &w.w_alpha, &w.w_beta, &w.w_ssm_out})
            views.push_back(v);
    }
    if (!gpu_output()) {
        views.push_back(&output_);
        if (hp_.tied_output) views.push_back(&tok_embd_);
    }
    return views;
}

// PTQ1_0 and Q8_0 matrices are repacked (PTQ1_0_R16 or R16L, Q8_0_R4) on the AVX-512 path, unless the head
// is tied: the embedding lookup reads those bytes too.
bool Model::repacks(const WeightView* v) const {
    return params_.repack && active_cpu_path() == CpuPath::AVX512 && v->data && v->rows > 0 &&
           cpu::repacked_type(v->type, v->cols) != v->type && !(hp_.tied_output && (v == &output_ || v == &tok_embd_));
}

// Decode reads every weight of the CPU's layers (and the output head, unless the GPU runs it) once
// per token. Out of a file mapping it streams them through the page cache's 4 KiB pages; copied
// into one HugeBuffer it streams them through 2 MiB pages, where a read needs 512 times fewer TLB
// entries and page walks and the hardware prefetchers are not stopped at every 4 KiB boundary:
// decode reads the weights faster (benchmarks/ab_decode.py --b-no-huge-pages). The copy is skipped
// when it would take more than half of the available memory (a model that barely fits is left
// to the page cache, which can give its pages back). The mapping's pages of the copied weights are
// advised away once the copy is done, so the process does not hold both. On the AVX-512 path the
// PTQ1_0 and Q8_0 matrices are written in the CPU backend's own orders on the way
// (backends/cpu/repack.h; --no-repack keeps the file's order), which its AVX-512 kernels read
// faster; the kernels of every other path convert them back as they read.
void Model::copy_to_huge_pages() {
    std::vector<WeightView*> views = cpu_streamed_views();
    struct Piece {
        const uint8_t* src;
        size_t off, bytes;
        int64_t rows = 0;  // > 0: repacked a tile (tile rows) at a time (row_bytes each)
        size_t row_bytes = 0;
        GgmlType type = TYPE_F32;
        int64_t tile = 4;
    };
    std::vector<Piece> pieces;             // each source once (a tied head and embedding share one)
    std::map<const void*, size_t> offset;  // source -> its offset in the copy
    size_t total = 0;
    uint64_t repacked_bytes = 0;
    for (const WeightView* v : views) {
        if (!v->data || v->rows <= 0 || offset.count(v->data)) continue;
        const size_t bytes = static_cast<size_t>(v->rows) * v->row_bytes;
        offset[v->data] = total;
        Piece pc{static_cast<const uint8_t*>(v->data), total, bytes};
        if (repacks(v)) {
            pc.rows = v->rows;
            pc.row_bytes = v->row_bytes;
            pc.type = cpu::repacked_type(v->type, v->cols);
            pc.tile = cpu::tile_rows(pc.type);
            repacked_bytes += bytes;
        }
        pieces.push_back(pc);
        total += (bytes + 63) / 64 * 64;
    }
    if (total == 0) return;
    const uint64_t avail = mem_available_bytes();
    if (avail > 0 && total > avail / 2) {
        if (params_.verbose)
            std::fprintf(stderr, "note: the CPU weights (%s) stay in the file mapping: a copy into huge pages would "
                         "take more than half of the available memory (%s)\n", format_bytes(total).c_str(),
                         format_bytes(avail).c_str());
        return;
    }
    HugeBuffer buf(total);
    if (!buf.data()) return;  // decode works from the mapping as well
    // Several threads copy 2 MiB-aligned slices of the buffer: the first touch of each page (the
    // kernel zeroing it, on a virtual machine often the host backing it) costs more than the copy.
    constexpr size_t kSlice = size_t{2} << 20;
    const size_t n_threads = load_threads(total);
    const size_t per = (total / n_threads + kSlice - 1) / kSlice * kSlice;
    // A thread writes the bytes [lo, hi) of plain pieces and the tiles of repacked ones that start
    // there.
    auto copy_range = [&](size_t lo, size_t hi) {
        for (const Piece& pc : pieces) {
            const size_t b = std::max(lo, pc.off), e = std::min(hi, pc.off + pc.bytes);
            if (b >= e) continue;
            if (pc.rows == 0) {
                std::memcpy(buf.data() + b, pc.src + (b - pc.off), e - b);
                continue;
            }
            const size_t tile = static_cast<size_t>(pc.tile) * pc.row_bytes;
            for (size_t k = (b - pc.off + tile - 1) / tile; pc.off + k * tile < e; ++k)
                cpu::repack_rows(pc.type, pc.src, buf.data() + pc.off, pc.rows, static_cast<int64_t>(pc.row_bytes),
                                 static_cast<int64_t>(k) * pc.tile, std::min<int64_t>(pc.rows, (static_cast<int64_t>(k) + 1) * pc.tile));
        }
    };
    split_over_threads(total, per, n_threads, copy_range);
    for (const Piece& pc : pieces) gguf_->mapping()->advise_unneeded(pc.src, pc.bytes);
    for (WeightView* v : views) {
        if (!v->data || v->rows <= 0) continue;
        if (repacks(v)) v->type = cpu::repacked_type(v->type, v->cols);
        v->data = buf.data() + offset.at(v->data);
    }
    cpu_weights_ = std::move(buf);
    repacked_bytes_ = repacked_bytes;
}

// A file read into memory (--no-mmap) is already in a buffer of this process's own, so its PTQ1_0
// and Q8_0 matrices are repacked where they are, a 4-row tile at a time through a small copy, by
// a few threads (each a share of the tiles) as in copy_to_huge_pages.
void Model::repack_in_place() {
    uint8_t* const buf = gguf_->mapping()->buffer();
    const uint8_t* const base = gguf_->mapping()->data();
    if (!buf) return;
    struct Piece {
        uint8_t* data;
        int64_t rows, row_bytes;
        GgmlType type;
        int64_t first_tile;  // tiles of the pieces before this one
        int64_t tile;        // rows per tile
    };
    std::vector<Piece> pieces;
    std::set<const void*> seen;
    int64_t tiles = 0, max_row_bytes = 0;
    uint64_t bytes = 0;
    std::vector<WeightView*> views = cpu_streamed_views();
    for (const WeightView* v : views) {
        if (!repacks(v) || !seen.insert(v->data).second) continue;
        const auto rb = static_cast<int64_t>(v->row_bytes);
        const GgmlType type = cpu::repacked_type(v->type, v->cols);
        const int64_t tr = cpu::tile_rows(type);
        pieces.push_back({buf + (static_cast<const uint8_t*>(v->data) - base), v->rows, rb, type, tiles, tr});
        tiles += (v->rows + tr - 1) / tr;
        max_row_bytes = std::max(max_row_bytes, rb);
        bytes += static_cast<uint64_t>(v->rows) * v->row_bytes;
    }
    if (pieces.empty()) return;
    const size_t n_threads = load_threads(bytes);
    auto repack_tiles = [&](size_t t0, size_t t1) {  // tiles [t0, t1) over all pieces
        std::vector<uint8_t> tmp(static_cast<size_t>(cpu::kMaxTileRows * max_row_bytes));
        for (const Piece& pc : pieces) {
            const int64_t n = (pc.rows + pc.tile - 1) / pc.tile;
            const int64_t b = std::max(static_cast<int64_t>(t0), pc.first_tile) - pc.first_tile;
            const int64_t e = std::min(static_cast<int64_t>(t1), pc.first_tile + n) - pc.first_tile;
            if (b < e)
                cpu::repack_rows_in_place(pc.type, pc.data, pc.rows, pc.row_bytes, pc.tile * b,
                                          std::min(pc.rows, pc.tile * e), tmp.data());
        }
    };
    const auto total = static_cast<size_t>(tiles);
    split_over_threads(total, (total + n_threads - 1) / n_threads, n_threads, repack_tiles);
    for (WeightView* v : views)
        if (repacks(v)) v->type = cpu::repacked_type(v->type, v->cols);
    repacked_bytes_ = bytes;
}

// Offload policy: n_gpu_layers -1 or above n_layer means every layer. Without a CUDA backend or
// without a device, a positive request runs everything on the CPU after one note on stderr (as
// llama.cpp does), so the same command line works on every machine.
void Model::offload(const ModelParams& params) {
    const int64_t want = params.n_gpu_layers < 0 || params.n_gpu_layers > hp_.n_layer ? hp_.n_layer
                                                                                       : params.n_gpu_layers;
    if (want == 0) return;
#ifdef BONSAI_CUDA
    if (cuda_device_count() == 0) {
        if (params.n_gpu_layers > 0)
            std::fprintf(stderr, "note: no CUDA device is available; n_gpu_layers = %d is ignored and every "
                         "layer runs on the CPU\n", params.n_gpu_layers);
        return;
    }
    gpu_ = gpu_model_upload(*this, static_cast<int>(want), want == hp_.n_layer);
    n_gpu_layers_ = static_cast<int>(want);
#else
    if (params.n_gpu_layers > 0)
        std::fprintf(stderr, "note: this build has no CUDA backend (rebuild with -DBONSAI_CUDA=ON); "
                     "n_gpu_layers = %d is ignored and every layer runs on the CPU\n", params.n_gpu_layers);
#endif
}

ModelMemory Model::memory_report() const {
    ModelMemory r;
    for (const auto& [type, bytes] : used_tensors_) {
        r.weights_bytes += bytes;
        const TypeTraits* tr = type_traits(type);
        r.bytes_by_type[tr ? tr->name : "?"] += bytes;
    }
    r.file_bytes = gguf_->file_size();
    r.mapped = gguf_->mapping()->is_mapped();
    r.huge_page_bytes = cpu_weights_.size();
    r.repacked_bytes = repacked_bytes_;
    r.n_gpu_layers = n_gpu_layers_;
    r.gpu_output = gpu_output();
#ifdef BONSAI_CUDA
    if (gpu_) {
        const GpuWeightsMemory g = gpu_model_memory(*gpu_);
        r.gpu_weights_bytes = g.weights_bytes;
        r.gpu_bytes_by_type = g.bytes_by_type;
        r.gpu_allocated_bytes = g.allocated_bytes;
    }
#endif
    return r;
}

std::string Model::memory_table() const {
    const ModelMemory r = memory_report();
    std::ostringstream os;
    char line[160];
    std::snprintf(line, sizeof line, "weights: CPU %.1f MiB (%s)", static_cast<double>(r.weights_bytes) / 1048576.0,
                  r.mapped ? "file mapping, every tensor" : "in memory, every tensor");
    os << line;
    if (r.huge_page_bytes > 0) {
        std::snprintf(line, sizeof line, "; %.1f MiB streamed by the CPU copied into huge pages",
                      static_cast<double>(r.huge_page_bytes) / 1048576.0);
        os << line;
        if (r.repacked_bytes > 0) {
            std::snprintf(line, sizeof line, " (%.1f MiB of it repacked for the AVX-512 kernels)",
                          static_cast<double>(r.repacked_bytes) / 1048576.0);
            os << line;
        }
    } else if (r.repacked_bytes > 0) {
        std::snprintf(line, sizeof line, "; %.1f MiB of it repacked in place for the AVX-512 kernels",
                      static_cast<double>(r.repacked_bytes) / 1048576.0);
        os << line;
    }
    if (r.n_gpu_layers > 0) {
        std::snprintf(line, sizeof line, ", GPU %.1f MiB in one allocation of %.1f MiB:",
                      static_cast<double>(r.gpu_weights_bytes) / 1048576.0,
                      static_cast<double>(r.gpu_allocated_bytes) / 1048576.0);
        os << line;
        for (const auto& [name, bytes] : r.gpu_bytes_by_type) {
            std::snprintf(line, sizeof line, " %s %.1f MiB", name.c_str(), static_cast<double>(bytes) / 1048576.0);
            os << line;
        }
    }
    os << "\n";
    return os.str();
}

std::string Model::layer_table() const {
    auto tn = [](const WeightView& w) { return std::string(type_traits(w.type)->name); };
    std::ostringstream os;
    os << "token_embd: CPU " << tn(tok_embd_) << "\n";
    for (size_t il = 0; il < layers_.size(); ++il) {
        const LayerWeights& w = layers_[il];
        char head[32];
        std::snprintf(head, sizeof head, "layer %3zu: %s", il, static_cast<int64_t>(il) < n_gpu_layers_ ? "GPU" : "CPU");
        if (hp_.is_recurrent(static_cast<int64_t>(il))) {
            os << head << "  GDN qkv " << tn(w.w_qkv) << "  z " << tn(w.w_z) << "  alpha " << tn(w.w_alpha)
               << "  beta " << tn(w.w_beta) << "  out " << tn(w.w_ssm_out);
        } else {
            os << head << "  q " << tn(w.wq) << "  k " << tn(w.wk) << "  v " << tn(w.wv) << "  o " << tn(w.wo);
        }
        os << "  gate " << tn(w.w_gate) << "  up " << tn(w.w_up) << "  down " << tn(w.w_down) << "\n";
    }
    os << "output: " << (gpu_output() ? "GPU " : "CPU ") << tn(output_) << (hp_.tied_output ? " (tied to token_embd)" : "") << "\n";
    if (hadamard_.present) {
        os << "hadamard: block " << hadamard_.block << ", " << hadamard_.weight_names.size() << " folded weights, signs "
           << (hadamard_.explicit_signs ? "explicit" : "identity") << (hadamard_.inverse_token_embd ? ", token_embd inverse" : "")
           << "\n";
    }
    return os.str();
}

}  // namespace bonsai
