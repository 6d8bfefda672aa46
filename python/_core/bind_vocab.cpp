// Tokenizer binding: _core.Vocab built from a dict of GGUF tokenizer.* values (as gguf.GGUFReader
// field contents or _core.GgufFile.metadata give them), a GGUF file or a tokenizer.model file, and
// _core.TokenStreamDecoder. tokenize/detokenize release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bind.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/vocab.h"

namespace py = pybind11;

namespace bonsai_py {

namespace {

std::string type_name(const py::handle& h) { return py::str(py::type::of(h).attr("__name__")); }

// UTF-8 bytes of a str; lone surrogates (stray bytes that a GGUF reader decoded with
// "surrogateescape") become the original bytes again.
std::string utf8_of(const py::handle& h) {
    PyObject* b = PyUnicode_AsEncodedString(h.ptr(), "utf-8", "surrogateescape");
    if (!b) throw py::error_already_set();
    return py::reinterpret_steal<py::bytes>(b).cast<std::string>();
}

std::string to_string(const py::handle& h, const std::string& key) {
    if (py::isinstance<py::bytes>(h)) return h.cast<std::string>();
    if (py::isinstance<py::str>(h)) return utf8_of(h);
    throw bonsai::Error(key + " must hold strings, got " + type_name(h) + ".");
}

int64_t to_int(const py::handle& h, const std::string& key) {
    if (py::isinstance<py::float_>(h) || py::isinstance<py::str>(h) || py::isinstance<py::bytes>(h) ||
        !py::hasattr(h, "__index__")) {
        throw bonsai::Error(key + " must be an integer, got " + type_name(h) + ".");
    }
    return py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr())).cast<int64_t>();
}

// A Python mapping of metadata keys, read through bonsai::MetadataView (GIL held by the caller).
class DictMetadata : public bonsai::MetadataView {
public:
    explicit DictMetadata(py::dict d) : d_(std::move(d)) {}
    bool has(const std::string& key) const override {
        return d_.contains(key) && !d_[py::str(key)].is_none();
    }
    std::string get_string(const std::string& key) const override { return to_string(get(key), key); }
    int64_t get_int(const std::string& key) const override { return to_int(get(key), key); }
    bool get_bool(const std::string& key) const override {
        py::object v = get(key);
        if (py::isinstance<py::str>(v) || py::isinstance<py::bytes>(v) || !py::hasattr(v, "__bool__")) {
            throw bonsai::Error(key + " must be a boolean, got " + type_name(v) + ".");
        }
        return v.cast<bool>();
    }
    std::vector<std::string> get_strings(const std::string& key) const override {
        std::vector<std::string> out;
        for (py::handle h : sequence(key)) out.push_back(to_string(h, key));
        return out;
    }
    std::vector<float> get_floats(const std::string& key) const override {
        std::vector<float> out;
        for (py::handle h : sequence(key)) {
            if (py::isinstance<py::str>(h) || py::isinstance<py::bytes>(h) || !py::hasattr(h, "__float__")) {
                throw bonsai::Error(key + " must hold numbers, got " + type_name(h) + ".");
            }
            out.push_back(h.cast<float>());
        }
        return out;
    }
    std::vector<int64_t> get_ints(const std::string& key) const override {
        std::vector<int64_t> out;
        for (py::handle h : sequence(key)) out.push_back(to_int(h, key));
        return out;
    }

private:
    py::object get(const std::string& key) const {
        if (!has(key)) throw bonsai::Error(key + " is missing from the metadata.");
        return d_[py::str(key)];
    }
    py::iterable sequence(const std::string& key) const {
        py::object v = get(key);
        if (py::isinstance<py::str>(v) || py::isinstance<py::bytes>(v) || !py::isinstance<py::iterable>(v)) {
            throw bonsai::Error(key + " must be an array, got " + type_name(v) + ".");
        }
        return v;
    }
    py::dict d_;
};

std::string fspath(const py::object& path) {
    return py::module_::import("os").attr("fspath")(path).cast<std::string>();
}

std::string text_bytes(const py::object& text) {
    if (py::isinstance<py::bytes>(text)) return text.cast<std::string>();
    if (py::isinstance<py::str>(text)) return utf8_of(text);
    throw bonsai::Error("text must be str or bytes, got " + type_name(text) + ".");
}

}  // namespace

