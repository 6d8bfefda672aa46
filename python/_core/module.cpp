// bonsai_runner._core: the pybind11 module. It only registers the areas below, one bind_*.cpp
// each; all logic lives in the engine library (cpp/) or in the Python package.
#include <pybind11/pybind11.h>

#include "bind.h"

PYBIND11_MODULE(_core, m) {
    m.doc() = "bonsai-runner native engine";
    bonsai_py::bind_types(m);
    bonsai_py::bind_quants(m);
    bonsai_py::bind_gguf(m);
    bonsai_py::bind_vocab(m);
    bonsai_py::bind_ops(m);
    bonsai_py::bind_model(m);
    bonsai_py::bind_bench(m);
    bonsai_py::bind_cuda(m);
}
