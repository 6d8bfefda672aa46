// Reference quantize / dequantize, fp16 / bf16 conversions and (in CUDA builds) the CUDA
// dequantizer, on numpy arrays. Rows are the last axis; the loops run without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bind.h"
#include "bonsai/error.h"
#include "bonsai/quants.h"
#include "bonsai/types.h"
#ifdef BONSAI_CUDA
#include "bonsai/cuda/dequantize.h"
#endif

namespace py = pybind11;

namespace bonsai_py {

namespace {

const bonsai::TypeTraits& traits_of(uint32_t type) {
    const bonsai::TypeTraits* t = bonsai::type_traits(static_cast<bonsai::GgmlType>(type));
    if (!t) throw bonsai::Error("unknown tensor type id " + std::to_string(type));
    return *t;
}

// The array as a C-contiguous array of T, or an error naming the dtype it should have had.
template <typename T>
py::array_t<T, py::array::c_style> as_array(const py::array& a, const char* what,
                                           const char* dtype) {
    if (!a.dtype().is(py::dtype::of<T>()))
        throw bonsai::Error(std::string(what) + " needs a " + dtype + " array, got " +
                            std::string(py::str(a.dtype())) + "; convert it with .astype(np." +
                            dtype + ")");
    return py::array_t<T, py::array::c_style>::ensure(a);
}

int64_t row_length(const bonsai::TypeTraits& t, const std::vector<py::ssize_t>& shape,
                   const char* what) {
    if (shape.empty())
        throw bonsai::Error(std::string(what) +
                            " needs at least one dimension (rows are the last)");
    for (py::ssize_t s : shape)
        if (s < 0) throw bonsai::Error(std::string(what) + ": negative dimension in shape");
    const int64_t n = shape.back();
    if (n % t.block_size != 0)
        throw bonsai::Error(std::string(what) + ": rows of " + std::to_string(n) +
                            " elements are not a multiple of the " + t.name + " block size " +
                            std::to_string(t.block_size));
    return n;
}

py::array quantize(uint32_t type, const py::array& x_in) {
    const bonsai::TypeTraits& t = traits_of(type);
    auto x = as_array<float>(x_in, "quantize", "float32");
    std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
    const int64_t n = row_length(t, shape, "quantize");
    shape.back() = static_cast<py::ssize_t>(bonsai::type_row_bytes(t.type, n));
    py::array_t<uint8_t> out(shape);
    const int64_t total = static_cast<int64_t>(x.size());
    const float* src = x.data();
    uint8_t* dst = out.mutable_data();
    {
        py::gil_scoped_release release;
        bonsai::quantize_row(t.type, src, dst, total);
    }
    return out;
}

// Checks that `data` holds exactly the bytes of a tensor of `shape` and returns the element count.
int64_t checked_elements(const bonsai::TypeTraits& t, const py::array_t<uint8_t>& data,
                         const std::vector<py::ssize_t>& shape, const char* what) {
    const int64_t n = row_length(t, shape, what);
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    const uint64_t want = static_cast<uint64_t>(rows) * bonsai::type_row_bytes(t.type, n);
    if (static_cast<uint64_t>(data.size()) != want)
        throw bonsai::Error(std::string(what) + ": " + std::to_string(data.size()) +
                            " bytes given, but a " + t.name + " tensor of that shape takes " +
                            std::to_string(want));
    return rows * n;
}

py::array dequantize(uint32_t type, const py::array& data_in,
                     const std::vector<py::ssize_t>& shape) {
    const bonsai::TypeTraits& t = traits_of(type);
    auto data = as_array<uint8_t>(data_in, "dequantize", "uint8");
    const int64_t total = checked_elements(t, data, shape, "dequantize");
    py::array_t<float> out(shape);
    const uint8_t* src = data.data();
    float* dst = out.mutable_data();
    {
        py::gil_scoped_release release;
        bonsai::dequantize_row(t.type, src, dst, total);
    }
    return out;
}

// Elementwise conversion of a whole array, keeping its shape.
template <typename In, typename Out, Out (*F)(In)>
py::array convert(const py::array& a_in, const char* what, const char* dtype) {
    auto a = as_array<In>(a_in, what, dtype);
    std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
    py::array_t<Out> out(shape);
    const In* src = a.data();
    Out* dst = out.mutable_data();
    const py::ssize_t n = a.size();
    {
        py::gil_scoped_release release;
        for (py::ssize_t i = 0; i < n; ++i) dst[i] = F(src[i]);
    }
    return out;
}

uint16_t to_fp16(float f) { return bonsai::fp32_to_fp16(f); }
float from_fp16(uint16_t h) { return bonsai::fp16_to_fp32(h); }
uint16_t to_bf16(float f) { return bonsai::fp32_to_bf16(f); }
float from_bf16(uint16_t h) { return bonsai::bf16_to_fp32(h); }

py::array fp32_to_fp16_array(const py::array& x) {
    return convert<float, uint16_t, to_fp16>(x, "fp32_to_fp16", "float32");
}
py::array fp16_to_fp32_array(const py::array& h) {
    return convert<uint16_t, float, from_fp16>(h, "fp16_to_fp32", "uint16");
}
py::array fp32_to_bf16_array(const py::array& x) {
    return convert<float, uint16_t, to_bf16>(x, "fp32_to_bf16", "float32");
}
py::array bf16_to_fp32_array(const py::array& h) {
    return convert<uint16_t, float, from_bf16>(h, "bf16_to_fp32", "uint16");
}

}  // namespace

void bind_quants(py::module_& m) {
    m.def("quantize", &quantize, py::arg("type"), py::arg("x"),
          "Quantizes a float32 array (rows = last axis, a multiple of the block size) to type; "
          "returns uint8 of shape (..., row_bytes). Errors name flat (C-order) element indices.");
    m.def("dequantize", &dequantize, py::arg("type"), py::arg("data"), py::arg("shape"),
          "Dequantizes the uint8 bytes of a tensor of `shape` (elements) to float32.");
    m.def("fp32_to_fp16", &fp32_to_fp16_array, py::arg("x"),
          "fp16 bits (uint16) of a float32 array, round to nearest even.");
    m.def("fp16_to_fp32", &fp16_to_fp32_array, py::arg("bits"),
          "float32 values of an array of fp16 bits (uint16).");
    m.def("fp32_to_bf16", &fp32_to_bf16_array, py::arg("x"),
          "bf16 bits (uint16) of a float32 array, round to nearest even.");
    m.def("bf16_to_fp32", &bf16_to_fp32_array, py::arg("bits"),
          "float32 values of an array of bf16 bits (uint16).");
#ifdef BONSAI_CUDA
    m.def("cuda_device_count", &bonsai::cuda_device_count,
          "Number of CUDA devices visible to the engine (0 without a driver).");
    m.def("cuda_dequantize",
          [](uint32_t type, const py::array& data_in, const std::vector<py::ssize_t>& shape) {
              const bonsai::TypeTraits& t = traits_of(type);
              auto data = as_array<uint8_t>(data_in, "cuda_dequantize", "uint8");
              const int64_t total = checked_elements(t, data, shape, "cuda_dequantize");
              py::array_t<float> out(shape);
              const uint8_t* src = data.data();
              float* dst = out.mutable_data();
              {
                  py::gil_scoped_release release;
                  bonsai::cuda_dequantize(t.type, src, dst, total);
              }
              return out;
          },
          py::arg("type"), py::arg("data"), py::arg("shape"),
          "Dequantizes on the GPU (the CUDA kernel of cpp/backends/cuda/dequantize.cu).");
#else
    m.def("cuda_device_count", []() { return 0; },
          "Number of CUDA devices visible to the engine (always 0: built without CUDA).");
#endif
}

}  // namespace bonsai_py
