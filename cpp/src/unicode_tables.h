// Declarations of the generated Unicode tables (cpp/src/unicode_tables.cpp, written by
// scripts/gen_unicode_tables.py). Internal to the engine library; use bonsai/unicode.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bonsai/unicode.h"

namespace bonsai::unicode_detail {

using unicode::CAT_LETTER;
using unicode::CAT_MARK;
using unicode::CAT_NUMBER;
using unicode::CAT_PUNCT;
using unicode::CAT_SEPARATOR;
using unicode::CAT_SYMBOL;

struct CategoryRange {
    uint32_t first;  // inclusive
    uint32_t last;   // inclusive
    unicode::Category cat;
};

struct CodepointRange {
    uint32_t first;  // inclusive
    uint32_t last;   // inclusive
};

extern const char* const kUnicodeVersion;
extern const CategoryRange kCategoryRanges[];
extern const size_t kCategoryRangeCount;
extern const CodepointRange kWhitespaceRanges[];
extern const size_t kWhitespaceRangeCount;

}  // namespace bonsai::unicode_detail
