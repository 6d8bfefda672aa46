// Matrix ops for Python: matmul and get_rows on numpy arrays, the CPU kernel paths. Releases the GIL
// around the kernels; thread pools are cached per thread count.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bind.h"
#include "bind_arrays.h"
#include "bonsai/error.h"
#include "bonsai/gated_delta.h"
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
    // qwen35 Gated DeltaNet ops (bonsai/gated_delta.h), for the float64 reference tests. States are
    // [n_slots, ...] arrays; slots[t] names token t's slot (default: every token slot 0). The
    // updated states are returned with the outputs.
    auto slot_ptrs = [](std::optional<I32Array> slots, int64_t n_tokens, float* base, int64_t n_slots,
                        int64_t slot_floats) {
        std::vector<float*> ptrs(n_tokens);
        for (int64_t t = 0; t < n_tokens; ++t) {
            const int32_t s = slots ? slots->data()[t] : 0;
            if (s < 0 || s >= n_slots) throw bonsai::Error("slots[" + std::to_string(t) + "] is outside the states");
            ptrs[t] = base + s * slot_floats;
        }
        if (slots && slots->size() != n_tokens) throw bonsai::Error("slots must have one entry per token");
        return ptrs;
    };
    m.def(
        "gdn_conv1d_silu",
        [slot_ptrs](const F32Array& x, const F32Array& w_t, const F32Array& state, std::optional<I32Array> slots,
                    int threads) {
            if (x.ndim() != 2 || w_t.ndim() != 2 || w_t.shape(1) != x.shape(1) || state.ndim() != 3 ||
                state.shape(1) != w_t.shape(0) - 1 || state.shape(2) != x.shape(1))
                throw bonsai::Error("x [T, C], w_t [K, C] and state [slots, K-1, C] must agree");
            const int64_t n = x.shape(0), c = x.shape(1), k = w_t.shape(0);
            py::array_t<float> y({x.shape(0), x.shape(1)});
            py::array_t<float> st({state.shape(0), state.shape(1), state.shape(2)});
            std::copy(x.data(), x.data() + n * c, y.mutable_data());
            std::copy(state.data(), state.data() + state.size(), st.mutable_data());
            std::vector<float*> ptrs = slot_ptrs(slots, n, st.mutable_data(), state.shape(0), (k - 1) * c);
            float* yp = y.mutable_data();
            bonsai::ThreadPool& pool = pool_for(threads);
            {
                py::gil_scoped_release release;
                bonsai::gdn_conv1d_silu(yp, n, c, w_t.data(), k, ptrs.data(), pool);
            }
            return py::make_tuple(y, st);
        },
        py::arg("x"), py::arg("w_t"), py::arg("state"), py::arg("slots") = py::none(), py::arg("threads") = 1,
        "Causal depthwise conv1d + SiLU with carried states: (out [T, C], states).");
    m.def(
        "l2_norm_rows",
        [](const F32Array& x, float eps) {
            if (x.ndim() != 2) throw bonsai::Error("x must be a 2-D float32 array");
            py::array_t<float> y({x.shape(0), x.shape(1)});
            std::copy(x.data(), x.data() + x.size(), y.mutable_data());
            bonsai::l2_norm_rows(y.mutable_data(), x.shape(0), x.shape(1), eps);
            return y;
        },
        py::arg("x"), py::arg("eps") = 1e-6f, "Rows divided by sqrt(sum of squares + eps).");
    m.def(
        "gdn_gates",
        [](const F32Array& alpha, const F32Array& beta, const F32Array& dt_bias, const F32Array& ssm_a) {
            if (alpha.ndim() != 2 || beta.ndim() != 2 || alpha.shape(0) != beta.shape(0) ||
                alpha.shape(1) != beta.shape(1) || dt_bias.size() != alpha.shape(1) || ssm_a.size() != alpha.shape(1))
                throw bonsai::Error("alpha, beta [T, H], dt_bias and ssm_a [H] must agree");
            py::array_t<float> g({alpha.shape(0), alpha.shape(1)}), b({beta.shape(0), beta.shape(1)});
            std::copy(alpha.data(), alpha.data() + alpha.size(), g.mutable_data());
            std::copy(beta.data(), beta.data() + beta.size(), b.mutable_data());
            bonsai::gdn_gates(g.mutable_data(), b.mutable_data(), dt_bias.data(), ssm_a.data(), alpha.shape(0),
                              alpha.shape(1));
            return py::make_tuple(g, b);
        },
        py::arg("alpha"), py::arg("beta"), py::arg("dt_bias"), py::arg("ssm_a"),
        "(g, beta) = (ssm_a * softplus(alpha + dt_bias), sigmoid(beta)).");
    m.def(
        "gated_delta_rule",
        [slot_ptrs](const F32Array& qkv, const F32Array& g, const F32Array& beta, const F32Array& state,
                    int64_t n_k_heads, int64_t n_v_heads, int64_t dk, int64_t dv, std::optional<I32Array> slots,
                    int threads, int64_t chunk) {
            if (qkv.ndim() != 2 || g.ndim() != 2 || beta.ndim() != 2 || state.ndim() != 4 ||
                g.shape(0) != qkv.shape(0) || g.shape(1) != n_v_heads || beta.shape(0) != qkv.shape(0) ||
                beta.shape(1) != n_v_heads || state.shape(1) != n_v_heads || state.shape(2) != dv ||
                state.shape(3) != dk)
                throw bonsai::Error("qkv [T, stride], g, beta [T, HV] and state [slots, HV, dv, dk] must agree");
            const int64_t n = qkv.shape(0);
            py::array_t<float> st({state.shape(0), state.shape(1), state.shape(2), state.shape(3)});
            std::copy(state.data(), state.data() + state.size(), st.mutable_data());
            std::vector<float*> ptrs = slot_ptrs(slots, n, st.mutable_data(), state.shape(0), n_v_heads * dv * dk);
            py::array_t<float> out({n, n_v_heads * dv});
            bonsai::DeltaRuleArgs a;
            a.qkv = qkv.data();
            a.qkv_stride = qkv.shape(1);
            a.g = g.data();
            a.beta = beta.data();
            a.n_tokens = n;
            a.n_k_heads = n_k_heads;
            a.n_v_heads = n_v_heads;
            a.dk = dk;
            a.dv = dv;
            a.scale = 1.0f / std::sqrt(static_cast<float>(dk));
            a.state = ptrs.data();
            a.out = out.mutable_data();
            a.chunk = chunk;
            bonsai::ThreadPool& pool = pool_for(threads);
            {
                py::gil_scoped_release release;
                bonsai::gated_delta_rule(a, pool);
            }
            return py::make_tuple(out, st);
        },
        py::arg("qkv"), py::arg("g"), py::arg("beta"), py::arg("state"), py::arg("n_k_heads"), py::arg("n_v_heads"),
        py::arg("dk"), py::arg("dv"), py::arg("slots") = py::none(), py::arg("threads") = 1,
        py::arg("chunk") = 0,
        "The gated delta rule over T tokens (q, k L2-normed in qkv; runs of >= chunk tokens of one state in the "
        "chunked form, 0 = step only): (out [T, HV*dv], states).");
    m.def(
        "rms_norm_gated",
        [](const F32Array& o, const F32Array& w, const F32Array& z, float eps) {
            if (o.ndim() != 2 || z.ndim() != 2 || z.shape(0) != o.shape(0) || z.shape(1) != o.shape(1) ||
                w.size() != o.shape(1))
                throw bonsai::Error("o, z [rows, n] and w [n] must agree");
            py::array_t<float> y({o.shape(0), o.shape(1)});
            std::copy(o.data(), o.data() + o.size(), y.mutable_data());
            bonsai::rms_norm_gated(y.mutable_data(), w.data(), z.data(), o.shape(0), o.shape(1), eps);
            return y;
        },
        py::arg("o"), py::arg("w"), py::arg("z"), py::arg("eps"), "rms_norm(o) * w * silu(z) per row.");
    m.def(
        "sigmoid_mul",
        [](const F32Array& x, const F32Array& gate) {
            if (x.size() != gate.size()) throw bonsai::Error("x and gate must have the same size");
            py::array_t<float> y(x.size());
            std::copy(x.data(), x.data() + x.size(), y.mutable_data());
            bonsai::sigmoid_mul(y.mutable_data(), gate.data(), x.size());
            return y;
        },
        py::arg("x"), py::arg("gate"), "x * sigmoid(gate), flattened.");
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
