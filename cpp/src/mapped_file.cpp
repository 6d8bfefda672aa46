// Read-only file views: mmap(2) where available, otherwise (or on request) one read into a
// 64-byte-aligned buffer, so SIMD loads of tensor data are aligned in both modes.
//
// On Linux the read-into-memory buffer is an anonymous mapping aligned to 2 MiB and marked
// MADV_HUGEPAGE before it is filled, so transparent huge pages back it where the kernel allows
// them (THP "madvise" or "always"): a decode step streams every weight once, and 2 MiB pages need
// 512 times fewer TLB entries and page walks than 4 KiB ones. The file mapping (the default mode)
// stays as it is: page-cache pages are shared with other processes and are not huge.
#include "bonsai/mapped_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "bonsai/error.h"

#if defined(__unix__) || defined(__APPLE__)
#define BONSAI_HAVE_MMAP 1
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace bonsai {

namespace {

constexpr size_t kBufferAlignment = 64;
#if defined(__linux__)
constexpr size_t kHugePage = size_t{2} << 20;
#endif

std::string os_reason() { return std::strerror(errno); }

#if BONSAI_HAVE_MMAP
// A buffer of n bytes for the read-into-memory mode. Linux: an anonymous mapping of n rounded up
// to 2 MiB, at a 2 MiB boundary (a larger mapping trimmed on both sides), advised MADV_HUGEPAGE;
// mapped_bytes receives its length (munmap in the destructor). Elsewhere, or if that mapping
// fails: a 64-byte-aligned heap block, mapped_bytes = 0. nullptr when memory is exhausted.
uint8_t* allocate_buffer(size_t n, size_t& mapped_bytes) {
    mapped_bytes = 0;
#if defined(__linux__)
    const size_t len = (n + kHugePage - 1) / kHugePage * kHugePage;
    void* p = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        const uintptr_t start = reinterpret_cast<uintptr_t>(p);
        const uintptr_t aligned = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
        if (aligned > start) ::munmap(p, aligned - start);
        if (aligned + len < start + len + kHugePage) {
            ::munmap(reinterpret_cast<void*>(aligned + len), start + len + kHugePage - (aligned + len));
        }
        ::madvise(reinterpret_cast<void*>(aligned), len, MADV_HUGEPAGE);  // advisory: ignore failure
        mapped_bytes = len;
        return reinterpret_cast<uint8_t*>(aligned);
    }
#endif
    return static_cast<uint8_t*>(::operator new(n, std::align_val_t(kBufferAlignment), std::nothrow));
}
#endif

#if BONSAI_HAVE_MMAP
// Owns a POSIX file descriptor for the duration of open().
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};
#endif

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path, bool use_mmap) {
    std::shared_ptr<MappedFile> f(new MappedFile());
    f->path_ = path;
#if BONSAI_HAVE_MMAP
    Fd fd;
    fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd.fd < 0) throw Error("cannot open '" + path + "': " + os_reason());
    struct stat st;
    if (::fstat(fd.fd, &st) != 0) throw Error("cannot stat '" + path + "': " + os_reason());
    if (S_ISDIR(st.st_mode)) throw Error("'" + path + "' is a directory, not a model file");
    if (!S_ISREG(st.st_mode)) throw Error("'" + path + "' is not a regular file");
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ == 0) return f;
    if (use_mmap) {
        void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd.fd, 0);
        if (p == MAP_FAILED)
            throw Error("cannot memory-map '" + path + "': " + os_reason() +
                        " (try --no-mmap to read it into memory instead)");
        f->data_ = static_cast<const uint8_t*>(p);
        f->mapped_ = true;
        return f;
    }
    uint8_t* buf = allocate_buffer(f->size_, f->buffer_bytes_);
    if (!buf)
        throw Error("cannot read '" + path + "' into memory: " + std::to_string(f->size_) +
                    " bytes could not be allocated (drop --no-mmap to map the file instead)");
    f->data_ = buf;
    size_t done = 0;
    while (done < f->size_) {
        const ssize_t n = ::read(fd.fd, buf + done, f->size_ - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            throw Error("cannot read '" + path + "': " +
                        (n < 0 ? os_reason() : std::string("file shrank while being read")));
        done += static_cast<size_t>(n);
    }
    return f;
#else
    (void)use_mmap;
    std::FILE* fp = std::fopen(path.c_str(), "rb");
    if (!fp) throw Error("cannot open '" + path + "': " + os_reason());
    std::fseek(fp, 0, SEEK_END);
    const long end = std::ftell(fp);
    std::fseek(fp, 0, SEEK_SET);
    if (end < 0) {
        std::fclose(fp);
        throw Error("cannot determine the size of '" + path + "'");
    }
    f->size_ = static_cast<size_t>(end);
    if (f->size_ == 0) {
        std::fclose(fp);
        return f;
    }
    uint8_t* buf = static_cast<uint8_t*>(
        ::operator new(f->size_, std::align_val_t(kBufferAlignment), std::nothrow));
    if (!buf) {
        std::fclose(fp);
        throw Error("cannot read '" + path + "' into memory: out of memory");
    }
    f->data_ = buf;
    const size_t n = std::fread(buf, 1, f->size_, fp);
    std::fclose(fp);
    if (n != f->size_) throw Error("cannot read '" + path + "': short read");
    return f;
#endif
}

MappedFile::~MappedFile() {
    if (!data_) return;
#if BONSAI_HAVE_MMAP
    if (mapped_) {
        ::munmap(const_cast<uint8_t*>(data_), size_);
        return;
    }
#endif
#if defined(__linux__)
    if (buffer_bytes_ > 0) {
        ::munmap(const_cast<uint8_t*>(data_), buffer_bytes_);
        return;
    }
#endif
    ::operator delete(const_cast<uint8_t*>(data_), std::align_val_t(kBufferAlignment));
}

}  // namespace bonsai
