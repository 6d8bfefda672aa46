// See forward_gpu.h. Without BONSAI_CUDA no context ever carries GPU state, so every layer runs
// on the CPU.
#include "forward_gpu.h"

#ifdef BONSAI_CUDA
#include "bonsai/cuda/gpu_backend.h"
#endif

namespace bonsai {

int64_t forward_gpu(const Model& m, ForwardState& st) {
#ifdef BONSAI_CUDA
    if (st.gpu) return gpu_forward(m, *st.gpu, st);
#endif
    (void)m;
    (void)st;
    return 0;
}

bool gpu_did_output(const Model& m, const ForwardState& st) {
    return st.gpu != nullptr && m.gpu_output() && st.embd == nullptr;  // embeddings: the CPU norms x
}

}  // namespace bonsai
