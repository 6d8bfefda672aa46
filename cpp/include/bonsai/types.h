// Tensor element types: the ggml type ids stored in GGUF files and their block geometry.
//
// Id 42 has two meanings in the wild: mainline llama.cpp's Q2_0 (64 elements, 18 bytes per block)
// and the legacy PrismML Q2_0 (128 elements, 34 bytes). Inside the engine the second one is the
// distinct value TYPE_Q2_0_G128, which is never written as an id: it is stored as 42 and told apart
// from TYPE_Q2_0 by the tensor's byte size when a file is read (resolve_type_42). TYPE_PTQ1_0_R16,
// TYPE_PTQ1_0_R16L and TYPE_Q8_0_R4 are never in a file either: they mark weights whose bytes the CPU backend reordered
// after loading them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace bonsai {

enum GgmlType : uint32_t {
    TYPE_F32 = 0,
    TYPE_F16 = 1,
    TYPE_Q4_0 = 2,
    TYPE_Q8_0 = 8,
    TYPE_BF16 = 30,
    TYPE_TQ1_0 = 34,
    TYPE_TQ2_0 = 35,
    TYPE_Q2_0 = 42,
    TYPE_PQ2_0 = 142,
    TYPE_PTQ1_0 = 143,
    TYPE_Q2_0_G128 = 0x1000 + 42,  // engine-internal; file id 42
    TYPE_Q8_0_R4 = 0x1000 + 8,     // engine-internal: Q8_0 rows interleaved in memory (backends/cpu/repack.h)
    TYPE_PTQ1_0_R16 = 0x1000 + 143, // engine-internal: PTQ1_0 rows interleaved in memory (backends/cpu/repack.h)
    TYPE_PTQ1_0_R16L = 0x2000 + 143, // engine-internal: the same with trit bytes in a lookup code (ptq1_0_r16.h)
};

struct TypeTraits {
    GgmlType type;
    const char* name;   // llama.cpp spelling, e.g. "Q8_0", "PTQ1_0"
    uint32_t file_id;   // ggml id written to files
    int block_size;     // elements per block
    int type_size;      // bytes per block
    bool ternary;       // stores {-1, 0, +1} x scale
};

// Traits of a type the engine knows; nullptr for anything else (including ggml ids we do not run).
const TypeTraits* type_traits(GgmlType type);

// Traits by file id; id 42 gives the mainline g64 Q2_0 (use resolve_type_42 with the byte size).
const TypeTraits* type_traits_from_file_id(uint32_t file_id);

// Name of a ggml id, including ids the engine cannot run ("Q4_K"; "type 99" for an id without a
// name). This is the name column of tensor tables; messages use ggml_type_label.
std::string ggml_type_name(uint32_t file_id);
// The type of an id as a message states it after the word "type" ("has type Q4_K", "has type
// unknown ggml type id 99"): the name, or "unknown ggml type id N" for ids without one.
std::string ggml_type_label(uint32_t file_id);

// Bytes taken by n elements of a type (n must be a multiple of the block size).
size_t type_row_bytes(GgmlType type, int64_t n);

// Picks TYPE_Q2_0 or TYPE_Q2_0_G128 for an id-42 tensor of n elements stored in nbytes bytes;
// returns false when the size fits neither layout.
bool resolve_type_42(int64_t n, uint64_t nbytes, GgmlType* out);

}  // namespace bonsai
