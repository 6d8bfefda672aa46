// numpy array types and argument conversions shared by the binding files that take raw weights and
// activations (bind_ops.cpp, bind_cuda.cpp).
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <string>

#include "bonsai/error.h"
#include "bonsai/ops.h"

namespace bonsai_py {

using U8Array = pybind11::array_t<uint8_t, pybind11::array::c_style | pybind11::array::forcecast>;
using F32Array = pybind11::array_t<float, pybind11::array::c_style | pybind11::array::forcecast>;
using I32Array = pybind11::array_t<int32_t, pybind11::array::c_style | pybind11::array::forcecast>;
using U64Array = pybind11::array_t<uint64_t, pybind11::array::c_style | pybind11::array::forcecast>;

// A 2-D uint8 array (rows, row_bytes) of packed weights of `type` as a WeightView of `cols` columns.
inline bonsai::WeightView weight_view(uint32_t type, const U8Array& w, int64_t cols) {
    if (w.ndim() != 2) throw bonsai::Error("w must be a 2-D uint8 array (rows, row_bytes)");
    return bonsai::WeightView{static_cast<bonsai::GgmlType>(type), w.data(), static_cast<int64_t>(w.shape(0)), cols,
                              static_cast<size_t>(w.shape(1))};
}

inline bonsai::ActMode parse_mode(const std::string& mode) {
    if (mode == "int8") return bonsai::ActMode::INT8;
    if (mode == "float") return bonsai::ActMode::FLOAT;
    throw bonsai::Error("mode must be 'int8' or 'float' (got '" + mode + "')");
}

}  // namespace bonsai_py
