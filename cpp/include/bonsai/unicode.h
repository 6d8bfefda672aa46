// Unicode helpers for the tokenizers: UTF-8 decoding/encoding that never fails (malformed bytes
// become single-byte units), general-category groups and the White_Space property, looked up in
// the tables that scripts/gen_unicode_tables.py generates (cpp/src/unicode_tables.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::unicode {

// General-category groups: the first letter of the Unicode general category.
enum Category : uint8_t {
    CAT_OTHER = 0,  // C*: controls, format, private use, surrogates, unassigned
    CAT_LETTER,     // L*
    CAT_MARK,       // M*
    CAT_NUMBER,     // N*
    CAT_PUNCT,      // P*
    CAT_SYMBOL,     // S*
    CAT_SEPARATOR,  // Z*
};

constexpr uint32_t INVALID_CODEPOINT = 0xFFFFFFFFu;  // a malformed UTF-8 byte (category OTHER)

Category category(uint32_t cp);
inline bool is_letter(uint32_t cp) { return category(cp) == CAT_LETTER; }
inline bool is_number(uint32_t cp) { return category(cp) == CAT_NUMBER; }
bool is_whitespace(uint32_t cp);  // the White_Space property (regex `\s`)
const char* unicode_version();   // version of the generated tables, e.g. "14.0.0"

// One decoded character: its code point and where its bytes are in the source string.
struct Utf8Char {
    uint32_t cp;      // INVALID_CODEPOINT for a byte that does not start a well-formed sequence
    uint32_t offset;  // byte offset in the source
    uint32_t len;     // 1..4 bytes
};

// Decodes UTF-8. Every byte of the input belongs to exactly one unit, so the units always
// reassemble the input byte for byte; overlong forms, surrogates and truncated sequences become
// one-byte INVALID_CODEPOINT units.
std::vector<Utf8Char> decode_utf8(std::string_view s);

// Appends the UTF-8 encoding of a code point (<= 0x10FFFF).
void append_utf8(std::string& out, uint32_t cp);

// Length of the trailing bytes of s that start a multi-byte sequence which is still missing
// continuation bytes (0 when s ends on a character boundary or in malformed bytes). A streaming
// decoder holds these back until the next token completes them.
size_t utf8_incomplete_tail(std::string_view s);

}  // namespace bonsai::unicode
