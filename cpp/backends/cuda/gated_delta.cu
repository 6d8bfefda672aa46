// qwen35's Gated DeltaNet ops on the GPU, twins of bonsai/gated_delta.h's CPU ops (cpp/src/layers.cpp,
// cpp/backends/cpu/gated_delta.cpp; SPEC §6a). Float32 throughout.
//
// Recurrent state: token t of a chunk updates the state of its sequence, found at
// states.base + states.slots[t] * states.stride (floats; slots is a device int32 array), so one
// chunk may interleave several sequences. Tokens are processed in batch order by every thread that
// touches a given state element, which is what makes interleaving correct:
// - conv1d + SiLU: one thread per channel walks the tokens in order; channel c of every slot's
//   state ([kernel-1][n_ch], oldest row first) is only ever touched by thread c.
// - gated delta rule: the rows of a V head's state ([dv][dk]) are independent given the token's q,
//   k, v, g and beta, so block (h, y) owns rows [16y, 16y + 16) of head h of every slot, one warp
//   per row at a time, lane i holding elements i, i + 32, ...; the state stays in global memory
//   and each element is read and written by the same thread for every token. Per token:
//     S_r <- e^g S_r;  delta_r = beta (v_r - S_r . k);  S_r <- S_r + delta_r k;  o_r = scale S_r . q
//   computed as on the CPU: delta_r = beta (v_r - e^g (S_r . k)) from the undecayed row, then
//   u = e^g s + delta_r k written back and dotted with q. The token's q and k (of K head h % K)
//   are staged in shared memory.
// - l2 norm and the gated RMSNorm: one block of 128 threads per row, sum of squares in double
//   (as on the CPU), reduced with warp shuffles (block_sum).
// - gates and sigmoid_mul: grid-stride elementwise loops.
#include "cuda_common.cuh"
#include "ops_cuda.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kRowThreads = 128;         // l2 norm / gated norm: threads per row
constexpr int kDeltaWarps = 4;           // delta rule: warps per block
constexpr int64_t kDeltaRowsPerBlock = 16;  // delta rule: state rows of one V head per block
constexpr size_t kMaxSharedBytes = 48 * 1024;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void conv1d_silu_kernel(float* x, int64_t n_tokens, int64_t n_ch, const float* __restrict__ w_t,
                                   int64_t kernel, SlotStates states) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= n_ch) return;
    const int64_t n_state = kernel - 1;
    for (int64_t t = 0; t < n_tokens; ++t) {
        float* state = states.base + static_cast<int64_t>(states.slots[t]) * states.stride;
        float* xc = x + t * n_ch + c;
        const float in = *xc;
        float acc = w_t[n_state * n_ch + c] * in;
        for (int64_t j = 0; j < n_state; ++j) acc += w_t[j * n_ch + c] * state[j * n_ch + c];
        for (int64_t j = 0; j + 1 < n_state; ++j) state[j * n_ch + c] = state[(j + 1) * n_ch + c];
        if (n_state > 0) state[(n_state - 1) * n_ch + c] = in;
        *xc = silu(acc);
    }
}

// x[r] *= 1 / sqrt(sum(x[r]^2) + eps).
__global__ void l2_norm_kernel(float* x, int64_t n, float eps) {
    __shared__ double red[32];
    float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
    ss = block_sum(ss, red);
    const float inv = static_cast<float>(1.0 / sqrt(ss + static_cast<double>(eps)));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] *= inv;
}

__global__ void gates_kernel(float* alpha_to_g, float* beta, const float* __restrict__ dt_bias,
                             const float* __restrict__ ssm_a, int64_t total, int64_t n_heads) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t h = i % n_heads;
        const float u = alpha_to_g[i] + dt_bias[h];
        const float softplus = u > 20.0f ? u : log1pf(expf(u));  // log(1 + e^u), exact past 20
        alpha_to_g[i] = ssm_a[h] * softplus;
        beta[i] = 1.0f / (1.0f + expf(-beta[i]));
    }
}

// grid (n_v_heads, ceil(dv / kDeltaRowsPerBlock)), kDeltaWarps * 32 threads, 2 * dk floats of
// dynamic shared memory (q and k of the current token).
__global__ void gated_delta_rule_kernel(DeltaRuleDev a) {
    extern __shared__ float qk[];
    float* sq = qk;
    float* sk = qk + a.dk;
    const int64_t h = blockIdx.x;
    const int64_t kh = h % a.n_k_heads;
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kDeltaRowsPerBlock;
    const int64_t r1 = r0 + kDeltaRowsPerBlock < a.dv ? r0 + kDeltaRowsPerBlock : a.dv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t q_off = kh * a.dk, k_off = a.n_k_heads * a.dk + kh * a.dk;
    const int64_t v_off = 2 * a.n_k_heads * a.dk + h * a.dv;
    const int64_t state_head = a.dv * a.dk;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
        const float* row = a.qkv + t * a.qkv_stride;
        __syncthreads();  // every warp is done with the previous token's q and k
        for (int64_t i = threadIdx.x; i < a.dk; i += blockDim.x) {
            sq[i] = row[q_off + i];
            sk[i] = row[k_off + i];
        }
        __syncthreads();
        const int64_t gi = t * a.n_v_heads + h;
        const float decay = expf(a.g[gi]);
        const float beta = a.beta[gi];
        float* S = a.states.base + static_cast<int64_t>(a.states.slots[t]) * a.states.stride + h * state_head;
        const float* v = row + v_off;
        float* o = a.out + t * a.n_v_heads * a.dv + h * a.dv;
        for (int64_t r = r0 + warp; r < r1; r += kDeltaWarps) {  // warp-uniform: every lane reduces
            float* s = S + r * a.dk;
            float sk_dot = 0.0f;
            for (int64_t i = lane; i < a.dk; i += 32) sk_dot += s[i] * sk[i];
            sk_dot = warp_sum(sk_dot);
            const float delta = beta * (v[r] - decay * sk_dot);
            float sq_dot = 0.0f;
            for (int64_t i = lane; i < a.dk; i += 32) {
                const float u = decay * s[i] + delta * sk[i];
                s[i] = u;
                sq_dot += u * sq[i];
            }
            sq_dot = warp_sum(sq_dot);
            if (lane == 0) o[r] = a.scale * sq_dot;
        }
    }
}

