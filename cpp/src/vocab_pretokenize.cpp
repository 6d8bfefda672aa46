// Pre-tokenizers of the byte-level BPE vocabularies: hand-written matchers equivalent to the
// regular expressions of the original tokenizers (leftmost alternative wins, greedy quantifiers
// with backtracking), evaluated over Unicode categories from bonsai/unicode.h.
//
//   default (GPT-2):
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama-bpe (Llama 3) and qwen2 (N = {1,3} for Llama 3, a single digit for Qwen2):
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//     \s*[\r\n]+|\s+(?!\S)|\s+
//
// Every character is a letter, a number, whitespace or "other", so one alternative always
// matches and the pieces cover the text. Malformed UTF-8 bytes count as "other".
#include <cstring>

#include "bonsai/unicode.h"
#include "vocab_state.h"

namespace bonsai {

namespace {

enum CharClass : uint8_t { CLS_LETTER, CLS_NUMBER, CLS_SPACE, CLS_OTHER };

class Matcher {
public:
    Matcher(std::string_view text) : chars_(unicode::decode_utf8(text)) {
        cls_.resize(chars_.size());
        for (size_t i = 0; i < chars_.size(); ++i) {
            const uint32_t cp = chars_[i].cp;
            const unicode::Category c = unicode::category(cp);
            if (c == unicode::CAT_LETTER) cls_[i] = CLS_LETTER;
            else if (c == unicode::CAT_NUMBER) cls_[i] = CLS_NUMBER;
            else if (unicode::is_whitespace(cp)) cls_[i] = CLS_SPACE;
            else cls_[i] = CLS_OTHER;
        }
    }

    size_t size() const { return chars_.size(); }
    const unicode::Utf8Char& at(size_t i) const { return chars_[i]; }

    // Length in characters of the match starting at character i (always >= 1).
    size_t match_gpt2(size_t i) const {
        if (size_t k = contraction(i, false)) return k;
        const size_t j = i + (cp(i) == ' ' ? 1 : 0);
        if (is(j, CLS_LETTER)) return run(j, CLS_LETTER) - i;
        if (is(j, CLS_NUMBER)) return run(j, CLS_NUMBER) - i;
        if (is(j, CLS_OTHER)) return run(j, CLS_OTHER) - i;
        return whitespace(i);
    }

    // max_digits: 3 for Llama 3, 1 for Qwen2.
    size_t match_llama3(size_t i, size_t max_digits) const {
        if (size_t k = contraction(i, true)) return k;
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if (is(i, CLS_LETTER)) return run(i, CLS_LETTER) - i;
        if (!is(i, CLS_NUMBER) && !is_crlf(i) && is(i + 1, CLS_LETTER)) return run(i + 1, CLS_LETTER) - i;
        // \p{N}{1,max}
        if (is(i, CLS_NUMBER)) {
            size_t e = i;
            while (e < size() && e - i < max_digits && is(e, CLS_NUMBER)) ++e;
            return e - i;
        }
        //  ?[^\s\p{L}\p{N}]+[\r\n]*
        const size_t j = i + (cp(i) == ' ' ? 1 : 0);
        if (is(j, CLS_OTHER)) {
            size_t e = run(j, CLS_OTHER);
            while (e < size() && is_crlf(e)) ++e;
            return e - i;
        }
        // \s*[\r\n]+ : the whitespace run up to and including its last \r or \n
        const size_t e = run(i, CLS_SPACE);
        for (size_t k = e; k > i; --k) {
            if (is_crlf(k - 1)) return k - i;
        }
        return whitespace(i);
    }

private:
    uint32_t cp(size_t i) const { return i < size() ? chars_[i].cp : unicode::INVALID_CODEPOINT; }
    bool is(size_t i, CharClass c) const { return i < size() && cls_[i] == c; }
    bool is_crlf(size_t i) const { return cp(i) == '\r' || cp(i) == '\n'; }
    size_t run(size_t i, CharClass c) const {
        while (i < size() && cls_[i] == c) ++i;
        return i;
    }

    // 's 't 're 've 'm 'll 'd (ASCII case-insensitive when ci).
    size_t contraction(size_t i, bool ci) const {
        if (cp(i) != '\'') return 0;
        auto lower = [&](size_t k) -> uint32_t {
            uint32_t c = cp(k);
            return (ci && c >= 'A' && c <= 'Z') ? c + 32 : c;
        };
        const uint32_t a = lower(i + 1);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        const uint32_t b = lower(i + 2);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        return 0;
    }

    // \s+(?!\S)|\s+ : a whitespace run, leaving its last character to the next piece when a
    // non-space follows and the run is longer than one. A non-space here cannot happen (every
    // class has an alternative above); it is taken as a single character.
    size_t whitespace(size_t i) const {
        if (!is(i, CLS_SPACE)) return 1;
        const size_t e = run(i, CLS_SPACE);
        if (e == size() || e - i == 1) return e - i;
        return e - i - 1;
    }

    std::vector<unicode::Utf8Char> chars_;
    std::vector<uint8_t> cls_;
};

}  // namespace

std::vector<TextSpan> pretokenize(PreTokenizer pre, std::string_view text) {
    std::vector<TextSpan> out;
    if (text.empty()) return out;
    const Matcher m(text);
    size_t i = 0;
    while (i < m.size()) {
        size_t n;
        switch (pre) {
            case PreTokenizer::LLAMA3: n = m.match_llama3(i, 3); break;
            case PreTokenizer::QWEN2: n = m.match_llama3(i, 1); break;
            default: n = m.match_gpt2(i); break;
        }
        const auto& first = m.at(i);
        const auto& last = m.at(i + n - 1);
        out.push_back({first.offset, last.offset + last.len - first.offset});
        i += n;
    }
    return out;
}

}  // namespace bonsai
