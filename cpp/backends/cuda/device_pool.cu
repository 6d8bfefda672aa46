// Device allocations of the CUDA backend (see device_pool.cuh).
#include <cstdio>

#include "cuda_common.cuh"
#include "device_pool.cuh"

namespace bonsai::cuda {

std::string format_mib(uint64_t bytes) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
}

void device_memory(uint64_t* free_bytes, uint64_t* total_bytes) {
    size_t f = 0, t = 0;
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *free_bytes = f;
    *total_bytes = t;
}

DeviceAllocation::DeviceAllocation(size_t bytes, const std::string& what) : bytes_(bytes) {
    uint64_t free_b = 0, total_b = 0;
    device_memory(&free_b, &total_b);
    if (bytes > free_b)
        throw Error("GPU memory: " + what + " needs " + format_mib(bytes) + " but only " + format_mib(free_b) +
                    " of " + format_mib(total_b) + " is free on the GPU; offload fewer layers (--n-gpu-layers), "
                    "use a smaller --ctx-size / --batch-size or a q8_0 KV cache");
    void* p = nullptr;
    check(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc of " + format_mib(bytes) + " for " + what);
    ptr_ = static_cast<uint8_t*>(p);
}

DeviceAllocation::~DeviceAllocation() {
    if (ptr_) cudaFree(ptr_);
}

}  // namespace bonsai::cuda
