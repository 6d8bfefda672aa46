// A read-only view of a whole file: memory-mapped (the default; pages are loaded on first touch and
// shared with the page cache) or read into one aligned buffer (`use_mmap = false`, the `--no-mmap`
// mode, for file systems where mapping is slow or unavailable; on Linux that buffer asks for
// transparent huge pages, see mapped_file.cpp).
//
// The object owns the mapping or buffer and releases it in its destructor; it is neither copyable
// nor movable, so pointers into data() stay valid for its whole lifetime. Holders that must outlive
// their opener (numpy views from Python, a Model) share it through std::shared_ptr.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "bonsai/huge_buffer.h"

namespace bonsai {

class MappedFile {
public:
    // Opens `path` read-only; throws bonsai::Error naming the file and the OS reason on failure.
    static std::shared_ptr<const MappedFile> open(const std::string& path, bool use_mmap = true);

    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }  // nullptr for an empty file
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }
    bool is_mapped() const { return mapped_; }
    // The bytes of a file read into memory, writable: the model that owns them may rewrite its
    // tensors in place (Model::load repacks the CPU's weights). nullptr for a mapping.
    uint8_t* buffer() const { return mapped_ ? nullptr : buffer_.data(); }
    // Tells the kernel that this process will not read [p, p + n) of the mapping again soon: the
    // whole pages inside it leave the process's resident set (they stay in the page cache, and a
    // later read maps them back). Nothing happens for a file read into memory.
    void advise_unneeded(const uint8_t* p, size_t n) const;

private:
    MappedFile() = default;

    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    bool mapped_ = false;  // true: munmap on release; false: data_ points into buffer_
    HugeBuffer buffer_;    // the file read into memory (use_mmap = false)
};

}  // namespace bonsai
