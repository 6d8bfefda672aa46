// Host-memory wrappers of the CUDA ops (see bonsai/cuda/host_ops.h): copy in, run, copy out.
// Temporary device buffers are RAII so an exception frees them.
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "../../src/layers.h"
#include "bonsai/cuda/host_ops.h"
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai {

namespace {

class Buf {
public:
    explicit Buf(size_t bytes) { cuda::check(cudaMalloc(&p_, bytes > 0 ? bytes : 1), "cudaMalloc (test buffer)"); }
    ~Buf() {
        if (p_) cudaFree(p_);
    }
    Buf(Buf&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    template <typename T>
    T* as() const { return static_cast<T*>(p_); }

private:
    void* p_ = nullptr;
};

template <typename T>
Buf to_device(const T* src, size_t n) {
    Buf b(n * sizeof(T));
    if (n) cuda::check(cudaMemcpy(b.as<void>(), src, n * sizeof(T), cudaMemcpyHostToDevice), "copy to the device");
    return b;
}

template <typename T>
void to_host(T* dst, const Buf& b, size_t n) {
    cuda::check(cudaDeviceSynchronize(), "kernel");
    if (n) cuda::check(cudaMemcpy(dst, b.as<void>(), n * sizeof(T), cudaMemcpyDeviceToHost), "copy to the host");
}

cuda::DeviceMatrix device_matrix(const WeightView& w, const Buf& b) {
    return cuda::DeviceMatrix{w.type, b.as<uint8_t>(), w.rows, w.cols, w.row_bytes};
}

void check_weight(const char* op, const WeightView& w) {
    const TypeTraits* t = type_traits(w.type);
    if (!t || w.rows <= 0 || w.cols <= 0 || w.cols % t->block_size != 0 || w.row_bytes != type_row_bytes(w.type, w.cols) ||
        !w.data)
        throw Error(std::string(op) + ": bad weight (type, shape or row size)");
}

}  // namespace

void cuda_matmul_host(const WeightView& w, const float* x, int64_t n_tokens, float* y, ActMode mode) {
    check_weight("cuda_matmul", w);
    if (n_tokens <= 0) return;
    Buf dw = to_device(static_cast<const uint8_t*>(w.data), w.row_bytes * w.rows);
    Buf dx = to_device(x, static_cast<size_t>(n_tokens * w.cols));
    Buf dy(sizeof(float) * n_tokens * w.rows);
    Buf dq(static_cast<size_t>(n_tokens * w.cols));
    Buf ds(sizeof(float) * n_tokens);
    cuda::ActScratch s{dq.as<int8_t>(), ds.as<float>(), n_tokens * w.cols, n_tokens};
    cuda::matmul(device_matrix(w, dw), dx.as<float>(), n_tokens, dy.as<float>(), mode, s);
    to_host(y, dy, static_cast<size_t>(n_tokens * w.rows));
}

void cuda_get_rows_host(const WeightView& w, const int32_t* ids, int64_t n, float* out) {
    check_weight("cuda_get_rows", w);
    for (int64_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= w.rows)
            throw Error("cuda_get_rows: row id " + std::to_string(ids[i]) + " is outside [0, " + std::to_string(w.rows) + ")");
    if (n <= 0) return;
    Buf dw = to_device(static_cast<const uint8_t*>(w.data), w.row_bytes * w.rows);
    Buf di = to_device(ids, static_cast<size_t>(n));
    Buf dout(sizeof(float) * n * w.cols);
    cuda::get_rows(device_matrix(w, dw), di.as<int32_t>(), n, dout.as<float>());
    to_host(out, dout, static_cast<size_t>(n * w.cols));
}

void cuda_rms_norm_host(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
    if (n_rows <= 0) return;
    Buf dx = to_device(x, static_cast<size_t>(n_rows * n));
    Buf dw = to_device(w, static_cast<size_t>(n));
    Buf dy(sizeof(float) * n_rows * n);
    cuda::rms_norm(dx.as<float>(), nullptr, dw.as<float>(), n_rows, n, eps, dy.as<float>());
    to_host(y, dy, static_cast<size_t>(n_rows * n));
}

void cuda_rope_host(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot,
                    bool neox, float theta, float freq_scale, const float* freq_factors) {
    if (n_tokens <= 0) return;
    RopeParams p;
    p.type = neox ? RopeType::NEOX : RopeType::NORMAL;
    p.n_rot = n_rot;
    p.theta_base = theta;
    p.freq_scale = freq_scale;
    p.freq_factors = freq_factors;
    std::vector<float> cs(static_cast<size_t>(n_tokens * n_rot));
    rope_table(pos, n_tokens, p, cs.data());
    Buf dx = to_device(x, static_cast<size_t>(n_tokens * n_head * head_dim));
    Buf dcs = to_device(cs.data(), cs.size());
    cuda::rope(dx.as<float>(), n_tokens, n_head, head_dim, n_rot, neox, dcs.as<float>());
    to_host(x, dx, static_cast<size_t>(n_tokens * n_head * head_dim));
}

void cuda_swiglu_host(const float* gate, const float* up, int64_t n, float* out) {
    if (n <= 0) return;
    Buf dg = to_device(gate, static_cast<size_t>(n));
    Buf du = to_device(up, static_cast<size_t>(n));
    Buf dout(sizeof(float) * n);
    cuda::swiglu(dg.as<float>(), du.as<float>(), n, dout.as<float>());
    to_host(out, dout, static_cast<size_t>(n));
}

void cuda_store_kv_host(const float* rows, int64_t n_rows, int64_t n, GgmlType type, uint8_t* out) {
    if (n_rows <= 0) return;
    if (type != TYPE_F16 && type != TYPE_Q8_0) throw Error("cuda_store_kv: the cache type must be F16 or Q8_0");
    const size_t rb = type_row_bytes(type, n);
    std::vector<int32_t> cells(static_cast<size_t>(n_rows));
    for (int64_t i = 0; i < n_rows; ++i) cells[i] = static_cast<int32_t>(i);
    Buf dsrc = to_device(rows, static_cast<size_t>(n_rows * n));
    Buf dcells = to_device(cells.data(), cells.size());
    Buf dst(rb * n_rows);
    cuda::store_kv_rows(dsrc.as<float>(), n_rows, n, dcells.as<int32_t>(), type, dst.as<uint8_t>(), rb);
    to_host(out, dst, rb * n_rows);
}

void cuda_attention_host(const float* q, int64_t n_tokens, const int32_t* pos, const uint64_t* seq_mask,
                         const float* k, const float* v, int64_t n_cells, const int32_t* cell_pos,
                         const uint64_t* cell_seq, GgmlType type_k, GgmlType type_v, int64_t n_head,
                         int64_t n_head_kv, int64_t head_dim, float scale, bool flash, float* out) {
    if (n_tokens <= 0) return;
    if (n_cells <= 0) throw Error("cuda_attention: the cache needs at least one cell");
    const int64_t nkv = n_head_kv * head_dim, nq = n_head * head_dim;
    std::vector<uint8_t> kb(type_row_bytes(type_k, nkv) * n_cells), vb(type_row_bytes(type_v, nkv) * n_cells);
    cuda_store_kv_host(k, n_cells, nkv, type_k, kb.data());
    cuda_store_kv_host(v, n_cells, nkv, type_v, vb.data());
    Buf dk = to_device(kb.data(), kb.size());
    Buf dv = to_device(vb.data(), vb.size());
    Buf dq = to_device(q, static_cast<size_t>(n_tokens * nq));
    Buf dpos = to_device(pos, static_cast<size_t>(n_tokens));
    Buf dmask = to_device(seq_mask, static_cast<size_t>(n_tokens));
    Buf dcpos = to_device(cell_pos, static_cast<size_t>(n_cells));
    Buf dcseq = to_device(cell_seq, static_cast<size_t>(n_cells));
    Buf dout(sizeof(float) * n_tokens * nq);
    cuda::AttentionDev a;
    a.q = dq.as<float>();
    a.n_tokens = n_tokens;
    a.pos = dpos.as<int32_t>();
    a.seq_mask = dmask.as<uint64_t>();
    a.cell_pos = dcpos.as<int32_t>();
    a.cell_seq = dcseq.as<uint64_t>();
    a.n_used = n_cells;
    a.k = dk.as<uint8_t>();
    a.v = dv.as<uint8_t>();
    a.k_row_bytes = type_row_bytes(type_k, nkv);
    a.v_row_bytes = type_row_bytes(type_v, nkv);
    a.type_k = type_k;
    a.type_v = type_v;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.head_dim = head_dim;
    a.scale = scale;
    a.out = dout.as<float>();
    if (flash) {
        a.partial_floats = cuda::flash_partial_floats(head_dim);
        Buf partial(sizeof(float) * a.partial_floats);
        a.partial = partial.as<float>();
        cuda::flash_attention(a);
        to_host(out, dout, static_cast<size_t>(n_tokens * nq));
        return;
    }
    cuda::attention(a);
    to_host(out, dout, static_cast<size_t>(n_tokens * nq));
}

namespace {

// Slot padding of the device copies of the GDN states (see host_ops.h). The padding is filled with
// all-ones bytes (a NaN) and checked on the way back, so a kernel that writes past a slot fails.
constexpr int64_t kSlotPad = 8;

void check_slots(const char* op, const int32_t* slots, int64_t n_tokens, int64_t n_slots) {
    if (n_tokens > 0 && (!slots || n_slots <= 0)) throw Error(std::string(op) + ": no state slots");
    for (int64_t t = 0; t < n_tokens; ++t)
        if (slots[t] < 0 || slots[t] >= n_slots)
            throw Error(std::string(op) + ": slot " + std::to_string(slots[t]) + " is outside [0, " +
                        std::to_string(n_slots) + ")");
}

// n_slots states of `size` floats each, copied into device slots of size + kSlotPad floats.
Buf states_to_device(const float* states, int64_t n_slots, int64_t size) {
    const size_t bytes = sizeof(float) * static_cast<size_t>((size + kSlotPad) * n_slots);
    Buf b(bytes);
    cuda::check(cudaMemset(b.as<void>(), 0xff, bytes), "cudaMemset (state slots)");
    if (size == 0) return b;  // kernel 1: no conv state
    cuda::check(cudaMemcpy2D(b.as<void>(), sizeof(float) * (size + kSlotPad), states, sizeof(float) * size,
                             sizeof(float) * size, n_slots, cudaMemcpyHostToDevice),
                "copy of the state slots to the device");
    return b;
}

void states_to_host(const char* op, float* states, const Buf& b, int64_t n_slots, int64_t size) {
    const int64_t stride = size + kSlotPad;
    std::vector<uint32_t> all(static_cast<size_t>(stride * n_slots));
    to_host(all.data(), b, all.size());
    for (int64_t s = 0; s < n_slots; ++s) {
        for (int64_t i = size; i < stride; ++i)
            if (all[s * stride + i] != 0xffffffffu)
                throw Error(std::string(op) + ": the kernel wrote past the state of slot " + std::to_string(s));
        if (size > 0) std::memcpy(states + s * size, all.data() + s * stride, sizeof(float) * size);
    }
}

}  // namespace

void cuda_gdn_conv1d_silu_host(float* x, int64_t n_tokens, int64_t n_ch, const float* w_t, int64_t kernel,
                               float* states, int64_t n_slots, const int32_t* slots) {
    if (n_ch <= 0 || kernel < 1) throw Error("cuda_gdn_conv1d_silu: invalid arguments");
    check_slots("cuda_gdn_conv1d_silu", slots, n_tokens, n_slots);
    if (n_tokens <= 0) return;
    const int64_t size = (kernel - 1) * n_ch;
    Buf dx = to_device(x, static_cast<size_t>(n_tokens * n_ch));
    Buf dw = to_device(w_t, static_cast<size_t>(kernel * n_ch));
    Buf dslots = to_device(slots, static_cast<size_t>(n_tokens));
    Buf dst = states_to_device(states, n_slots, size);
    cuda::gdn_conv1d_silu(dx.as<float>(), n_tokens, n_ch, dw.as<float>(), kernel,
                          cuda::SlotStates{dst.as<float>(), dslots.as<int32_t>(), size + kSlotPad});
    to_host(x, dx, static_cast<size_t>(n_tokens * n_ch));
    states_to_host("cuda_gdn_conv1d_silu", states, dst, n_slots, size);
}

void cuda_l2_norm_rows_host(float* x, int64_t n_rows, int64_t n, float eps) {
    if (n <= 0) throw Error("cuda_l2_norm_rows: invalid arguments");
    if (n_rows <= 0) return;
    Buf dx = to_device(x, static_cast<size_t>(n_rows * n));
    cuda::l2_norm_rows(dx.as<float>(), n_rows, n, eps);
    to_host(x, dx, static_cast<size_t>(n_rows * n));
}

void cuda_gdn_gates_host(float* alpha_to_g, float* beta, const float* dt_bias, const float* ssm_a, int64_t n_tokens,
                         int64_t n_heads) {
    if (n_heads <= 0) throw Error("cuda_gdn_gates: invalid arguments");
    if (n_tokens <= 0) return;
    const size_t total = static_cast<size_t>(n_tokens * n_heads);
    Buf da = to_device(alpha_to_g, total);
    Buf db = to_device(beta, total);
    Buf dbias = to_device(dt_bias, static_cast<size_t>(n_heads));
    Buf dssm = to_device(ssm_a, static_cast<size_t>(n_heads));
    cuda::gdn_gates(da.as<float>(), db.as<float>(), dbias.as<float>(), dssm.as<float>(), n_tokens, n_heads);
    to_host(alpha_to_g, da, total);
    to_host(beta, db, total);
}

void cuda_gated_delta_rule_host(const float* qkv, int64_t n_tokens, int64_t qkv_stride, const float* g,
                                const float* beta, int64_t n_k_heads, int64_t n_v_heads, int64_t dk, int64_t dv,
                                float scale, float* states, int64_t n_slots, const int32_t* slots, float* out) {
    if (n_k_heads <= 0 || n_v_heads <= 0 || n_v_heads % n_k_heads != 0 || dk <= 0 || dv <= 0 ||
        qkv_stride < 2 * n_k_heads * dk + n_v_heads * dv)
        throw Error("cuda_gated_delta_rule: invalid arguments");
    check_slots("cuda_gated_delta_rule", slots, n_tokens, n_slots);
    if (n_tokens <= 0) return;
    const int64_t size = n_v_heads * dv * dk;
    Buf dqkv = to_device(qkv, static_cast<size_t>(n_tokens * qkv_stride));
    Buf dg = to_device(g, static_cast<size_t>(n_tokens * n_v_heads));
    Buf db = to_device(beta, static_cast<size_t>(n_tokens * n_v_heads));
    Buf dslots = to_device(slots, static_cast<size_t>(n_tokens));
    Buf dst = states_to_device(states, n_slots, size);
    Buf dout(sizeof(float) * n_tokens * n_v_heads * dv);
    cuda::DeltaRuleDev a;
    a.qkv = dqkv.as<float>();
    a.qkv_stride = qkv_stride;
    a.g = dg.as<float>();
    a.beta = db.as<float>();
    a.n_tokens = n_tokens;
    a.n_k_heads = n_k_heads;
    a.n_v_heads = n_v_heads;
    a.dk = dk;
    a.dv = dv;
    a.scale = scale;
    a.states = cuda::SlotStates{dst.as<float>(), dslots.as<int32_t>(), size + kSlotPad};
    a.out = dout.as<float>();
    cuda::gated_delta_rule(a);
    to_host(out, dout, static_cast<size_t>(n_tokens * n_v_heads * dv));
    states_to_host("cuda_gated_delta_rule", states, dst, n_slots, size);
}

void cuda_rms_norm_gated_host(float* o, const float* w, const float* z, int64_t n_rows, int64_t n, float eps) {
    if (n <= 0) throw Error("cuda_rms_norm_gated: invalid arguments");
    if (n_rows <= 0) return;
    Buf d_o = to_device(o, static_cast<size_t>(n_rows * n));
    Buf dw = to_device(w, static_cast<size_t>(n));
    Buf dz = to_device(z, static_cast<size_t>(n_rows * n));
    cuda::rms_norm_gated(d_o.as<float>(), dw.as<float>(), dz.as<float>(), n_rows, n, eps);
    to_host(o, d_o, static_cast<size_t>(n_rows * n));
}

void cuda_sigmoid_mul_host(float* x, const float* gate, int64_t n) {
    if (n <= 0) return;
    Buf dx = to_device(x, static_cast<size_t>(n));
    Buf dg = to_device(gate, static_cast<size_t>(n));
    cuda::sigmoid_mul(dx.as<float>(), dg.as<float>(), n);
    to_host(x, dx, static_cast<size_t>(n));
}

double cuda_copy_bandwidth(uint64_t bytes, int iters) {
    if (bytes == 0 || iters <= 0) throw Error("cuda_copy_bandwidth: bytes and iters must be > 0");
    Buf a(bytes), b(bytes);
    cuda::check(cudaMemset(a.as<void>(), 1, bytes), "cudaMemset (bandwidth probe)");
    cuda::check(cudaMemcpy(b.as<void>(), a.as<void>(), bytes, cudaMemcpyDeviceToDevice), "device copy");
    cuda::check(cudaDeviceSynchronize(), "bandwidth probe");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
        cuda::check(cudaMemcpyAsync(b.as<void>(), a.as<void>(), bytes, cudaMemcpyDeviceToDevice, nullptr),
                    "device copy");
    cuda::check(cudaDeviceSynchronize(), "bandwidth probe");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return 2.0 * static_cast<double>(bytes) * iters / s;
}

}  // namespace bonsai
