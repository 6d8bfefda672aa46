// Registration functions of the binding areas (one bind_<area>.cpp each).
#pragma once

#include <pybind11/pybind11.h>

namespace bonsai_py {

void bind_types(pybind11::module_& m);   // type table, build information, the Error exception
void bind_quants(pybind11::module_& m);  // reference quantize / dequantize
void bind_gguf(pybind11::module_& m);    // GGUF reader
void bind_vocab(pybind11::module_& m);   // tokenizers
void bind_ops(pybind11::module_& m);     // matmul / get_rows kernels, CPU paths
void bind_model(pybind11::module_& m);   // Model, Context, Sampler
void bind_bench(pybind11::module_& m);   // memory bandwidth probe
void bind_cuda(pybind11::module_& m);    // CUDA device info and host-array CUDA ops (CUDA builds)

}  // namespace bonsai_py
