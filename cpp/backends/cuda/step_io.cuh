// What a context's forward step runs on besides device memory: its own CUDA stream (every launch
// and copy of the step goes there, so the step can be captured into a graph) and one pinned host
// allocation holding the staging buffers of the step's inputs (cudaMemcpyAsync from pinned memory
// is a true asynchronous copy, and the buffers' addresses never change, so captured copies stay
// valid). Both are owned RAII objects of the GpuContext.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace bonsai::cuda {

class OwnedStream {
public:
    OwnedStream();  // a non-blocking stream (no implicit ordering with the legacy stream)
    ~OwnedStream();
    OwnedStream(const OwnedStream&) = delete;
    OwnedStream& operator=(const OwnedStream&) = delete;
    cudaStream_t get() const { return s_; }

private:
    cudaStream_t s_ = nullptr;
};

class PinnedAllocation {
public:
    explicit PinnedAllocation(size_t bytes);
    ~PinnedAllocation();
    PinnedAllocation(const PinnedAllocation&) = delete;
    PinnedAllocation& operator=(const PinnedAllocation&) = delete;
    uint8_t* data() const { return ptr_; }
    size_t size() const { return bytes_; }

private:
    uint8_t* ptr_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace bonsai::cuda
