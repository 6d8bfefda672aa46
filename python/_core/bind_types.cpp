// Type table and build information; registers bonsai::Error as bonsai_runner._core.BonsaiError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bind.h"
#include "bonsai/error.h"
#include "bonsai/types.h"

namespace py = pybind11;

namespace bonsai_py {

void bind_types(py::module_& m) {
    static py::exception<bonsai::Error> exc(m, "BonsaiError", PyExc_ValueError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const bonsai::Error& e) {
            py::set_error(exc, e.what());
        }
    });

    m.def("type_info", [](uint32_t type) -> py::object {
        const bonsai::TypeTraits* t = bonsai::type_traits(static_cast<bonsai::GgmlType>(type));
        if (!t) return py::none();
        py::dict d;
        d["name"] = t->name;
        d["file_id"] = t->file_id;
        d["block_size"] = t->block_size;
        d["type_size"] = t->type_size;
        d["ternary"] = t->ternary;
        return d;
    }, py::arg("type"), "Block geometry of an engine type id (None if unknown).");
    m.def("ggml_type_name", &bonsai::ggml_type_name, py::arg("file_id"),
          "Name of a ggml type id, including ids the engine does not run.");

    py::dict build;
#ifdef BONSAI_CUDA
    build["cuda"] = true;
#else
    build["cuda"] = false;
#endif
#if defined(__AVX512F__)
    build["compiled_avx512"] = true;
#else
    build["compiled_avx512"] = false;
#endif
#if defined(__AVX2__)
    build["compiled_avx2"] = true;
#else
    build["compiled_avx2"] = false;
#endif
    m.attr("build_info") = build;
}

}  // namespace bonsai_py
