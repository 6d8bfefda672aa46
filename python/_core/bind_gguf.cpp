// _core.GgufFile: the C++ GGUF reader for Python (metadata as Python values, tensor bytes as
// zero-copy read-only numpy views).
//
// A view shares ownership of the file mapping, so it stays valid after close() or after the
// GgufFile object is gone; close() only drops this object's own reference.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bind.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"

namespace py = pybind11;

namespace bonsai_py {

namespace {

// Strings in GGUF files are meant to be UTF-8; stray bytes (some vocabularies have them) survive
// as surrogate escapes, which the Python writer encodes back unchanged.
py::str to_py_str(const std::string& s) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(o);
}

py::object element(const bonsai::GgufValue& v, size_t k) {
    using T = bonsai::GgufValueType;
    switch (v.elem_type) {
        case T::STRING: return to_py_str(v.s[k]);
        case T::BOOL: return py::bool_(v.u[k] != 0);
        case T::FLOAT32:
        case T::FLOAT64: return py::float_(v.f[k]);
        case T::INT8:
        case T::INT16:
        case T::INT32:
        case T::INT64: return py::int_(v.i[k]);
        default: return py::int_(v.u[k]);
    }
}

py::object to_python(const bonsai::GgufValue& v) {
    if (!v.is_array()) return element(v, 0);
    const size_t n = v.size();
    py::list out(n);
    for (size_t k = 0; k < n; ++k) out[k] = element(v, k);
    return std::move(out);
}

// Python-side record of one tensor's directory entry (no data).
struct TensorInfo {
    std::string name;
    std::string type_name;
    py::object engine_type;  // int, or None when the engine cannot run the type
    uint32_t file_id;
    bool supported;
    py::tuple shape;         // numpy order (reversed ne)
    py::tuple ne;            // ggml order
    int64_t n_elements;
    uint64_t nbytes;
    uint64_t offset;         // from the start of the data section
};

TensorInfo make_info(const bonsai::GgufTensor& t) {
    TensorInfo i;
    i.name = t.name;
    i.file_id = t.file_id;
    i.supported = t.supported;
    i.type_name = t.supported ? bonsai::type_traits(t.type)->name : bonsai::ggml_type_name(t.file_id);
    i.engine_type = t.supported ? py::object(py::int_(static_cast<uint32_t>(t.type))) : py::none();
    const size_t nd = t.ne.size();
    i.shape = py::tuple(nd);
    i.ne = py::tuple(nd);
    for (size_t k = 0; k < nd; ++k) {
        i.ne[k] = py::int_(t.ne[k]);
        i.shape[k] = py::int_(t.ne[nd - 1 - k]);
    }
    i.n_elements = t.n_elements();
    i.nbytes = t.nbytes;
    i.offset = t.offset;
    return i;
}

class PyGgufFile {
public:
    PyGgufFile(const std::string& path, bool use_mmap) : path_(path) {
        py::gil_scoped_release release;
        file_ = bonsai::GgufFile::open(path, use_mmap);
    }

    const bonsai::GgufFile& file() const {
        if (!file_) throw bonsai::Error(path_ + ": the GGUF file is closed");
        return *file_;
    }

    py::dict metadata() {
        if (metadata_.is_none()) {
            py::dict d;
            for (const auto& kv : file().metadata()) d[to_py_str(kv.key)] = to_python(kv.value);
            metadata_ = d;
        }
        return metadata_;
    }

    py::dict metadata_types() const {
        py::dict d;
        for (const auto& kv : file().metadata()) d[to_py_str(kv.key)] = kv.value.type_name();
        return d;
    }

    py::list tensors() {
        if (tensors_.is_none()) {
            py::list l;
            for (const auto& t : file().tensors()) l.append(py::cast(make_info(t)));
            tensors_ = l;
        }
        return tensors_;
    }

    TensorInfo tensor(const std::string& name) const { return make_info(file().get_tensor(name)); }

    py::array tensor_data(const std::string& name) const {
        const bonsai::GgufTensor& t = file().get_tensor(name);
        auto* keep = new std::shared_ptr<const bonsai::MappedFile>(file().mapping());
        py::capsule owner(keep, [](void* p) {
            delete static_cast<std::shared_ptr<const bonsai::MappedFile>*>(p);
        });
        py::array a(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(t.nbytes)}, {1},
                    t.data, owner);
        a.attr("setflags")(py::arg("write") = false);
        return a;
    }

