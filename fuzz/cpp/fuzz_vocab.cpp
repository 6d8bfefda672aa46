// libFuzzer harness of the tokenizers (ASan + UBSan build, BONSAI_FUZZ=ON).
//
// Input: byte 0 picks the vocabulary, the rest is the text. Vocabularies are fixed and built here
// (no file): byte-level BPE with each pre-tokenizer (default, gpt-2, llama-bpe, qwen2), and
// SentencePiece with byte fallback, each with a control token, a user-defined token and a few merges.
// Every text is tokenized with and without special-token parsing, each id is rendered, and the
// streaming decoder is fed the ids.
//
// Properties (a violation aborts, so libFuzzer reports it):
//   - no exception at all: tokenizing and detokenizing text cannot fail;
//   - every id is in [0, n_vocab);
//   - byte-level BPE, for EVERY byte string s: detokenize(tokenize(s, no BOS, no special parsing)) == s
//     (every byte has a token, and the byte alphabet maps back one to one);
//   - SentencePiece (add_space_prefix on), for s valid UTF-8 that does not contain U+2581: the same
//     round trip (spaces become U+2581 and back, so a literal U+2581 comes back as a space; invalid
//     UTF-8 is tokenized through the <0xNN> byte tokens but only checked for not crashing);
//   - the streaming decoder's output, flushed, equals the concatenated pieces.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/unicode.h"
#include "bonsai/vocab.h"
#include "vocab_state.h"

using namespace bonsai;

namespace {

const char* const kSpmSpace = "\xE2\x96\x81";

VocabData bpe_data(const std::string& pre) {
    VocabData d;
    d.model = "gpt2";
    d.pre = pre;
    for (int b = 0; b < 256; ++b) {
        std::string s;
        unicode::append_utf8(s, byte_to_codepoint(static_cast<uint8_t>(b)));
        d.tokens.push_back(s);
    }
    // "Ġ" is the byte alphabet's space; "Ċ" its newline
    d.merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "o r", "\xC4\xA0w or", "\xC4\x8A \xC4\x8A",
                "1 2", "\xC3\xA4 \xC2\xB8"};
    for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor", "\xC4\x8A\xC4\x8A", "12",
                          "\xC3\xA4\xC2\xB8"})
        d.tokens.push_back(t);
    d.tokens.push_back("<|begin_of_text|>");  // llama-bpe adds BOS
    d.tokens.push_back("<|endoftext|>");
    d.tokens.push_back("<tool>");
    d.types.assign(d.tokens.size(), TOKEN_TYPE_NORMAL);
    const int32_t n = static_cast<int32_t>(d.tokens.size());
    d.types[n - 3] = d.types[n - 2] = TOKEN_TYPE_CONTROL;
    d.types[n - 1] = TOKEN_TYPE_USER_DEFINED;
    d.bos_id = n - 3;
    d.eos_id = n - 2;
    return d;
}

VocabData spm_data() {
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
    const std::string sp = kSpmSpace;
    const std::vector<std::pair<std::string, float>> pieces = {
        {sp, -20}, {"h", -21}, {"e", -22}, {"l", -23}, {"o", -24}, {sp + "h", -1}, {"ll", -2}, {sp + "he", -3},
        {"llo", -4}, {sp + "hello", -5}, {"he", -10}, {sp + sp, -6}, {"\xE4\xB8\xAD", -7}, {"\xC3\xA9", -8}};
    for (const auto& [text, score] : pieces) {
        d.tokens.push_back(text);
        d.types.push_back(TOKEN_TYPE_NORMAL);
        d.scores.push_back(score);
    }
    d.tokens.push_back("<tool>");
    d.types.push_back(TOKEN_TYPE_USER_DEFINED);
    d.scores.push_back(0);
    d.unk_id = 0;
    d.bos_id = 1;
    d.eos_id = 2;
    return d;
}

const std::vector<Vocab>& vocabs() {
    static const std::vector<Vocab> v = {Vocab(bpe_data("default")), Vocab(bpe_data("gpt-2")),
                                         Vocab(bpe_data("llama-bpe")), Vocab(bpe_data("qwen2")),
                                         Vocab(spm_data())};
    return v;
}

bool valid_utf8(std::string_view s) {
    for (const auto& c : unicode::decode_utf8(s))
        if (c.cp == unicode::INVALID_CODEPOINT) return false;
    return true;
}

[[noreturn]] void violation(const char* what, std::string_view text, const std::string& got) {
    std::fprintf(stderr, "property violated: %s\n  input (%zu bytes), output (%zu bytes): '%s'\n", what,
                 text.size(), got.size(), got.c_str());
    std::abort();
}

void check_ids(const Vocab& v, const std::vector<int32_t>& ids, std::string_view text) {
    for (int32_t id : ids)
        if (id < 0 || id >= v.n_vocab()) violation("token id out of range", text, std::to_string(id));
}

void run(const Vocab& v, std::string_view text) {
    const std::vector<int32_t> plain = v.tokenize(text, false, false);
    check_ids(v, plain, text);
    const std::string back = v.detokenize(plain);
    const bool must_round_trip =
        v.type() == VocabType::BPE || (valid_utf8(text) && text.find(kSpmSpace) == std::string_view::npos);
    if (must_round_trip && back != text) violation("detokenize(tokenize(s)) != s", text, back);

    const std::vector<int32_t> special = v.tokenize(text, true, true);
    check_ids(v, special, text);
    for (bool render : {false, true}) {
        std::string pieces, streamed;
        TokenStreamDecoder stream(v, render);
        for (int32_t id : special) {
            pieces += v.token_to_piece(id, render);
            streamed += stream.push(id);
        }
        streamed += stream.flush();
        if (streamed != pieces) violation("streamed pieces != concatenated pieces", text, streamed);
        (void)v.detokenize(special, render);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::vector<Vocab>& vs = vocabs();
    const Vocab& v = vs[data[0] % vs.size()];
    const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        run(v, text);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tokenizer threw: %s\n", e.what());
        std::abort();
    }
    return 0;
}
