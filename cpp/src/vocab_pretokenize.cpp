// Pre-tokenizers of the byte-level BPE vocabularies: hand-written matchers equivalent to the
// regular expressions of the original tokenizers (leftmost alternative wins, greedy quantifiers
// with backtracking), evaluated over Unicode categories from bonsai/unicode.h.
//
//   gpt-2:
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama-bpe (Llama 3) and qwen2 (N = {1,3} for Llama 3, a single digit for Qwen2):
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//     \s*[\r\n]+|\s+(?!\S)|\s+
//   qwen35 (Qwen3.5): qwen2's pattern with the marks joined to the letters, [\p{L}\p{M}]+ and
//     [^\s\p{L}\p{M}\p{N}]; the optional prefix [^\r\n\p{L}\p{N}]? may then be a mark, which matches
//     the same extent as the mark starting the letter run, so counting marks as letters is exact.
//   default (llama.cpp's pre-tokenizer for files without a known one): four splits in sequence,
//     each applied to every piece of the previous one:
//     [\p{P}\$\+<=>\^~\|]+   then the gpt-2 pattern   then \p{N}+   then [0-9][0-9][0-9]
//
// A split keeps the text between matches as pieces of their own ("isolated" splitting), and a
// piece's ends act as the text's ends for the next split. In the single-pattern splits every
// character is a letter, a number, whitespace or "other", so some alternative always matches.
// Malformed UTF-8 bytes count as "other".
#include <cstring>

#include "bonsai/unicode.h"
#include "vocab_state.h"

namespace bonsai {

namespace {

enum CharClass : uint8_t { CLS_LETTER, CLS_NUMBER, CLS_SPACE, CLS_OTHER };

class Matcher {
public:
    explicit Matcher(std::string_view text, bool marks_are_letters = false) : chars_(unicode::decode_utf8(text)) {
        cls_.resize(chars_.size());
        for (size_t i = 0; i < chars_.size(); ++i) {
            const uint32_t cp = chars_[i].cp;
            const unicode::Category c = unicode::category(cp);
            if (c == unicode::CAT_LETTER || (marks_are_letters && c == unicode::CAT_MARK)) cls_[i] = CLS_LETTER;
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

    // [\p{P}\$\+<=>\^~\|]+ ; 0 when no match starts at i.
    size_t match_punct_run(size_t i) const {
        size_t e = i;
        while (e < size() && is_default_punct(e)) ++e;
        return e - i;
    }

    // \p{N}+ ; 0 when no match starts at i.
    size_t match_number_run(size_t i) const { return is(i, CLS_NUMBER) ? run(i, CLS_NUMBER) - i : 0; }

    // [0-9][0-9][0-9] ; 0 when no match starts at i.
    size_t match_three_digits(size_t i) const {
        for (size_t k = i; k < i + 3; ++k) {
            if (cp(k) < '0' || cp(k) > '9') return 0;
        }
        return 3;
    }

private:
    bool is_default_punct(size_t i) const {
        const uint32_t c = cp(i);
        return (i < size() && unicode::category(c) == unicode::CAT_PUNCT) || c == '$' || c == '+' ||
               c == '<' || c == '=' || c == '>' || c == '^' || c == '~' || c == '|';
    }

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

enum class Stage { GPT2, LLAMA3, QWEN2, QWEN35, PUNCT_RUN, NUMBER_RUN, THREE_DIGITS };

// Splits every span of `in` by one pattern; matches and the gaps between them become spans.
std::vector<TextSpan> split_spans(std::string_view text, const std::vector<TextSpan>& in, Stage stage) {
    std::vector<TextSpan> out;
    out.reserve(in.size());
    for (const TextSpan& span : in) {
        const Matcher m(text.substr(span.offset, span.len), stage == Stage::QWEN35);
        const size_t n = m.size();
        auto emit = [&](size_t from, size_t to) {  // characters [from, to) of this span
            const auto& last = m.at(to - 1);
            out.push_back({span.offset + m.at(from).offset, last.offset + last.len - m.at(from).offset});
        };
        size_t i = 0, gap = 0;
        while (i < n) {
            size_t k;
            switch (stage) {
                case Stage::GPT2: k = m.match_gpt2(i); break;
                case Stage::LLAMA3: k = m.match_llama3(i, 3); break;
                case Stage::QWEN2:
                case Stage::QWEN35: k = m.match_llama3(i, 1); break;
                case Stage::PUNCT_RUN: k = m.match_punct_run(i); break;
                case Stage::NUMBER_RUN: k = m.match_number_run(i); break;
                default: k = m.match_three_digits(i); break;
            }
            if (k == 0) {
                ++i;
                continue;
            }
            if (gap < i) emit(gap, i);
            emit(i, i + k);
            i += k;
            gap = i;
        }
        if (gap < n) emit(gap, n);
    }
    return out;
}

}  // namespace

std::vector<TextSpan> pretokenize(PreTokenizer pre, std::string_view text) {
    std::vector<TextSpan> spans;
    if (text.empty()) return spans;
    spans.push_back({0, static_cast<uint32_t>(text.size())});
    switch (pre) {
        case PreTokenizer::LLAMA3: return split_spans(text, spans, Stage::LLAMA3);
        case PreTokenizer::QWEN2: return split_spans(text, spans, Stage::QWEN2);
        case PreTokenizer::QWEN35: return split_spans(text, spans, Stage::QWEN35);
        case PreTokenizer::GPT2: return split_spans(text, spans, Stage::GPT2);
        default:
            for (Stage s : {Stage::PUNCT_RUN, Stage::GPT2, Stage::NUMBER_RUN, Stage::THREE_DIGITS}) {
                spans = split_spans(text, spans, s);
            }
            return spans;
    }
}

}  // namespace bonsai
