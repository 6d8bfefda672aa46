// Host-memory wrappers of the CUDA ops (see bonsai/cuda/host_ops.h): copy in, run, copy out.
// Temporary device buffers are RAII so an exception frees them.
#include <chrono>
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
