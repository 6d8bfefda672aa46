// See step_io.cuh.
#include "step_io.cuh"

#include "cuda_common.cuh"
#include "device_pool.cuh"

namespace bonsai::cuda {

OwnedStream::OwnedStream() {
    check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "creating the context's stream");
}

OwnedStream::~OwnedStream() {
    if (s_) cudaStreamDestroy(s_);
}

PinnedAllocation::PinnedAllocation(size_t bytes) : bytes_(bytes) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes > 0 ? bytes : 1, cudaHostAllocDefault),
          "cudaHostAlloc of " + format_mib(bytes) + " of pinned staging buffers");
    ptr_ = static_cast<uint8_t*>(p);
}

PinnedAllocation::~PinnedAllocation() {
    if (ptr_) cudaFreeHost(ptr_);
}

}  // namespace bonsai::cuda
