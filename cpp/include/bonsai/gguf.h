// GGUF v3 reader: header, metadata key/values and tensor directory of a model file, with the tensor
// bytes left in place in the mapped file (zero copy).
//
// File layout (all little-endian):
//   magic "GGUF" | u32 version (= 3) | u64 tensor_count | u64 kv_count
//   kv_count x   { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 ne[n_dims] (ne0 varies fastest) | u32 ggml type
//                    | u64 offset (relative to the data section, a multiple of the alignment) }
//   zero padding to a multiple of `general.alignment` (default 32) | data section
// A string is u64 length + bytes (no terminator); an array is u32 element type + u64 count + elements.
//
// Opening validates everything a later reader would trust: every length against the bytes that are
// left, counts against the file size, shapes, ids, alignment, bounds and overlap of each tensor. Each
// problem is one bonsai::Error naming the file and the key or tensor.
//
// Tensors of ggml types the engine cannot run (Q4_K, ...) are still listed, with `supported` false,
// so that inspect and the converters can read such files; check_engine_types() is what the engine
// calls to refuse them. Id 42 is resolved to TYPE_Q2_0 (g64) or TYPE_Q2_0_G128 by the bytes the
// tensor occupies (the span up to the next tensor or the end of the data, less alignment padding).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bonsai/mapped_file.h"
#include "bonsai/types.h"

namespace bonsai {

enum class GgufValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};

// "UINT32", "STRING", ... ("unknown value type 99" for ids outside the enum).
std::string gguf_value_type_name(GgufValueType t);

// One metadata value: a scalar, or an array of scalars (GGUF arrays of arrays are rejected on
// read). Elements live in the vector of their kind, one entry per element; a scalar has one entry.
struct GgufValue {
    GgufValueType type = GgufValueType::UINT8;       // scalar type, or ARRAY
    GgufValueType elem_type = GgufValueType::UINT8;  // element type (== type for a scalar)
    std::vector<uint64_t> u;                         // UINT8/16/32/64 and BOOL (0 or 1)
    std::vector<int64_t> i;                          // INT8/16/32/64
    std::vector<double> f;                           // FLOAT32 (exactly widened) and FLOAT64
    std::vector<std::string> s;                      // STRING

    bool is_array() const { return type == GgufValueType::ARRAY; }
    size_t size() const;  // element count (1 for a scalar)
    // "ARRAY[STRING]" for arrays, the scalar type name otherwise.
    std::string type_name() const;
    // Human-readable rendering; long strings and arrays are shortened to about max_items items.
    std::string to_string(size_t max_items = 8) const;
};

struct GgufKv {
    std::string key;
    GgufValue value;
};

struct GgufTensor {
    std::string name;
    GgmlType type = TYPE_F32;  // engine type; valid only if `supported`
    bool supported = false;    // false: a ggml type the engine does not run (see file_id)
    uint32_t file_id = 0;      // ggml type id as stored in the file
    std::vector<int64_t> ne;   // dimensions in ggml order (ne[0] = row length, varies fastest)
    uint64_t offset = 0;       // offset of the data from the start of the data section
    uint64_t nbytes = 0;       // bytes of data; for ids of unknown geometry: span to the next tensor
    const uint8_t* data = nullptr;  // points into the file mapping

    int64_t n_elements() const;
};

class GgufFile {
public:
    static std::unique_ptr<GgufFile> open(const std::string& path, bool use_mmap = true);

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t file_size() const { return file_->size(); }
    uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
    std::shared_ptr<const MappedFile> mapping() const { return file_; }

    // Metadata in file order.
    const std::vector<GgufKv>& metadata() const { return kvs_; }
    const GgufValue* find(const std::string& key) const;  // nullptr if absent
    bool has(const std::string& key) const { return find(key) != nullptr; }

    // Typed getters. The one-argument form throws when the key is missing; the two-argument form
    // returns the default. Both throw when the value has the wrong type: integer getters accept any
    // integer type whose value fits, get_f32/get_f64 accept floats and integers.
    std::string get_string(const std::string& key) const;
    std::string get_string(const std::string& key, const std::string& def) const;
    uint32_t get_u32(const std::string& key) const;
    uint32_t get_u32(const std::string& key, uint32_t def) const;
    uint64_t get_u64(const std::string& key) const;
    uint64_t get_u64(const std::string& key, uint64_t def) const;
    int32_t get_i32(const std::string& key) const;
    int32_t get_i32(const std::string& key, int32_t def) const;
    int64_t get_i64(const std::string& key) const;
    int64_t get_i64(const std::string& key, int64_t def) const;
    float get_f32(const std::string& key) const;
    float get_f32(const std::string& key, float def) const;
    double get_f64(const std::string& key) const;
    double get_f64(const std::string& key, double def) const;
    bool get_bool(const std::string& key) const;
    bool get_bool(const std::string& key, bool def) const;

    // Array getters (the key must exist and hold an array of the right element kind).
    size_t get_array_size(const std::string& key) const;
    const std::vector<std::string>& get_array_strings(const std::string& key) const;
    std::vector<int64_t> get_array_i64(const std::string& key) const;  // integer or boolean (0 / 1) elements
    std::vector<float> get_array_f32(const std::string& key) const;

    // Tensors in file order.
    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* find_tensor(const std::string& name) const;  // nullptr if absent
    const GgufTensor& get_tensor(const std::string& name) const;   // throws naming the tensor

    // Throws for the first tensor whose type the engine cannot run, naming it, its type and the fix.
    void check_engine_types() const;

private:
    GgufFile() = default;
    const GgufValue& require(const std::string& key) const;
    [[noreturn]] void fail(const std::string& msg) const;

    std::string path_;
    std::shared_ptr<const MappedFile> file_;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<GgufKv> kvs_;
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<GgufTensor> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;

    friend class GgufParser;
};

}  // namespace bonsai
