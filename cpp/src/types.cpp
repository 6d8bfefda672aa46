// Type table for the ggml ids the engine understands, and names for the ones it does not.
#include "bonsai/types.h"

#include "bonsai/quant_blocks.h"

namespace bonsai {

namespace {

const TypeTraits kTraits[] = {
    {TYPE_F32, "F32", 0, 1, 4, false},
    {TYPE_F16, "F16", 1, 1, 2, false},
    {TYPE_Q4_0, "Q4_0", 2, QK4_0, sizeof(block_q4_0), false},
    {TYPE_Q8_0, "Q8_0", 8, QK8_0, sizeof(block_q8_0), false},
    {TYPE_BF16, "BF16", 30, 1, 2, false},
    {TYPE_TQ1_0, "TQ1_0", 34, QK_K, sizeof(block_tq1_0), true},
    {TYPE_TQ2_0, "TQ2_0", 35, QK_K, sizeof(block_tq2_0), true},
    {TYPE_Q2_0, "Q2_0", 42, QK2_0, sizeof(block_q2_0), true},
    {TYPE_PQ2_0, "PQ2_0", 142, QK_PQ2_0, sizeof(block_pq2_0), true},
    {TYPE_PTQ1_0, "PTQ1_0", 143, QK_PTQ1_0, sizeof(block_ptq1_0), true},
    {TYPE_Q2_0_G128, "Q2_0_G128", 42, QK2_0_G128, sizeof(block_q2_0_g128), true},
    // in-memory orders of the CPU backend, after their file types (ids 143 and 8 find those)
    {TYPE_PTQ1_0_R16, "PTQ1_0", 143, QK_PTQ1_0, sizeof(block_ptq1_0), true},
    {TYPE_PTQ1_0_R16L, "PTQ1_0", 143, QK_PTQ1_0, sizeof(block_ptq1_0), true},
    {TYPE_Q8_0_R4, "Q8_0", 8, QK8_0, sizeof(block_q8_0), false},
};

// ggml ids this engine does not run, named so that errors can say what the file holds.
const char* other_type_name(uint32_t id) {
    switch (id) {
        case 3: return "Q4_1";
        case 6: return "Q5_0";
        case 7: return "Q5_1";
        case 9: return "Q8_1";
        case 10: return "Q2_K";
        case 11: return "Q3_K";
        case 12: return "Q4_K";
        case 13: return "Q5_K";
        case 14: return "Q6_K";
        case 15: return "Q8_K";
        case 16: return "IQ2_XXS";
        case 17: return "IQ2_XS";
        case 18: return "IQ3_XXS";
        case 19: return "IQ1_S";
        case 20: return "IQ4_NL";
        case 21: return "IQ3_S";
        case 22: return "IQ2_S";
        case 23: return "IQ4_XS";
        case 24: return "I8";
        case 25: return "I16";
        case 26: return "I32";
        case 27: return "I64";
        case 28: return "F64";
        case 29: return "IQ1_M";
        case 39: return "MXFP4";
        case 40: return "NVFP4";
        case 41: return "Q1_0";
        default: return nullptr;
    }
}

}  // namespace

const TypeTraits* type_traits(GgmlType type) {
    for (const auto& t : kTraits)
        if (t.type == type) return &t;
    return nullptr;
}

const TypeTraits* type_traits_from_file_id(uint32_t file_id) {
    for (const auto& t : kTraits)
        if (t.file_id == file_id) return &t;  // 42 finds TYPE_Q2_0 first
    return nullptr;
}

std::string ggml_type_name(uint32_t file_id) {
    if (const TypeTraits* t = type_traits_from_file_id(file_id)) return t->name;
    if (const char* n = other_type_name(file_id)) return n;
    return "type " + std::to_string(file_id);
}

std::string ggml_type_label(uint32_t file_id) {
    if (const TypeTraits* t = type_traits_from_file_id(file_id)) return t->name;
    if (const char* n = other_type_name(file_id)) return n;
    return "unknown ggml type id " + std::to_string(file_id);
}

size_t type_row_bytes(GgmlType type, int64_t n) {
    const TypeTraits* t = type_traits(type);
    return static_cast<size_t>(n / t->block_size) * static_cast<size_t>(t->type_size);
}

bool resolve_type_42(int64_t n, uint64_t nbytes, GgmlType* out) {
    if (n % QK2_0 == 0 && nbytes == static_cast<uint64_t>(n / QK2_0) * sizeof(block_q2_0)) {
        *out = TYPE_Q2_0;
        return true;
    }
    if (n % QK2_0_G128 == 0 &&
        nbytes == static_cast<uint64_t>(n / QK2_0_G128) * sizeof(block_q2_0_g128)) {
        *out = TYPE_Q2_0_G128;
        return true;
    }
    return false;
}

}  // namespace bonsai
