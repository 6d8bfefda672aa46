// Matrix ops for Python: matmul and get_rows on numpy arrays, the CPU kernel paths. Releases the GIL
// around the kernels; thread pools are cached per thread count.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bind.h"
#include "bind_arrays.h"
#include "bonsai/error.h"
#include "bonsai/ops.h"

namespace py = pybind11;

namespace bonsai_py {

namespace {

bonsai::ThreadPool& pool_for(int threads) {
    if (threads < 1) throw bonsai::Error("threads must be >= 1 (got " + std::to_string(threads) + ")");
    static std::mutex m;
    static std::map<int, std::unique_ptr<bonsai::ThreadPool>> pools;
    std::lock_guard<std::mutex> lk(m);
    auto& p = pools[threads];
    if (!p) p = std::make_unique<bonsai::ThreadPool>(threads);
    return *p;
}


}  // namespace

void bind_ops(py::module_& m) {
    m.def(
        "matmul",
        [](uint32_t type, const U8Array& w, int64_t cols, const F32Array& x, const std::string& mode, int threads,
           std::optional<std::string> path) {
            const bonsai::WeightView wv = weight_view(type, w, cols);
            if (x.ndim() != 2 || x.shape(1) != cols)
                throw bonsai::Error("x must be a 2-D float32 array (n_tokens, cols=" + std::to_string(cols) + ")");
            const bonsai::ActMode am = parse_mode(mode);
            const bonsai::CpuPath cp = path ? bonsai::parse_cpu_path(*path) : bonsai::active_cpu_path();
            bonsai::ThreadPool& pool = pool_for(threads);
            const int64_t n_tokens = x.shape(0);
            py::array_t<float> y({static_cast<py::ssize_t>(n_tokens), static_cast<py::ssize_t>(wv.rows)});
            float* yp = y.mutable_data();
            const float* xp = x.data();
            {
                py::gil_scoped_release release;
                bonsai::matmul_on_path(wv, xp, n_tokens, yp, am, pool, cp);
            }
            return y;
        },
        py::arg("type"), py::arg("w"), py::arg("cols"), py::arg("x"), py::arg("mode") = "int8", py::arg("threads") = 1,
        py::arg("path") = py::none(),
        "y (n_tokens, rows) = x @ W.T for a weight of engine type `type` stored as uint8 rows.");
    m.def(
        "hadamard_rotate",
        [](const F32Array& x, int64_t block, std::optional<F32Array> signs, bool inverse, int threads,
           std::optional<std::string> path) {
            if (x.ndim() != 2) throw bonsai::Error("x must be a 2-D float32 array (n_tokens, cols)");
            const int64_t n_tokens = x.shape(0), cols = x.shape(1);
            if (signs && (signs->ndim() != 1 || signs->shape(0) != cols))
                throw bonsai::Error("signs must be a 1-D float32 array of cols=" + std::to_string(cols) + " values");
            const bonsai::CpuPath cp = path ? bonsai::parse_cpu_path(*path) : bonsai::active_cpu_path();
            bonsai::ThreadPool& pool = pool_for(threads);
            py::array_t<float> y({static_cast<py::ssize_t>(n_tokens), static_cast<py::ssize_t>(cols)});
            float* yp = y.mutable_data();
            std::copy(x.data(), x.data() + n_tokens * cols, yp);
            bonsai::Rotation r;
            r.block = block;
            r.signs = signs ? signs->data() : nullptr;
            {
                py::gil_scoped_release release;
                bonsai::hadamard_rotate_on_path(yp, n_tokens, cols, r, inverse, pool, cp);
            }
            return y;
        },
        py::arg("x"), py::arg("block"), py::arg("signs") = py::none(), py::arg("inverse") = false,
        py::arg("threads") = 1, py::arg("path") = py::none(),
        "Blockwise Walsh-Hadamard rotation of each row: WHT_B(s * x), or s * WHT_B(x) with inverse=True.");
    m.def(
        "matmul_rotated",
        [](uint32_t type, const U8Array& w, int64_t cols, const F32Array& x, int64_t block,
           std::optional<F32Array> signs, const std::string& mode, int threads, std::optional<std::string> path) {
            const bonsai::WeightView wv = weight_view(type, w, cols);
            if (x.ndim() != 2 || x.shape(1) != cols)
                throw bonsai::Error("x must be a 2-D float32 array (n_tokens, cols=" + std::to_string(cols) + ")");
            if (signs && (signs->ndim() != 1 || signs->shape(0) != cols))
                throw bonsai::Error("signs must be a 1-D float32 array of cols=" + std::to_string(cols) + " values");
            const bonsai::ActMode am = parse_mode(mode);
            const bonsai::CpuPath cp = path ? bonsai::parse_cpu_path(*path) : bonsai::active_cpu_path();
            bonsai::ThreadPool& pool = pool_for(threads);
            const int64_t n_tokens = x.shape(0);
            std::vector<float> xs(x.data(), x.data() + n_tokens * cols);  // the op may rotate it in place
            py::array_t<float> y({static_cast<py::ssize_t>(n_tokens), static_cast<py::ssize_t>(wv.rows)});
            float* yp = y.mutable_data();
            bonsai::Rotation r;
            r.block = block;
            r.signs = signs ? signs->data() : nullptr;
            const bonsai::WeightView* ws[1] = {&wv};
            float* ys[1] = {yp};
            {
                py::gil_scoped_release release;
                bonsai::matmul_rotated_on_path(ws, ys, 1, xs.data(), n_tokens, r, am, pool, cp);
            }
            return y;
        },
        py::arg("type"), py::arg("w"), py::arg("cols"), py::arg("x"), py::arg("block"), py::arg("signs") = py::none(),
        py::arg("mode") = "int8", py::arg("threads") = 1, py::arg("path") = py::none(),
        "y = WHT_B(s * x) @ W.T (the input of a Hadamard-folded weight, rotated then multiplied).");
    m.def(
        "get_rows",
        [](uint32_t type, const U8Array& w, int64_t cols, const I32Array& ids) {
            const bonsai::WeightView wv = weight_view(type, w, cols);
            if (ids.ndim() != 1) throw bonsai::Error("ids must be a 1-D int32 array");
            const int64_t n = ids.shape(0);
            py::array_t<float> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(cols)});
            float* op = out.mutable_data();
            const int32_t* ip = ids.data();
            {
                py::gil_scoped_release release;
                bonsai::get_rows(wv, ip, n, op);
            }
            return out;
        },
        py::arg("type"), py::arg("w"), py::arg("cols"), py::arg("ids"),
        "Dequantized rows W[ids] as float32 (n, cols).");
    m.def(
        "cpu_paths",
        [] {
            std::vector<std::string> out;
            for (bonsai::CpuPath p : bonsai::available_cpu_paths()) out.emplace_back(bonsai::cpu_path_name(p));
            return out;
        },
        "CPU kernel paths this machine supports (scalar, avx2, avx512).");
    m.def("cpu_path", [] { return std::string(bonsai::cpu_path_name(bonsai::active_cpu_path())); },
          "The CPU kernel path used by default.");
}

}  // namespace bonsai_py
