// HugeBuffer (see huge_buffer.h): a 2 MiB-aligned anonymous mapping advised MADV_HUGEPAGE on Linux,
// a 64-byte-aligned heap block elsewhere or when the mapping fails.
#include "bonsai/huge_buffer.h"

#include <fstream>
#include <new>
#include <string>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace bonsai {

namespace {

constexpr size_t kHeapAlignment = 64;
#if defined(__linux__)
constexpr size_t kHugePage = size_t{2} << 20;
#endif

}  // namespace

HugeBuffer::HugeBuffer(size_t n) : size_(n) {
    if (n == 0) return;
#if defined(__linux__)
    // Map one huge page more than needed, then trim both ends so the rest starts on a boundary.
    const size_t len = (n + kHugePage - 1) / kHugePage * kHugePage;
    void* p = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        const uintptr_t start = reinterpret_cast<uintptr_t>(p);
        const uintptr_t aligned = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
        if (aligned > start) ::munmap(p, aligned - start);
        const uintptr_t end = start + len + kHugePage;
        if (aligned + len < end) ::munmap(reinterpret_cast<void*>(aligned + len), end - (aligned + len));
        ::madvise(reinterpret_cast<void*>(aligned), len, MADV_HUGEPAGE);  // advisory: ignore failure
        data_ = reinterpret_cast<uint8_t*>(aligned);
        mapped_bytes_ = len;
        return;
    }
#endif
    data_ = static_cast<uint8_t*>(::operator new(n, std::align_val_t(kHeapAlignment), std::nothrow));
    if (!data_) size_ = 0;
}

HugeBuffer::~HugeBuffer() { release(); }

HugeBuffer::HugeBuffer(HugeBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
      mapped_bytes_(std::exchange(o.mapped_bytes_, 0)) {}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
    if (this != &o) {
        release();
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
        mapped_bytes_ = std::exchange(o.mapped_bytes_, 0);
    }
    return *this;
}

void HugeBuffer::release() {
    if (!data_) return;
#if defined(__linux__)
    if (mapped_bytes_ > 0) {
        ::munmap(data_, mapped_bytes_);
        data_ = nullptr;
        return;
    }
#endif
    ::operator delete(data_, std::align_val_t(kHeapAlignment));
    data_ = nullptr;
}

bool huge_pages_available() {
#if defined(__linux__)
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    if (!std::getline(f, line)) return false;
    return line.find("[always]") != std::string::npos || line.find("[madvise]") != std::string::npos;
#else
    return false;
#endif
}

}  // namespace bonsai
