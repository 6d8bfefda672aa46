// Shared by the libFuzzer harnesses: the input bytes as a file path the engine can open.
//
// The engine opens models and tokenizer files by path, so each harness writes the input to an
// anonymous in-memory file (memfd_create) created once per process and names it
// /proc/self/fd/N: no disk traffic, and nothing left behind when the fuzzer stops.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace bonsai_fuzz {

class MemFile {
public:
    explicit MemFile(const char* name) {
        fd_ = ::memfd_create(name, MFD_CLOEXEC);
        if (fd_ < 0) {
            std::perror("memfd_create");
            std::abort();
        }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    // Replaces the file's content with the bytes; the previous mapping must be released first.
    const std::string& write(const uint8_t* data, size_t size) {
        if (::ftruncate(fd_, 0) != 0) std::abort();
        size_t done = 0;
        while (done < size) {
            const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
            if (n <= 0) std::abort();
            done += static_cast<size_t>(n);
        }
        return path_;
    }
    const std::string& path() const { return path_; }

private:
    int fd_ = -1;
    std::string path_;
};

}  // namespace bonsai_fuzz
