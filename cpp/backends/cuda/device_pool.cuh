// Device memory of the CUDA backend: one allocation per owner, carved into 256-byte aligned
// pieces by a bump planner. The same planner computes the sizes for planning (no allocation) and
// for the real layout, so the reported figures are exactly what is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace bonsai::cuda {

constexpr size_t kAlign = 256;

// Offsets of the pieces of one allocation.
struct ArenaPlan {
    size_t total = 0;
    size_t take(size_t bytes) {
        const size_t at = (total + kAlign - 1) / kAlign * kAlign;
        total = at + bytes;
        return at;
    }
};

// Free and total bytes of device 0 (initialises the CUDA context on first use).
void device_memory(uint64_t* free_bytes, uint64_t* total_bytes);

// One cudaMalloc of `bytes`, refused with needed vs free when the device has less free memory;
// freed in the destructor. `what` names the request in the error ("weights of 24 layers").
class DeviceAllocation {
public:
    DeviceAllocation() = default;
    DeviceAllocation(size_t bytes, const std::string& what);
    ~DeviceAllocation();
    DeviceAllocation(const DeviceAllocation&) = delete;
    DeviceAllocation& operator=(const DeviceAllocation&) = delete;

    uint8_t* data() const { return ptr_; }
    size_t size() const { return bytes_; }

private:
    uint8_t* ptr_ = nullptr;
    size_t bytes_ = 0;
};

std::string format_mib(uint64_t bytes);

}  // namespace bonsai::cuda
