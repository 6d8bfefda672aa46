// Unit tests of the tokenizers on hand-built vocabularies (the oracle comparisons against
// sentencepiece / tokenizers / llama.cpp are in tests/test_tokenizer.py): Unicode helpers, the
// pre-tokenizer splits, SentencePiece merges and byte fallback, byte-level BPE merges, special
// tokens, detokenization round trips, streaming, and every validation error.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/unicode.h"
#include "bonsai/vocab.h"
#include "vocab_state.h"
#include "check.h"

using namespace bonsai;

static std::vector<std::string> split(PreTokenizer pre, const std::string& text) {
    std::vector<std::string> out;
    for (const auto& s : pretokenize(pre, text)) out.push_back(text.substr(s.offset, s.len));
    return out;
}

using Strings = std::vector<std::string>;
using Ids = std::vector<int32_t>;

static void test_unicode() {
    CHECK(unicode::is_letter('a') && unicode::is_letter(0x4E2D) && unicode::is_letter(0xE9));
    CHECK(unicode::is_number('7') && unicode::is_number(0x0663) && !unicode::is_number('a'));
    CHECK(unicode::is_whitespace(' ') && unicode::is_whitespace('\n') && unicode::is_whitespace(0x3000));
    CHECK(!unicode::is_whitespace(0x1C) && !unicode::is_whitespace('x'));
    CHECK(unicode::category(0x1F600) == unicode::CAT_SYMBOL);
    CHECK(unicode::category(0x0301) == unicode::CAT_MARK);
    const std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xFF";  // a é 中 😀 + a stray byte
    const auto chars = unicode::decode_utf8(s);
    CHECK(chars.size() == 5);
    CHECK(chars[1].cp == 0xE9 && chars[2].cp == 0x4E2D && chars[3].cp == 0x1F600);
    CHECK(chars[4].cp == unicode::INVALID_CODEPOINT && chars[4].len == 1);
    std::string enc;
    for (uint32_t cp : {0x61u, 0xE9u, 0x4E2Du, 0x1F600u}) unicode::append_utf8(enc, cp);
    CHECK(enc == s.substr(0, s.size() - 1));
    CHECK(unicode::utf8_incomplete_tail("ab\xE4\xB8") == 2);
    CHECK(unicode::utf8_incomplete_tail("ab\xE4\xB8\xAD") == 0);
    CHECK(unicode::utf8_incomplete_tail("\xF0\x9F\x98") == 3);
    CHECK(unicode::utf8_incomplete_tail("a\xFF") == 0);
}

static void test_pretokenize() {
    CHECK(split(PreTokenizer::DEFAULT, "Hello world's  end 12345!!\n\tx $5 a+=b  ") ==
          (Strings{"Hello", " world", "'", "s", " ", " end", " ", "123", "45", "!!", "\n", "\t", "x", " ",
                   "$", "5", " a", "+=", "b", "  "}));
    CHECK(split(PreTokenizer::GPT2, "Hello world's  end 123!!\n\tx  ") ==
          (Strings{"Hello", " world", "'s", " ", " end", " 123", "!!", "\n", "\t", "x", "  "}));
    CHECK(split(PreTokenizer::QWEN2, "I'LL pay 1234 $5.\r\n\n  def") ==
          (Strings{"I", "'LL", " pay", " ", "1", "2", "3", "4", " $", "5", ".\r\n\n", " ", " def"}));
    CHECK(split(PreTokenizer::LLAMA3, "x = 12345;  \n  y") ==
          (Strings{"x", " =", " ", "123", "45", ";", "  \n", " ", " y"}));
    CHECK(split(PreTokenizer::QWEN2, "中文 text") == (Strings{"中文", " text"}));
    CHECK(split(PreTokenizer::LLAMA3, "'s").size() == 1);
}