void bind_vocab(py::module_& m) {
    py::class_<bonsai::Vocab>(m, "Vocab",
                              "A model's tokenizer (SentencePiece or byte-level BPE) built from GGUF "
                              "tokenizer.* metadata.")
        .def(py::init([](py::dict metadata) { return bonsai::Vocab::from_metadata(DictMetadata(metadata)); }),
             py::arg("metadata"), "Builds the tokenizer from a dict of tokenizer.* keys and their values.")
        .def_static("from_gguf",
                    [](const py::object& path) {
                        const std::string p = fspath(path);
                        py::gil_scoped_release nogil;
                        return bonsai::Vocab::from_gguf(*bonsai::GgufFile::open(p));
                    },
                    py::arg("path"), "Reads the tokenizer of a GGUF file.")
        .def_static("from_spm_model_file",
                    [](const py::object& path) {
                        const std::string p = fspath(path);
                        py::gil_scoped_release nogil;
                        return bonsai::Vocab::from_spm_model_file(p);
                    },
                    py::arg("path"), "Reads a SentencePiece tokenizer.model file.")
        .def("tokenize",
             [](const bonsai::Vocab& v, py::object text, bool add_special, bool parse_special) {
                 const std::string s = text_bytes(text);
                 std::vector<int32_t> ids;
                 {
                     py::gil_scoped_release nogil;
                     ids = v.tokenize(s, add_special, parse_special);
                 }
                 return ids;
             },
             py::arg("text"), py::arg("add_special") = true, py::arg("parse_special") = false)
        .def("detokenize",
             [](const bonsai::Vocab& v, const std::vector<int32_t>& ids, bool render_special) {
                 std::string s;
                 {
                     py::gil_scoped_release nogil;
                     s = v.detokenize(ids, render_special);
                 }
                 return py::bytes(s);
             },
             py::arg("ids"), py::arg("render_special") = false)
        .def("token_to_piece",
             [](const bonsai::Vocab& v, int32_t id, bool render_special) {
                 return py::bytes(v.token_to_piece(id, render_special));
             },
             py::arg("id"), py::arg("render_special") = false)
        .def("token_text", [](const bonsai::Vocab& v, int32_t id) { return py::bytes(v.token_text(id)); },
             py::arg("id"))
        .def("token_type", [](const bonsai::Vocab& v, int32_t id) { return static_cast<int>(v.token_type(id)); },
             py::arg("id"))
        .def("token_score", &bonsai::Vocab::token_score, py::arg("id"))
        .def("find_token", [](const bonsai::Vocab& v, py::object text) { return v.find_token(text_bytes(text)); },
             py::arg("text"))
        .def("is_eog", &bonsai::Vocab::is_eog, py::arg("id"), "Whether the token ends generation.")
        .def_property_readonly("eog_ids", &bonsai::Vocab::eog_ids)
        .def("check_compatible", &bonsai::Vocab::check_compatible, py::arg("n_vocab_model"))
        .def("check_replaces", &bonsai::Vocab::check_replaces, py::arg("embedded"), py::arg("n_vocab_model"))
        .def_property_readonly("n_vocab", &bonsai::Vocab::n_vocab)
        .def_property_readonly("bos", &bonsai::Vocab::bos)
        .def_property_readonly("eos", &bonsai::Vocab::eos)
        .def_property_readonly("unk", &bonsai::Vocab::unk)
        .def_property_readonly("pad", &bonsai::Vocab::pad)
        .def_property_readonly("add_bos", &bonsai::Vocab::add_bos)
        .def_property_readonly("add_eos", &bonsai::Vocab::add_eos)
        .def_property_readonly("add_space_prefix", &bonsai::Vocab::add_space_prefix)
        .def_property_readonly("model", &bonsai::Vocab::model_name)
        .def_property_readonly("pre", &bonsai::Vocab::pre_name)
        .def("__len__", &bonsai::Vocab::n_vocab);

    py::class_<bonsai::TokenStreamDecoder>(m, "TokenStreamDecoder",
                                           "Token-by-token detokenization that holds back incomplete UTF-8.")
        .def(py::init<const bonsai::Vocab&, bool>(), py::arg("vocab"), py::arg("render_special") = false)
        .def("push", [](bonsai::TokenStreamDecoder& d, int32_t id) { return py::bytes(d.push(id)); },
             py::arg("id"))
        .def("flush", [](bonsai::TokenStreamDecoder& d) { return py::bytes(d.flush()); });
}

}  // namespace bonsai_py