// o[r] = o[r] * (1 / sqrt(mean(o[r]^2) + eps)) * w * silu(z[r]).
__global__ void rms_norm_gated_kernel(float* o, const float* __restrict__ w, const float* __restrict__ z, int64_t n,
                                      float eps) {
    __shared__ double red[32];
    const int64_t r = blockIdx.x;
    float* orow = o + r * n;
    const float* zr = z + r * n;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += static_cast<double>(orow[i]) * orow[i];
    ss = block_sum(ss, red);
    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + static_cast<double>(eps)));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = orow[i] * inv * w[i] * silu(zr[i]);
}

__global__ void sigmoid_mul_kernel(float* x, const float* __restrict__ gate, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

bool valid(const SlotStates& s) { return s.base && s.slots && s.stride > 0; }

}  // namespace

void gdn_conv1d_silu(float* x, int64_t n_tokens, int64_t n_ch, const float* w_t, int64_t kernel,
                     const SlotStates& states) {
    if (n_ch <= 0 || kernel < 1 || n_tokens < 0 || !x || !w_t || (n_tokens > 0 && !valid(states)) ||
        (n_tokens > 0 && states.stride < (kernel - 1) * n_ch))
        throw Error("CUDA gdn_conv1d_silu: invalid arguments");
    if (n_tokens == 0) return;
    const int64_t blocks = (n_ch + kThreads - 1) / kThreads;
    conv1d_silu_kernel<<<grid_for(blocks, "gdn_conv1d_silu"), kThreads, 0, stream()>>>(x, n_tokens, n_ch, w_t, kernel,
                                                                                        states);
    check_launch("conv1d_silu_kernel");
}

void l2_norm_rows(float* x, int64_t n_rows, int64_t n, float eps) {
    if (n <= 0 || n_rows < 0 || !x) throw Error("CUDA l2_norm_rows: invalid arguments");
    if (n_rows == 0) return;
    l2_norm_kernel<<<grid_for(n_rows, "l2_norm_rows"), kRowThreads, 0, stream()>>>(x, n, eps);
    check_launch("l2_norm_kernel");
}

void gdn_gates(float* alpha_to_g, float* beta, const float* dt_bias, const float* ssm_a, int64_t n_tokens,
               int64_t n_heads) {
    if (n_heads <= 0 || n_tokens < 0 || !alpha_to_g || !beta || !dt_bias || !ssm_a)
        throw Error("CUDA gdn_gates: invalid arguments");
    if (n_tokens == 0) return;
    const int64_t total = n_tokens * n_heads;
    gates_kernel<<<stride_blocks(total), kThreads, 0, stream()>>>(alpha_to_g, beta, dt_bias, ssm_a, total, n_heads);
    check_launch("gates_kernel");
}

void gated_delta_rule(const DeltaRuleDev& a) {
    if (a.n_k_heads <= 0 || a.n_v_heads <= 0 || a.n_v_heads % a.n_k_heads != 0 || a.dk <= 0 || a.dv <= 0 ||
        a.n_tokens < 0 || a.qkv_stride < 2 * a.n_k_heads * a.dk + a.n_v_heads * a.dv || !a.qkv || !a.g || !a.beta ||
        !a.out || (a.n_tokens > 0 && !valid(a.states)) ||
        (a.n_tokens > 0 && a.states.stride < a.n_v_heads * a.dv * a.dk))
        throw Error("CUDA gated_delta_rule: invalid arguments");
    const size_t shared = 2 * sizeof(float) * static_cast<size_t>(a.dk);
    if (shared > kMaxSharedBytes)
        throw Error("CUDA gated_delta_rule: head dim " + std::to_string(a.dk) + " is too large");
    if (a.n_tokens == 0) return;
    const int64_t row_blocks = (a.dv + kDeltaRowsPerBlock - 1) / kDeltaRowsPerBlock;
    if (row_blocks > 65535) throw Error("CUDA gated_delta_rule: V head dim " + std::to_string(a.dv) + " is too large");
    const dim3 grid(grid_for(a.n_v_heads, "gated_delta_rule"), static_cast<unsigned>(row_blocks));
    gated_delta_rule_kernel<<<grid, kDeltaWarps * 32, shared, stream()>>>(a);
    check_launch("gated_delta_rule_kernel");
}

void rms_norm_gated(float* o, const float* w, const float* z, int64_t n_rows, int64_t n, float eps) {
    if (n <= 0 || n_rows < 0 || !o || !w || !z) throw Error("CUDA rms_norm_gated: invalid arguments");
    if (n_rows == 0) return;
    rms_norm_gated_kernel<<<grid_for(n_rows, "rms_norm_gated"), kRowThreads, 0, stream()>>>(o, w, z, n, eps);
    check_launch("rms_norm_gated_kernel");
}

void sigmoid_mul(float* x, const float* gate, int64_t n) {
    if (n < 0 || (n > 0 && (!x || !gate))) throw Error("CUDA sigmoid_mul: invalid arguments");
    if (n == 0) return;
    sigmoid_mul_kernel<<<stride_blocks(n), kThreads, 0, stream()>>>(x, gate, n);
    check_launch("sigmoid_mul_kernel");
}

}  // namespace bonsai::cuda