// SPM vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces with chosen scores.
static VocabData spm_data() {
    VocabData d;
    d.model = "llama";
    d.tokens = {"<unk>", "<s>", "</s>"};
    d.types = {TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL};
    d.scores = {0, 0, 0};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        d.tokens.push_back(name);
        d.types.push_back(TOKEN_TYPE_BYTE);
        d.scores.push_back(0);
    }
    const std::vector<std::pair<std::string, float>> pieces = {
        {"\xE2\x96\x81", -20}, {"h", -21}, {"e", -22}, {"l", -23}, {"o", -24}, {"\xE2\x96\x81h", -1},
        {"ll", -2}, {"\xE2\x96\x81he", -3}, {"llo", -4}, {"\xE2\x96\x81hello", -5}, {"he", -10}};
    for (const auto& [p, s] : pieces) {
        d.tokens.push_back(p);
        d.types.push_back(TOKEN_TYPE_NORMAL);
        d.scores.push_back(s);
    }
    d.unk_id = 0;
    d.bos_id = 1;
    d.eos_id = 2;
    return d;
}

static void test_spm() {
    const Vocab v(spm_data());
    const int32_t hello = v.find_token("\xE2\x96\x81hello"), he = v.find_token("\xE2\x96\x81he");
    CHECK(v.type() == VocabType::SPM && v.add_bos() && !v.add_eos() && v.add_space_prefix());
    CHECK(v.tokenize("hello") == (Ids{1, hello}));
    CHECK(v.tokenize("hello", false) == (Ids{hello}));
    // "x" has no piece: byte fallback <0x78> = id 3 + 0x78.
    CHECK(v.tokenize("hex", false) == (Ids{he, 3 + 0x78}));
    CHECK(v.tokenize("\xC3\xA9", false) == (Ids{v.find_token("\xE2\x96\x81"), 3 + 0xC3, 3 + 0xA9}));
    CHECK(v.tokenize("", true) == (Ids{1}));
    for (const std::string s : {"hello", " hello  hex\n", "\xC3\xA9t\xC3\xA9 \xE4\xB8\xAD", ""}) {
        CHECK(v.detokenize(v.tokenize(s)) == s);
    }
    CHECK(v.token_to_piece(hello) == " hello");
    CHECK(v.token_to_piece(3 + 0x41) == "A");
    CHECK(v.token_to_piece(1).empty() && v.token_to_piece(1, true) == "<s>");
    // Control tokens are text unless parse_special; a space is prefixed after a special.
    CHECK(v.tokenize("<s>hello", false, true) == (Ids{1, hello}));
    CHECK(v.tokenize("<s>hello", false, false).size() > 2);
    CHECK(v.detokenize(v.tokenize("<s>hello", false, true), true) == "<s>hello");
    // Without add_space_prefix no U+2581 is prepended; add_eos appends EOS.
    VocabData d = spm_data();
    d.add_space_prefix = false;
    d.add_eos = true;
    const Vocab np(d);
    CHECK(np.tokenize(" hello") == (Ids{1, hello, 2}));
    CHECK(np.tokenize("hello", false) != (Ids{hello}));
    CHECK(np.detokenize(np.tokenize(" hello")) == " hello");
}

