// CUDA backend functions for Python (BONSAI_CUDA builds only; tests and benchmarks): the device's
// name and memory, and host-array versions of every CUDA op (bonsai/cuda/host_ops.h) so the parity
// tests can compare each op with the CPU reference. All release the GIL around the device work.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "bind.h"
#include "bind_arrays.h"
#include "bonsai/error.h"

#ifdef BONSAI_CUDA
#include "bonsai/cuda/gpu_backend.h"
#include "bonsai/cuda/host_ops.h"
#endif

namespace py = pybind11;

namespace bonsai_py {

#ifdef BONSAI_CUDA
namespace {


bonsai::GgmlType kv_type(const std::string& name) {
    if (name == "f16") return bonsai::TYPE_F16;
    if (name == "q8_0") return bonsai::TYPE_Q8_0;
    throw bonsai::Error("KV type must be 'f16' or 'q8_0' (got '" + name + "')");
}

void need_2d(const F32Array& a, const char* what, int64_t cols = -1) {
    if (a.ndim() != 2 || (cols >= 0 && a.shape(1) != cols))
        throw bonsai::Error(std::string(what) + " must be a 2-D float32 array" +
                            (cols >= 0 ? " with " + std::to_string(cols) + " columns" : std::string()));
}

py::array_t<float> new_2d(int64_t rows, int64_t cols) {
    return py::array_t<float>({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
}

// A new C-contiguous float32 array with a's shape and values (the in-place ops run on it).
py::array_t<float> copy_of(const F32Array& a) {
    py::array_t<float> c(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
    std::copy(a.data(), a.data() + a.size(), c.mutable_data());
    return c;
}

// Token t's state slot: slots[t], or 0 for every token when slots is None (as the CPU bindings).
std::vector<int32_t> slot_list(const std::optional<I32Array>& slots, int64_t n_tokens) {
    if (!slots) return std::vector<int32_t>(static_cast<size_t>(n_tokens), 0);
    if (slots->ndim() != 1 || slots->shape(0) != n_tokens)
        throw bonsai::Error("slots must be a 1-D int32 array with one slot per token");
    return std::vector<int32_t>(slots->data(), slots->data() + n_tokens);
}

}  // namespace
#endif

void bind_cuda(py::module_& m) {
#ifdef BONSAI_CUDA
    m.def("cuda_memory_info", []() {
        const bonsai::GpuDeviceInfo info = bonsai::cuda_device_info();
        py::dict d;
        d["name"] = info.name;
        d["free_bytes"] = info.free_bytes;
        d["total_bytes"] = info.total_bytes;
        return d;
    }, "Name, free and total memory of CUDA device 0 (cudaMemGetInfo).");
    m.def("cuda_matmul", [](uint32_t type, const U8Array& w, int64_t cols, const F32Array& x, const std::string& mode) {
        const bonsai::WeightView wv = weight_view(type, w, cols);
        need_2d(x, "x", cols);
        const bonsai::ActMode am = parse_mode(mode);
        auto y = new_2d(x.shape(0), wv.rows);
        float* yp = y.mutable_data();
        const float* xp = x.data();
        const int64_t n = x.shape(0);
        py::gil_scoped_release release;
        bonsai::cuda_matmul_host(wv, xp, n, yp, am);
        return y;
    }, py::arg("type"), py::arg("w"), py::arg("cols"), py::arg("x"), py::arg("mode") = "int8",
       "The CUDA matmul of _core.matmul's arguments: y (n_tokens, rows) = x @ W.T.");
    m.def("cuda_get_rows", [](uint32_t type, const U8Array& w, int64_t cols, const I32Array& ids) {
        const bonsai::WeightView wv = weight_view(type, w, cols);
        if (ids.ndim() != 1) throw bonsai::Error("ids must be a 1-D int32 array");
        auto out = new_2d(ids.shape(0), cols);
        float* op = out.mutable_data();
        const int32_t* ip = ids.data();
        const int64_t n = ids.shape(0);
        py::gil_scoped_release release;
        bonsai::cuda_get_rows_host(wv, ip, n, op);
        return out;
    }, py::arg("type"), py::arg("w"), py::arg("cols"), py::arg("ids"));
    m.def("cuda_rms_norm", [](const F32Array& x, const F32Array& w, float eps) {
        need_2d(x, "x");
        if (w.ndim() != 1 || w.shape(0) != x.shape(1)) throw bonsai::Error("w must be 1-D with x.shape[1] values");
        auto y = new_2d(x.shape(0), x.shape(1));
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        bonsai::cuda_rms_norm_host(x.data(), w.data(), x.shape(0), x.shape(1), eps, yp);
        return y;
    }, py::arg("x"), py::arg("w"), py::arg("eps"));
    m.def("cuda_rope", [](const F32Array& x, const I32Array& pos, int64_t n_head, int64_t n_rot, bool neox, float theta,
                          float freq_scale, py::object freq_factors) {
        need_2d(x, "x");
        if (pos.ndim() != 1 || pos.shape(0) != x.shape(0)) throw bonsai::Error("pos must hold one position per row of x");
        if (n_head <= 0 || x.shape(1) % n_head != 0) throw bonsai::Error("x.shape[1] must be n_head * head_dim");
        const int64_t head_dim = x.shape(1) / n_head;
        if (n_rot <= 0 || n_rot % 2 || n_rot > head_dim) throw bonsai::Error("n_rot must be even and <= head_dim");
        std::vector<float> ff;
        if (!freq_factors.is_none()) {
            F32Array f = F32Array::ensure(freq_factors);
            if (!f || f.ndim() != 1 || f.shape(0) != n_rot / 2) throw bonsai::Error("freq_factors must hold n_rot / 2 values");
            ff.assign(f.data(), f.data() + f.shape(0));
        }
        auto y = new_2d(x.shape(0), x.shape(1));
        float* yp = y.mutable_data();
        std::copy(x.data(), x.data() + x.size(), yp);
        py::gil_scoped_release release;
        bonsai::cuda_rope_host(yp, pos.data(), x.shape(0), n_head, head_dim, n_rot, neox, theta,
                               freq_scale, ff.empty() ? nullptr : ff.data());
        return y;
    }, py::arg("x"), py::arg("pos"), py::arg("n_head"), py::arg("n_rot"), py::arg("neox"), py::arg("theta"),
       py::arg("freq_scale") = 1.0f, py::arg("freq_factors") = py::none());
    m.def("cuda_swiglu", [](const F32Array& gate, const F32Array& up) {
        if (gate.size() != up.size()) throw bonsai::Error("gate and up differ in size");
        py::array_t<float> out(gate.size());
        float* op = out.mutable_data();
        py::gil_scoped_release release;
        bonsai::cuda_swiglu_host(gate.data(), up.data(), gate.size(), op);
        return out;
    }, py::arg("gate"), py::arg("up"));
    m.def("cuda_store_kv", [](const F32Array& rows, const std::string& type) {
        need_2d(rows, "rows");
        const bonsai::GgmlType t = kv_type(type);
        const size_t rb = bonsai::type_row_bytes(t, rows.shape(1));
        py::array_t<uint8_t> out({static_cast<py::ssize_t>(rows.shape(0)), static_cast<py::ssize_t>(rb)});
        uint8_t* op = out.mutable_data();
        py::gil_scoped_release release;
        bonsai::cuda_store_kv_host(rows.data(), rows.shape(0), rows.shape(1), t, op);
        return out;
    }, py::arg("rows"), py::arg("type"), "K/V rows converted by the device cache-store kernel (uint8 rows).");
    m.def("cuda_copy_bandwidth", [](uint64_t bytes, int iters) {
        py::gil_scoped_release release;
        return bonsai::cuda_copy_bandwidth(bytes, iters);
    }, py::arg("bytes") = uint64_t(1) << 30, py::arg("iters") = 20,
       "Device memory bandwidth in bytes/s (read + write) of device-to-device copies of `bytes`.");
    m.def("cuda_attention", [](const F32Array& q, const I32Array& pos, const U64Array& seq_mask, const F32Array& k,
                               const F32Array& v, const I32Array& cell_pos, const U64Array& cell_seq,
                               const std::string& type_k, const std::string& type_v, int64_t n_head, int64_t n_head_kv,
                               float scale, bool flash) {
        need_2d(q, "q");
        need_2d(k, "k");
        need_2d(v, "v", k.shape(1));
        if (n_head <= 0 || q.shape(1) % n_head) throw bonsai::Error("q.shape[1] must be n_head * head_dim");
        const int64_t hd = q.shape(1) / n_head;
        if (n_head_kv <= 0 || k.shape(1) != n_head_kv * hd) throw bonsai::Error("k.shape[1] must be n_head_kv * head_dim");
        const int64_t n = q.shape(0), cells = k.shape(0);
        if (pos.size() != n || seq_mask.size() != n || v.shape(0) != cells || cell_pos.size() != cells ||
            cell_seq.size() != cells)
            throw bonsai::Error("cuda_attention: array lengths do not match");
        auto out = new_2d(n, q.shape(1));
        const bonsai::GgmlType tk = kv_type(type_k), tv = kv_type(type_v);
        float* op = out.mutable_data();
        py::gil_scoped_release release;
        bonsai::cuda_attention_host(q.data(), n, pos.data(), seq_mask.data(), k.data(), v.data(), cells,
                                    cell_pos.data(), cell_seq.data(), tk, tv, n_head, n_head_kv, hd, scale, flash, op);
        return out;
    }, py::arg("q"), py::arg("pos"), py::arg("seq_mask"), py::arg("k"), py::arg("v"), py::arg("cell_pos"),
       py::arg("cell_seq"), py::arg("type_k") = "f16", py::arg("type_v") = "f16", py::arg("n_head") = 1,
       py::arg("n_head_kv") = 1, py::arg("scale") = 1.0f, py::arg("flash") = false,
       "Causal attention over a cache built from k / v rows (stored as type_k / type_v on the device); "
       "flash=True runs the flash kernel (tiles, GQA sharing, split cells for few queries).");
    m.def("cuda_gdn_conv1d_silu", [](const F32Array& x, const F32Array& w_t, const F32Array& state,
                                     std::optional<I32Array> slots) {
        need_2d(x, "x");
        need_2d(w_t, "w_t", x.shape(1));
        const int64_t n = x.shape(0), n_ch = x.shape(1), kernel = w_t.shape(0);
        if (state.ndim() != 3 || state.shape(1) != kernel - 1 || state.shape(2) != n_ch)
            throw bonsai::Error("state must be a float32 array (n_slots, kernel - 1, n_ch)");
        const std::vector<int32_t> sl = slot_list(slots, n);
        auto out = copy_of(x);
        auto st = copy_of(state);
        float* op = out.mutable_data();
        float* sp = st.mutable_data();
        const int64_t n_slots = state.shape(0);
        {
            py::gil_scoped_release release;
            bonsai::cuda_gdn_conv1d_silu_host(op, n, n_ch, w_t.data(), kernel, sp, n_slots, sl.data());
        }
        return py::make_tuple(out, st);
    }, py::arg("x"), py::arg("w_t"), py::arg("state"), py::arg("slots") = py::none(),
       "The CUDA twin of _core.gdn_conv1d_silu: causal conv1d + SiLU of x (n_tokens, n_ch) with taps w_t "
       "(kernel, n_ch); token t uses slot slots[t] (default 0) of state (n_slots, kernel - 1, n_ch). Returns "
       "(out, new state).");
    m.def("cuda_l2_norm_rows", [](const F32Array& x, float eps) {
        need_2d(x, "x");
        auto y = copy_of(x);
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        bonsai::cuda_l2_norm_rows_host(yp, x.shape(0), x.shape(1), eps);
        return y;
    }, py::arg("x"), py::arg("eps") = 1e-6f);
    m.def("cuda_gdn_gates", [](const F32Array& alpha, const F32Array& beta_logit, const F32Array& dt_bias,
                               const F32Array& ssm_a) {
        need_2d(alpha, "alpha");
        need_2d(beta_logit, "beta", alpha.shape(1));
        const int64_t n = alpha.shape(0), h = alpha.shape(1);
        if (beta_logit.shape(0) != n || dt_bias.ndim() != 1 || dt_bias.shape(0) != h || ssm_a.ndim() != 1 ||
            ssm_a.shape(0) != h)
            throw bonsai::Error("cuda_gdn_gates: alpha, beta (n_tokens, n_heads), dt_bias, ssm_a (n_heads)");
        auto g = copy_of(alpha);
        auto beta = copy_of(beta_logit);
        float* gp = g.mutable_data();
        float* bp = beta.mutable_data();
        {
            py::gil_scoped_release release;
            bonsai::cuda_gdn_gates_host(gp, bp, dt_bias.data(), ssm_a.data(), n, h);
        }
        return py::make_tuple(g, beta);
    }, py::arg("alpha"), py::arg("beta"), py::arg("dt_bias"), py::arg("ssm_a"),
       "(g, beta) = (ssm_a * softplus(alpha + dt_bias), sigmoid(beta)) on the device.");
    m.def("cuda_gated_delta_rule", [](const F32Array& qkv, const F32Array& g, const F32Array& beta,
                                      const F32Array& state, int64_t n_k_heads, int64_t n_v_heads, int64_t dk,
                                      int64_t dv, std::optional<I32Array> slots) {
        need_2d(qkv, "qkv");
        need_2d(g, "g", n_v_heads);
        need_2d(beta, "beta", n_v_heads);
        const int64_t n = qkv.shape(0);
        if (g.shape(0) != n || beta.shape(0) != n) throw bonsai::Error("g and beta must have one row per token");
        if (state.ndim() != 4 || state.shape(1) != n_v_heads || state.shape(2) != dv || state.shape(3) != dk)
            throw bonsai::Error("state must be a float32 array (n_slots, n_v_heads, dv, dk)");
        const std::vector<int32_t> sl = slot_list(slots, n);
        auto out = new_2d(n, n_v_heads * dv);
        auto st = copy_of(state);
        float* op = out.mutable_data();
        float* sp = st.mutable_data();
        const int64_t n_slots = state.shape(0), stride = qkv.shape(1);
        const float scale = 1.0f / std::sqrt(static_cast<float>(dk));  // as the CPU binding
        {
            py::gil_scoped_release release;
            bonsai::cuda_gated_delta_rule_host(qkv.data(), n, stride, g.data(), beta.data(), n_k_heads, n_v_heads, dk,
                                               dv, scale, sp, n_slots, sl.data(), op);
        }
        return py::make_tuple(out, st);
    }, py::arg("qkv"), py::arg("g"), py::arg("beta"), py::arg("state"), py::arg("n_k_heads"), py::arg("n_v_heads"),
       py::arg("dk"), py::arg("dv"), py::arg("slots") = py::none(),
       "The CUDA gated delta rule of _core.gated_delta_rule's arguments over qkv (n_tokens, >= 2*n_k_heads*dk + "
       "n_v_heads*dv: q | k | v), g and beta (n_tokens, n_v_heads); token t updates slot slots[t] (default 0) of "
       "state (n_slots, n_v_heads, dv, dk). Returns (out (n_tokens, n_v_heads*dv), new state).");
    m.def("cuda_rms_norm_gated", [](const F32Array& o, const F32Array& w, const F32Array& z, float eps) {
        need_2d(o, "o");
        need_2d(z, "z", o.shape(1));
        if (z.shape(0) != o.shape(0) || w.ndim() != 1 || w.shape(0) != o.shape(1))
            throw bonsai::Error("cuda_rms_norm_gated: z must match o and w hold o.shape[1] values");
        auto y = copy_of(o);
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        bonsai::cuda_rms_norm_gated_host(yp, w.data(), z.data(), o.shape(0), o.shape(1), eps);
        return y;
    }, py::arg("o"), py::arg("w"), py::arg("z"), py::arg("eps"));
    m.def("cuda_sigmoid_mul", [](const F32Array& x, const F32Array& gate) {
        if (gate.size() != x.size()) throw bonsai::Error("x and gate differ in size");
        py::array_t<float> y(x.size());  // flattened, as the CPU binding
        std::copy(x.data(), x.data() + x.size(), y.mutable_data());
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        bonsai::cuda_sigmoid_mul_host(yp, gate.data(), x.size());
        return y;
    }, py::arg("x"), py::arg("gate"));
#else
    (void)m;
#endif
}

}  // namespace bonsai_py
