// Read-only file views: mmap(2) where available, otherwise (or on request) one read into a
// 64-byte-aligned buffer, so SIMD loads of tensor data are aligned in both modes.
//
// The read-into-memory buffer is a HugeBuffer (huge_buffer.h): on Linux transparent huge pages back
// it where the kernel allows them, and a decode step, which streams every weight once, then needs
// 512 times fewer TLB entries and page walks than over 4 KiB pages. The file mapping (the default mode)
// stays as it is: page-cache pages are shared with other processes and are not huge.
#include "bonsai/mapped_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "bonsai/error.h"
#include "bonsai/huge_buffer.h"

#if defined(__unix__) || defined(__APPLE__)
#define BONSAI_HAVE_MMAP 1
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace bonsai {

namespace {

std::string os_reason() { return std::strerror(errno); }

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

void MappedFile::advise_unneeded(const uint8_t* p, size_t n) const {
#if BONSAI_HAVE_MMAP
    if (!mapped_ || n == 0) return;
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (b < e) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);  // advisory: ignore failure
#else
    (void)p;
    (void)n;
#endif
}

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path, bool use_mmap) {
    std::shared_ptr<MappedFile> f(new MappedFile());
    f->path_ = path;
#if BONSAI_HAVE_MMAP
    Fd fd;
    fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd.fd < 0) throw Error("cannot open '" + path + "': " + os_reason());
    struct stat st;
    if (::fstat(fd.fd, &st) != 0) throw Error("cannot stat '" + path + "': " + os_reason());
    if (S_ISDIR(st.st_mode))
        throw Error("'" + path + "' is a directory, not a model file; give the path of a .gguf file");
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
    f->buffer_ = HugeBuffer(f->size_);
    uint8_t* buf = f->buffer_.data();
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
    f->buffer_ = HugeBuffer(f->size_);
    uint8_t* buf = f->buffer_.data();
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
#if BONSAI_HAVE_MMAP
    if (mapped_ && data_) ::munmap(const_cast<uint8_t*>(data_), size_);
#endif
}

}  // namespace bonsai
