// A large, owned byte buffer for data that is streamed end to end (weights read into memory with
// --no-mmap, the bandwidth probe's buffer). On Linux it is an anonymous mapping of the size rounded
// up to 2 MiB, at a 2 MiB boundary, advised MADV_HUGEPAGE before anything touches it, so transparent
// huge pages back it where the kernel allows them (THP "madvise" or "always"): streaming a buffer
// through 2 MiB pages takes 512 times fewer TLB entries and page walks than through 4 KiB ones.
// Elsewhere, or when that mapping fails, it is a 64-byte-aligned heap block. Contents start
// unspecified; the buffer is move-only and releases its memory in the destructor.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bonsai {

class HugeBuffer {
public:
    HugeBuffer() = default;
    // n bytes (n > 0); data() is nullptr when the memory cannot be had (no exception: callers name
    // what they were allocating in their own error).
    explicit HugeBuffer(size_t n);
    ~HugeBuffer();
    HugeBuffer(HugeBuffer&& o) noexcept;
    HugeBuffer& operator=(HugeBuffer&& o) noexcept;
    HugeBuffer(const HugeBuffer&) = delete;
    HugeBuffer& operator=(const HugeBuffer&) = delete;

    uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

private:
    void release();

    uint8_t* data_ = nullptr;
    size_t size_ = 0;
    size_t mapped_bytes_ = 0;  // > 0: data_ is an anonymous mapping of this length (munmap)
};

// Whether the kernel backs a HugeBuffer with huge pages: Linux with transparent huge pages set to
// "always" or "madvise" (/sys/kernel/mm/transparent_hugepage/enabled); false elsewhere.
bool huge_pages_available();

}  // namespace bonsai