// BPE vocabulary: the 256 byte-alphabet characters in byte order, then merge results.
static VocabData bpe_data(const std::string& pre) {
    VocabData d;
    d.model = "gpt2";
    d.pre = pre;
    for (int b = 0; b < 256; ++b) {
        std::string s;
        unicode::append_utf8(s, byte_to_codepoint(static_cast<uint8_t>(b)));
        d.tokens.push_back(s);
    }
    d.merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "o r", "\xC4\xA0w or"};
    for (const std::string t : {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor"}) d.tokens.push_back(t);
    d.tokens.push_back("<|im_start|>");
    d.tokens.push_back("<tool>");
    d.types.assign(d.tokens.size(), TOKEN_TYPE_NORMAL);
    d.types[d.types.size() - 2] = TOKEN_TYPE_CONTROL;
    d.types.back() = TOKEN_TYPE_USER_DEFINED;
    d.eos_id = 256 + 7;
    return d;
}

static void test_bpe() {
    const Vocab v(bpe_data("qwen2"));
    const int32_t hello = v.find_token("hello"), wor = v.find_token("\xC4\xA0wor");
    const int32_t im = v.find_token("<|im_start|>"), tool = v.find_token("<tool>");
    CHECK(!v.add_bos() && v.bos() < 0);
    CHECK(v.tokenize("hello world") == (Ids{hello, wor, 'l', 'd'}));
    CHECK(v.tokenize("hell") == (Ids{v.find_token("hell")}));
    CHECK(v.tokenize("<|im_start|>hello", true, true) == (Ids{im, hello}));
    CHECK(v.tokenize("<|im_start|>", true, false).size() == 12);
    CHECK(v.tokenize("a<tool>b", true, false) == (Ids{'a', tool, 'b'}));  // user-defined: always
    const std::string text = "hello world\n\t\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 <|im_start|> x\xFFy";
    CHECK(v.detokenize(v.tokenize(text)) == text);
    CHECK(v.detokenize(v.tokenize(text, true, true)).size() == text.size() - 12);
    CHECK(v.detokenize(v.tokenize(text, true, true), true) == text);
    CHECK(v.token_to_piece(v.find_token("\xC4\xA0w")) == " w");
    CHECK(v.token_to_piece(tool) == "<tool>" && v.token_to_piece(im).empty());
    // Streaming holds back an incomplete UTF-8 character: "中" is three byte tokens here.
    TokenStreamDecoder dec(v);
    std::string streamed, partial;
    for (int32_t id : v.tokenize("a\xE4\xB8\xAD")) {
        partial = dec.push(id);
        CHECK(unicode::utf8_incomplete_tail(partial) == 0);
        streamed += partial;
    }
    CHECK(streamed == "a\xE4\xB8\xAD" && dec.flush().empty());
    CHECK(dec.push(v.find_token("\xC3\xA4")) == "" && dec.flush() == "\xE4");  // the token of byte 0xE4
    // llama-bpe ignores merges for whole pre-tokens in the vocabulary and adds BOS by default.
    VocabData d = bpe_data("llama-bpe");
    d.bos_id = 0;
    const Vocab l3(d);
    CHECK(l3.add_bos() && l3.tokenize("hello") == (Ids{0, hello}));
}

static void test_errors() {
    VocabData d = spm_data();
    d.model = "wordpiece";
    CHECK_THROWS(Vocab(d), "\"llama\"");
    d = bpe_data("falcon");
    CHECK_THROWS(Vocab(d), "qwen2");
    d = spm_data();
    d.scores.pop_back();
    CHECK_THROWS(Vocab(d), "tokenizer.ggml.scores has");
    d = spm_data();
    d.types.push_back(1);
    CHECK_THROWS(Vocab(d), "tokenizer.ggml.token_type has");
    d = spm_data();
    d.scores.clear();
    CHECK_THROWS(Vocab(d), "tokenizer.ggml.scores is missing");
    d = spm_data();
    d.bos_id = 100000;
    CHECK_THROWS(Vocab(d), "bos_token_id");
    d = spm_data();
    d.bos_id = -1;
    CHECK_THROWS(Vocab(d), "bos_token_id is missing");
    d = spm_data();
    d.types[5] = 9;
    CHECK_THROWS(Vocab(d), "token_type[5]");
    d = spm_data();
    d.tokens.clear();
    d.scores.clear();
    d.types.clear();
    CHECK_THROWS(Vocab(d), "empty");
    d = bpe_data("qwen2");
    d.merges.push_back("nospace");
    CHECK_THROWS(Vocab(d), "malformed");
    d = bpe_data("qwen2");
    d.merges.push_back("h zz");
    CHECK_THROWS(Vocab(d), "\"zz\"");
    d = bpe_data("qwen2");
    d.merges.clear();
    CHECK_THROWS(Vocab(d), "merges");
    const Vocab v(spm_data());
    CHECK_THROWS(v.token_to_piece(v.n_vocab()), "out of range");
    CHECK_THROWS(v.detokenize({-1}), "out of range");
    CHECK_THROWS(v.check_compatible(v.n_vocab() + 1), "embedding");
    v.check_compatible(v.n_vocab());
    CHECK_THROWS(Vocab::from_spm_model_file("/nonexistent/tokenizer.model"), "cannot open");
    const std::string bad = "/tmp/bonsai_test_vocab_bad.model";
    {
        std::ofstream f(bad, std::ios::binary);
        f << "\x0A\x7F" << "short";
    }
    CHECK_THROWS(Vocab::from_spm_model_file(bad), "not a valid SentencePiece model");
    std::remove(bad.c_str());
}

int main() {
    test_unicode();
    test_pretokenize();
    test_spm();
    test_bpe();
    test_errors();
    if (g_failures) {
        std::fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("test_vocab: all checks passed\n");
    return 0;
}