    void close() {
        file_.reset();
        metadata_ = py::none();
        tensors_ = py::none();
    }

    bool closed() const { return !file_; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    std::unique_ptr<bonsai::GgufFile> file_;
    py::object metadata_ = py::none();
    py::object tensors_ = py::none();
};

}  // namespace

void bind_gguf(py::module_& m) {
    py::class_<TensorInfo>(m, "GgufTensorInfo", "Directory entry of one tensor in a GGUF file.")
        .def_readonly("name", &TensorInfo::name)
        .def_readonly("type_name", &TensorInfo::type_name, "e.g. 'PTQ1_0', 'Q2_0_G128', 'Q4_K'")
        .def_readonly("engine_type", &TensorInfo::engine_type,
                      "engine type id (int), or None if the engine cannot run this type")
        .def_readonly("file_id", &TensorInfo::file_id, "ggml type id stored in the file")
        .def_readonly("supported", &TensorInfo::supported)
        .def_readonly("shape", &TensorInfo::shape, "numpy order: (rows, cols) for a matrix")
        .def_readonly("ne", &TensorInfo::ne, "ggml order: ne[0] is the row length")
        .def_readonly("n_elements", &TensorInfo::n_elements)
        .def_readonly("nbytes", &TensorInfo::nbytes)
        .def_readonly("offset", &TensorInfo::offset, "offset from the start of the data section")
        .def("__repr__", [](const TensorInfo& t) {
            return "GgufTensorInfo(" + t.name + ", " + t.type_name + ", shape=" +
                   py::repr(t.shape).cast<std::string>() + ", nbytes=" + std::to_string(t.nbytes) +
                   ")";
        });

    py::class_<PyGgufFile>(m, "GgufFile",
                           "A GGUF v3 file opened by the C++ reader (validated on open).")
        .def(py::init([](const py::object& path, bool use_mmap) {
                 const std::string p = py::module_::import("os").attr("fspath")(path).cast<std::string>();
                 return std::make_unique<PyGgufFile>(p, use_mmap);
             }),
             py::arg("path"), py::arg("use_mmap") = true)
        .def_property_readonly("path", &PyGgufFile::path)
        .def_property_readonly("version", [](const PyGgufFile& f) { return f.file().version(); })
        .def_property_readonly("alignment", [](const PyGgufFile& f) { return f.file().alignment(); })
        .def_property_readonly("file_size", [](const PyGgufFile& f) { return f.file().file_size(); })
        .def_property_readonly("data_offset",
                               [](const PyGgufFile& f) { return f.file().data_offset(); })
        .def_property_readonly("metadata", &PyGgufFile::metadata,
                               "dict key -> value (arrays as lists), in file order")
        .def_property_readonly("metadata_types", &PyGgufFile::metadata_types,
                               "dict key -> GGUF type name ('UINT32', 'ARRAY[STRING]', ...)")
        .def_property_readonly("tensors", &PyGgufFile::tensors, "list of GgufTensorInfo, file order")
        .def("tensor", &PyGgufFile::tensor, py::arg("name"), "GgufTensorInfo of one tensor")
        .def("tensor_data", &PyGgufFile::tensor_data, py::arg("name"),
             "read-only zero-copy uint8 view of a tensor's bytes (keeps the file mapped)")
        .def("check_engine_types",
             [](const PyGgufFile& f) { f.file().check_engine_types(); },
             "raise BonsaiError for the first tensor of a type the engine cannot run")
        .def("close", &PyGgufFile::close)
        .def_property_readonly("closed", &PyGgufFile::closed)
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](PyGgufFile& f, py::args) { f.close(); })
        .def("__repr__", [](const PyGgufFile& f) {
            if (f.closed()) return "GgufFile(" + f.path() + ", closed)";
            return "GgufFile(" + f.path() + ", " + std::to_string(f.file().tensors().size()) +
                   " tensors, " + std::to_string(f.file().metadata().size()) + " keys)";
        });
}

}  // namespace bonsai_py
