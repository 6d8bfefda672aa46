// Per-token absmax INT8 activation quantization on the GPU, the twin of cpp/backends/cpu/act_quant.
//
// One block of 256 threads per token row: amax = max |x| (a max is exact in any order), then
// s = amax / 127 and q = round-half-away(x * (127 / amax)) clamped to [-127, 127], with the
// product rounded on its own (__fmul_rn, never contracted into an fma) and the rounding done by
// truncation plus an exact remainder test, so q and s are bit-identical to the CPU's. amax 0 gives
// zeros and s = 0; a NaN or infinite value gives zeros and s = NaN (the output becomes NaN).
#include <cfloat>

#include "cuda_common.cuh"
#include "ops_cuda.cuh"
#include "quantize_row.cuh"

namespace bonsai::cuda {

namespace {

__global__ void quantize_act_kernel(const float* __restrict__ x, int64_t cols, int8_t* __restrict__ q,
                                    float* __restrict__ scale) {
    __shared__ float red[32];
    const int64_t t = blockIdx.x;
    quantize_row(x + t * cols, cols, q + t * cols, scale + t, red);
}

}  // namespace

void check_act_scratch(int64_t n_tokens, int64_t cols, const ActScratch& s) {
    if (n_tokens > s.max_tokens || n_tokens * cols > s.max_elems)
        throw Error("CUDA quantize_act: " + std::to_string(n_tokens) + " x " + std::to_string(cols) +
                    " activations exceed the INT8 scratch (" + std::to_string(s.max_elems) + " elements)");
}

void quantize_act(const float* x, int64_t n_tokens, int64_t cols, const ActScratch& s) {
    if (n_tokens <= 0 || cols <= 0) return;
    check_act_scratch(n_tokens, cols, s);
    quantize_act_kernel<<<grid_for(n_tokens, "quantize_act"), kThreads, 0, stream()>>>(x, cols, s.q, s.scale);
    check_launch("quantize_act_kernel");
}

}  // namespace bonsai::cuda
