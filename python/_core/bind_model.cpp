// Binding of the engine core: _core.Model, _core.Context and _core.Sampler.
//
// Each Python object is an RAII handle around the C++ object (close() releases it early, the
// context-manager protocol calls close()); a Context keeps its Model alive through the shared
// pointer even after Model.close(). Loading and decoding release the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "bind.h"
#include "bonsai/context.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/model.h"
#include "bonsai/sampling.h"
#include "bonsai/vocab.h"

namespace py = pybind11;

namespace bonsai_py {

namespace {

using bonsai::Error;

struct PyModel {
    std::shared_ptr<const bonsai::Model> model;
    const bonsai::Model& get() const {
        if (!model) throw Error("the model is closed");
        return *model;
    }
};

struct PyContext {
    std::unique_ptr<bonsai::Context> ctx;
    std::mutex busy;  // decode runs without the GIL: one call at a time per context
    bonsai::Context& get() const {
        if (!ctx) throw Error("the context is closed");
        return *ctx;
    }
};

struct PySampler {
    std::unique_ptr<bonsai::Sampler> sampler;
};

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

bonsai::GgmlType parse_cache_type(const std::string& name, const char* which) {
    const std::string s = lower(name);
    if (s == "f16") return bonsai::TYPE_F16;
    if (s == "q8_0") return bonsai::TYPE_Q8_0;
    throw Error(std::string("unknown ") + which + " cache type '" + name + "'; use f16 or q8_0");
}

bonsai::ActMode parse_act_mode(const std::string& name) {
    const std::string s = lower(name);
    if (s == "int8") return bonsai::ActMode::INT8;
    if (s == "float") return bonsai::ActMode::FLOAT;
    throw Error("unknown act_mode '" + name + "'; use int8 or float");
}

py::object value_to_py(const bonsai::GgufValue& v) {
    using T = bonsai::GgufValueType;
    auto elem = [&](size_t i) -> py::object {
        switch (v.elem_type) {
            case T::BOOL: return py::bool_(v.u[i] != 0);
            case T::UINT8: case T::UINT16: case T::UINT32: case T::UINT64: return py::int_(v.u[i]);
            case T::INT8: case T::INT16: case T::INT32: case T::INT64: return py::int_(v.i[i]);
            case T::FLOAT32: case T::FLOAT64: return py::float_(v.f[i]);
            case T::STRING: return py::bytes(v.s[i]).attr("decode")("utf-8", "replace");
            default: return py::none();
        }
    };
    if (!v.is_array()) return elem(0);
    py::list out;
    for (size_t i = 0; i < v.size(); ++i) out.append(elem(i));
    return out;
}

std::vector<int32_t> to_int32(const py::handle& obj, const char* what, int64_t lo, int64_t hi) {
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> a =
        py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(obj);
    if (!a || a.ndim() != 1) throw Error(std::string(what) + " must be a 1-D sequence of integers");
    std::vector<int32_t> out(a.size());
    for (py::ssize_t i = 0; i < a.size(); ++i) {
        const int64_t x = a.at(i);
        if (x < lo || x > hi) {
            throw Error(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(x) + " is out of range");
        }
        out[i] = static_cast<int32_t>(x);
    }
    return out;
}

py::dict model_memory(const bonsai::Model& m) {
    const bonsai::ModelMemory r = m.memory_report();
    py::dict d, by_type;
    for (const auto& [k, v] : r.bytes_by_type) by_type[py::str(k)] = v;
    d["weights_bytes"] = r.weights_bytes;
    d["weights_by_type"] = by_type;
    d["file_bytes"] = r.file_bytes;
    d["mapped"] = r.mapped;
    d["huge_page_bytes"] = r.huge_page_bytes;
    d["repacked_bytes"] = r.repacked_bytes;
    py::dict gpu_types;
    for (const auto& [k, v] : r.gpu_bytes_by_type) gpu_types[py::str(k)] = v;
    d["n_gpu_layers"] = r.n_gpu_layers;
    d["gpu_output"] = r.gpu_output;
    d["gpu_weights_bytes"] = r.gpu_weights_bytes;
    d["gpu_weights_by_type"] = gpu_types;
    d["gpu_allocated_bytes"] = r.gpu_allocated_bytes;
    return d;
}

py::array_t<float> decode(PyContext& self, const py::object& tokens, const py::object& pos,
                          const py::object& seq_ids, const py::object& logits) {
    bonsai::Context& ctx = self.get();
    bonsai::Batch b;
    b.token = to_int32(tokens, "tokens", INT32_MIN, INT32_MAX);
    const size_t n = b.token.size();
    if (n == 0) throw Error("decode: the batch is empty");
    b.seq_id = seq_ids.is_none() ? std::vector<int32_t>(n, 0) : to_int32(seq_ids, "seq_ids", INT32_MIN, INT32_MAX);
    if (b.seq_id.size() != n) throw Error("decode: seq_ids has a different length than tokens");
    if (pos.is_none()) {
        std::unordered_map<int32_t, int32_t> next;
        b.pos.resize(n);
        for (size_t i = 0; i < n; ++i) {
            const int32_t s = b.seq_id[i];
            auto it = next.find(s);
            if (it == next.end()) {
                const int32_t start = (s >= 0 && s < ctx.params().n_seq_max) ? ctx.seq_pos_max(s) + 1 : 0;
                it = next.emplace(s, start).first;
            }
            b.pos[i] = it->second++;
        }
    } else {
        b.pos = to_int32(pos, "pos", INT32_MIN, INT32_MAX);
        if (b.pos.size() != n) throw Error("decode: pos has a different length than tokens");
    }
    if (py::isinstance<py::str>(logits)) {
        const std::string s = logits.cast<std::string>();
        if (s == "last") {
            b.logits.assign(n, 0);
            b.logits[n - 1] = 1;
        } else if (s == "all") {
            b.logits.assign(n, 1);
        } else {
            throw Error("decode: logits must be 'last', 'all' or a boolean mask, got '" + s + "'");
        }
    } else {
        std::vector<int32_t> mask = to_int32(logits, "logits mask", 0, 1);
        if (mask.size() != n) throw Error("decode: the logits mask has a different length than tokens");
        b.logits.assign(mask.begin(), mask.end());
    }
    const int64_t n_vocab = ctx.model().hparams().n_vocab;
    // The rows go straight into the returned array, allocated here (with the GIL) for the rows the
    // mask asks for: Context::decode outputs exactly those.
    const int64_t want = std::count_if(b.logits.begin(), b.logits.end(), [](int32_t v) { return v != 0; });
    py::array_t<float> out({static_cast<py::ssize_t>(want), static_cast<py::ssize_t>(n_vocab)});
    float* dst = out.mutable_data();
    int64_t n_out = 0;
    {
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(self.busy);
        bonsai::Context& c = self.get();  // not closed meanwhile
        c.decode(b);
        n_out = c.n_outputs();
        if (n_out == want) std::copy(c.all_logits(), c.all_logits() + n_out * n_vocab, dst);
    }
    if (n_out != want)
        throw Error("decode: internal error: " + std::to_string(n_out) + " output rows for " + std::to_string(want) +
                    " requested logits");
    return out;
}

py::array_t<float> embed(PyContext& self, const py::object& tokens, int seq, const py::object& pooling) {
    bonsai::Context& ctx = self.get();
    const std::vector<int32_t> toks = to_int32(tokens, "tokens", INT32_MIN, INT32_MAX);
    const bonsai::Pooling p = pooling.is_none() ? bonsai::model_pooling(ctx.model())
                                                : bonsai::parse_pooling(py::str(pooling).cast<std::string>());
    const int64_t n_embd = ctx.model().hparams().n_embd;
    std::vector<float> rows;
    {
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(self.busy);
        rows = self.get().embed(toks, seq, p);
    }
    py::array_t<float> out({static_cast<py::ssize_t>(rows.size() / n_embd), static_cast<py::ssize_t>(n_embd)});
    std::copy(rows.begin(), rows.end(), out.mutable_data());
    return out;
}

}  // namespace

void bind_model(py::module_& m) {
    py::class_<PyModel>(m, "Model", "A loaded model file (immutable; shared by contexts).")
        .def(py::init([](const std::string& path, bool use_mmap, int n_gpu_layers, py::object tokenizer,
                         bool verbose, bool huge_pages, bool repack) {
                 bonsai::ModelParams p;
                 p.use_mmap = use_mmap;
                 p.huge_pages = huge_pages;
                 p.repack = repack;
                 p.n_gpu_layers = n_gpu_layers;
                 p.verbose = verbose;
                 if (!tokenizer.is_none()) p.tokenizer_path = py::str(tokenizer).cast<std::string>();
                 auto h = std::make_unique<PyModel>();
                 py::gil_scoped_release release;
                 h->model = bonsai::Model::load(path, p);
                 return h;
             }),
             py::arg("path"), py::arg("use_mmap") = true, py::arg("n_gpu_layers") = 0,
             py::arg("tokenizer") = py::none(), py::arg("verbose") = false, py::arg("huge_pages") = true,
             py::arg("repack") = true)
        .def_property_readonly("n_vocab", [](const PyModel& s) { return s.get().hparams().n_vocab; })
        .def_property_readonly("n_ctx_train", [](const PyModel& s) { return s.get().hparams().n_ctx_train; })
        .def_property_readonly("n_embd", [](const PyModel& s) { return s.get().hparams().n_embd; })
        .def_property_readonly("n_layer", [](const PyModel& s) { return s.get().hparams().n_layer; })
        .def_property_readonly("arch", [](const PyModel& s) { return s.get().hparams().arch; })
        .def_property_readonly("n_gpu_layers", [](const PyModel& s) { return s.get().n_gpu_layers(); },
                               "Layers running on the GPU (the first ones); 0 without CUDA or a device.")
        .def_property_readonly("hparams", [](const PyModel& s) {
            const bonsai::Hparams& h = s.get().hparams();
            py::dict d;
            d["arch"] = h.arch; d["n_vocab"] = h.n_vocab; d["n_ctx_train"] = h.n_ctx_train;
            d["n_embd"] = h.n_embd; d["n_layer"] = h.n_layer; d["n_head"] = h.n_head;
            d["n_head_kv"] = h.n_head_kv; d["head_dim"] = h.head_dim; d["n_ff"] = h.n_ff;
            d["n_rot"] = h.n_rot; d["rms_eps"] = h.rms_eps; d["rope_theta"] = h.rope_theta;
            d["rope_type"] = h.rope_type == bonsai::RopeType::NEOX ? "neox" : "normal";
            d["tied_output"] = h.tied_output;
            return d;
        })
        .def_property_readonly("metadata", [](const PyModel& s) {
            py::dict d;
            for (const bonsai::GgufKv& kv : s.get().gguf().metadata()) d[py::str(kv.key)] = value_to_py(kv.value);
            return d;
        })
        .def("tokenize", [](const PyModel& s, const std::string& text, bool add_special, bool parse_special) {
                 return s.get().vocab().tokenize(text, add_special, parse_special);
             },
             py::arg("text"), py::arg("add_special") = true, py::arg("parse_special") = false)
        .def("detokenize", [](const PyModel& s, const py::object& ids) {
                 return py::bytes(s.get().vocab().detokenize(to_int32(ids, "ids", INT32_MIN, INT32_MAX)));
             }, py::arg("ids"), "Token ids to UTF-8 bytes.")
        .def("token_to_piece", [](const PyModel& s, int32_t id) {
                 if (id < 0 || id >= s.get().hparams().n_vocab) {
                     throw Error("token id " + std::to_string(id) + " is outside the vocabulary");
                 }
                 return py::bytes(s.get().vocab().token_to_piece(id));
             }, py::arg("id"))
        .def_property_readonly("pooling_type", [](const PyModel& s) {
                                   return std::string(bonsai::pooling_name(bonsai::model_pooling(s.get())));
                               },
                               "The file's <arch>.pooling_type as a name (none when the key is absent).")
        .def_property_readonly("bos", [](const PyModel& s) { return s.get().vocab().bos(); })
        .def_property_readonly("eos", [](const PyModel& s) { return s.get().vocab().eos(); })
        .def("memory_report", [](const PyModel& s) { return model_memory(s.get()); })
        .def("layer_table", [](const PyModel& s) { return s.get().layer_table(); })
        .def("close", [](PyModel& s) { s.model.reset(); })
        .def_property_readonly("closed", [](const PyModel& s) { return !s.model; })
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](PyModel& s, py::args) { s.model.reset(); });

    py::class_<PyContext>(m, "Context", "Mutable inference state (KV cache, buffers) over a Model.")
        .def(py::init([](const PyModel& model, int n_ctx, int n_batch, int n_seq_max, int n_threads,
                         const std::string& type_k, const std::string& type_v, const std::string& act_mode,
                         bool flash_attn, bool cuda_graph) {
                 bonsai::ContextParams p;
                 p.n_ctx = n_ctx;
                 p.n_batch = n_batch;
                 p.n_seq_max = n_seq_max;
                 p.n_threads = n_threads;
                 p.type_k = parse_cache_type(type_k, "K");
                 p.type_v = parse_cache_type(type_v, "V");
                 p.act_mode = parse_act_mode(act_mode);
                 p.flash_attn = flash_attn;
                 p.cuda_graph = cuda_graph;
                 model.get();
                 auto h = std::make_unique<PyContext>();
                 auto mp = model.model;
                 py::gil_scoped_release release;
                 h->ctx = std::make_unique<bonsai::Context>(mp, p);
                 return h;
             }),
             py::arg("model"), py::arg("n_ctx") = 4096, py::arg("n_batch") = 512, py::arg("n_seq_max") = 1,
             py::arg("n_threads") = 0, py::arg("type_k") = "f16", py::arg("type_v") = "f16",
             py::arg("act_mode") = "int8", py::arg("flash_attn") = false, py::arg("cuda_graph") = true)
        .def("decode", &decode, py::arg("tokens"), py::arg("pos") = py::none(), py::arg("seq_ids") = py::none(),
             py::arg("logits") = "last",
             "Runs tokens through the model; returns float32 logits [n_out, n_vocab] of the flagged tokens.")
        .def("embed", &embed, py::arg("tokens"), py::arg("seq") = 0, py::arg("pooling") = py::none(),
             "Embeddings of one input run on the empty sequence seq (emptied again afterwards): float32 hidden "
             "states after output_norm, [n_tokens, n_embd] for pooling 'none', else [1, n_embd]; pooling None = "
             "the model's pooling_type. The LM head is not run.")
        .def("seq_rm", [](PyContext& s, int seq, int p0, int p1) { s.get().seq_rm(seq, p0, p1); },
             py::arg("seq"), py::arg("p0") = -1, py::arg("p1") = -1)
        .def("seq_cp", [](PyContext& s, int src, int dst, int p0, int p1) { s.get().seq_cp(src, dst, p0, p1); },
             py::arg("src"), py::arg("dst"), py::arg("p0") = -1, py::arg("p1") = -1)
        .def("seq_keep", [](PyContext& s, int seq) { s.get().seq_keep(seq); }, py::arg("seq"))
        .def("seq_pos_max", [](const PyContext& s, int seq) { return s.get().seq_pos_max(seq); }, py::arg("seq"))
        .def("seq_reusable", [](const PyContext& s, int seq, int n) { return s.get().seq_reusable(seq, n); },
             py::arg("seq"), py::arg("n"),
             "The longest prefix (<= n tokens) of the sequence that seq_rm / seq_cp can keep exactly: n, except for "
             "recurrent (qwen35) models, whose state rewinds only to its checkpoint.")
        .def_property_readonly("recurrent", [](const PyContext& s) { return s.get().recurrent(); })
        .def("save_seq_state", [](PyContext& s, int seq) {
                 std::lock_guard<std::mutex> lock(s.busy);
                 const std::vector<uint8_t> b = s.get().save_seq_state(seq);
                 return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
             }, py::arg("seq"),
             "A copy of the sequence's KV rows (and recurrent state) as bytes, for load_seq_state.")
        .def("load_seq_state", [](PyContext& s, int seq, const py::bytes& state) {
                 const std::string_view b = state;
                 std::lock_guard<std::mutex> lock(s.busy);
                 s.get().load_seq_state(seq, reinterpret_cast<const uint8_t*>(b.data()), b.size());
             }, py::arg("seq"), py::arg("state"),
             "Replaces the sequence with a state from save_seq_state of a context of the same model and cache types.")
        .def("clear", [](PyContext& s) { s.get().clear(); })
        .def_property_readonly("n_ctx", [](const PyContext& s) { return s.get().n_ctx(); })
        .def_property_readonly("n_batch", [](const PyContext& s) { return s.get().params().n_batch; })
        .def_property_readonly("n_threads", [](const PyContext& s) { return s.get().n_threads(); })
        .def("memory_report", [](const PyContext& s) {
            const bonsai::ContextMemory r = s.get().memory_report();
            py::dict d;
            d["kv_bytes"] = r.kv_bytes;
            d["compute_bytes"] = r.compute_bytes;
            d["logits_bytes"] = r.logits_bytes;
            d["recurrent_bytes"] = r.recurrent_bytes;
            d["gpu_kv_bytes"] = r.gpu_kv_bytes;
            d["gpu_recurrent_bytes"] = r.gpu_recurrent_bytes;
            d["gpu_compute_bytes"] = r.gpu_compute_bytes;
            d["gpu_logits_bytes"] = r.gpu_logits_bytes;
            d["gpu_allocated_bytes"] = r.gpu_allocated_bytes;
            return d;
        })
        .def("close", [](PyContext& s) {
            std::lock_guard<std::mutex> lock(s.busy);
            s.ctx.reset();
        })
        .def_property_readonly("closed", [](const PyContext& s) { return !s.ctx; })
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](PyContext& s, py::args) {
            std::lock_guard<std::mutex> lock(s.busy);
            s.ctx.reset();
        });

    py::class_<PySampler>(m, "Sampler",
                          "Logit bias, repeat / frequency / presence penalties, then greedy or top-k / top-p / "
                          "min-p / temperature sampling with a seed.")
        .def(py::init([](float temp, int top_k, float top_p, float min_p, float repeat_penalty, int repeat_last_n,
                         py::object seed, float frequency_penalty, float presence_penalty, py::object logit_bias) {
                 bonsai::SamplingParams p;
                 p.temp = temp;
                 p.top_k = top_k;
                 p.top_p = top_p;
                 p.min_p = min_p;
                 p.repeat_penalty = repeat_penalty;
                 p.repeat_last_n = repeat_last_n;
                 p.frequency_penalty = frequency_penalty;
                 p.presence_penalty = presence_penalty;
                 if (!seed.is_none()) {
                     const long long s = seed.cast<long long>();
                     if (s < 0) throw Error("seed must be >= 0 (or None for a random seed)");
                     p.seed = static_cast<uint64_t>(s);
                 }
                 if (!logit_bias.is_none()) {
                     for (const auto& [k, v] : logit_bias.cast<py::dict>()) {
                         p.logit_bias.emplace_back(k.cast<int32_t>(), v.cast<float>());
                     }
                 }
                 auto h = std::make_unique<PySampler>();
                 h->sampler = std::make_unique<bonsai::Sampler>(p);
                 return h;
             }),
             py::arg("temp") = 0.8f, py::arg("top_k") = 40, py::arg("top_p") = 0.95f, py::arg("min_p") = 0.05f,
             py::arg("repeat_penalty") = 1.0f, py::arg("repeat_last_n") = 64, py::arg("seed") = py::none(),
             py::arg("frequency_penalty") = 0.0f, py::arg("presence_penalty") = 0.0f,
             py::arg("logit_bias") = py::none())
        .def("sample", [](PySampler& s, py::array_t<float, py::array::c_style | py::array::forcecast> logits) {
                 if (logits.ndim() != 1 || logits.size() == 0) throw Error("sample: logits must be a non-empty 1-D array");
                 return s.sampler->sample(logits.data(), logits.size());
             }, py::arg("logits"))
        .def("adjust", [](const PySampler& s, py::array_t<float, py::array::c_style | py::array::forcecast> logits) {
                 if (logits.ndim() != 1 || logits.size() == 0) throw Error("adjust: logits must be a non-empty 1-D array");
                 py::array_t<float> out(logits.size());
                 std::copy_n(logits.data(), logits.size(), out.mutable_data());
                 s.sampler->adjust(out.mutable_data(), out.size());
                 return out;
             }, py::arg("logits"),
             "The logits after logit_bias and the penalties over the accepted history (what top-k and greedy see).")
        .def("accept", [](PySampler& s, int32_t tok) { s.sampler->accept(tok); }, py::arg("token"))
        .def("reset", [](PySampler& s) { s.sampler->reset(); })
        .def_property_readonly("seed", [](const PySampler& s) { return s.sampler->seed(); });
}

}  // namespace bonsai_py
