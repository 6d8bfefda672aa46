// UTF-8 coding and Unicode property lookups over the generated range tables. Category lookups are
// a binary search over ~1500 ranges, with an ASCII fast path (the common case in tokenizer input).
#include "bonsai/unicode.h"

#include <algorithm>

#include "unicode_tables.h"

namespace bonsai::unicode {

namespace {

struct AsciiTable {
    Category cat[128];
    bool space[128];
};

Category lookup_category(uint32_t cp) {
    using unicode_detail::kCategoryRangeCount;
    using unicode_detail::kCategoryRanges;
    const auto* end = kCategoryRanges + kCategoryRangeCount;
    const auto* it = std::upper_bound(kCategoryRanges, end, cp,
                                      [](uint32_t v, const auto& r) { return v < r.first; });
    if (it == kCategoryRanges) return CAT_OTHER;
    --it;
    return cp <= it->last ? it->cat : CAT_OTHER;
}

bool lookup_whitespace(uint32_t cp) {
    for (size_t i = 0; i < unicode_detail::kWhitespaceRangeCount; ++i) {
        const auto& r = unicode_detail::kWhitespaceRanges[i];
        if (cp < r.first) return false;
        if (cp <= r.last) return true;
    }
    return false;
}

const AsciiTable& ascii_table() {
    static const AsciiTable table = [] {
        AsciiTable t{};
        for (uint32_t cp = 0; cp < 128; ++cp) {
            t.cat[cp] = lookup_category(cp);
            t.space[cp] = lookup_whitespace(cp);
        }
        return t;
    }();
    return table;
}

}  // namespace

Category category(uint32_t cp) {
    if (cp < 128) return ascii_table().cat[cp];
    if (cp > 0x10FFFF) return CAT_OTHER;
    return lookup_category(cp);
}

bool is_whitespace(uint32_t cp) {
    if (cp < 128) return ascii_table().space[cp];
    return cp <= 0x10FFFF && lookup_whitespace(cp);
}

const char* unicode_version() { return unicode_detail::kUnicodeVersion; }

namespace {

// Expected sequence length from a lead byte; 0 for a continuation or never-valid byte.
int sequence_length(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

// Whether the second byte is valid after this lead byte (excludes overlongs, surrogates and
// code points above U+10FFFF, as the UTF-8 definition's table of well-formed sequences does).
bool valid_second(uint8_t lead, uint8_t b) {
    if ((b & 0xC0) != 0x80) return false;
    if (lead == 0xE0) return b >= 0xA0;
    if (lead == 0xED) return b <= 0x9F;
    if (lead == 0xF0) return b >= 0x90;
    if (lead == 0xF4) return b <= 0x8F;
    return true;
}

}  // namespace

std::vector<Utf8Char> decode_utf8(std::string_view s) {
    std::vector<Utf8Char> out;
    out.reserve(s.size());
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        const uint8_t b = p[i];
        const int len = sequence_length(b);
        bool ok = len > 0 && i + len <= n;
        if (ok && len > 1) {
            ok = valid_second(b, p[i + 1]);
            for (int k = 2; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
        }
        if (!ok) {
            out.push_back({INVALID_CODEPOINT, static_cast<uint32_t>(i), 1});
            ++i;
            continue;
        }
        uint32_t cp;
        switch (len) {
            case 1: cp = b; break;
            case 2: cp = ((b & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu); break;
            case 3: cp = ((b & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu); break;
            default:
                cp = ((b & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) |
                     (p[i + 3] & 0x3Fu);
        }
        out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
        i += len;
    }
    return out;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

size_t utf8_incomplete_tail(std::string_view s) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    const size_t n = s.size();
    // A sequence is at most 4 bytes, so its lead byte is among the last 3 (the tail is incomplete).
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const uint8_t b = p[n - back];
        if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
        const int len = sequence_length(b);
        if (len <= static_cast<int>(back)) return 0;  // complete, ASCII or malformed
        if (back >= 2 && !valid_second(b, p[n - back + 1])) return 0;
        return back;
    }
    return 0;
}

}  // namespace bonsai::unicode
