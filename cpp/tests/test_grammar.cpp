// Unit tests of the llguidance-backed matcher (grammar.h) on a small byte-level BPE vocabulary with
// two end-of-generation tokens, a control token and a user-defined token: the mask allows exactly
// the tokens that continue the grammar, both end tokens (the second one through tok_eos_extra)
// where it may end and only there, never a control or user-defined token, nor a row past the
// vocabulary; a forbidden token and a bad schema are errors naming the flag; reset starts over.
// Needs the llguidance package (a core dependency), found as bonsai_run finds it.
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/grammar.h"
#include "bonsai/unicode.h"
#include "bonsai/vocab.h"
#include "check.h"
#include "vocab_state.h"

using namespace bonsai;

namespace {

constexpr int64_t kRows = 300;  // logits rows: the vocabulary plus padding rows

Vocab make_vocab() {
    VocabData d;
    d.model = "gpt2";
    d.pre = "qwen2";
    for (int b = 0; b < 256; ++b) {
        std::string s;
        unicode::append_utf8(s, byte_to_codepoint(static_cast<uint8_t>(b)));
        d.tokens.push_back(s);
    }
    d.merges = {"h e", "l l", "he ll", "hell o"};
    for (const std::string t : {"he", "ll", "hell", "hello"}) d.tokens.push_back(t);
    d.types.assign(d.tokens.size(), TOKEN_TYPE_NORMAL);
    for (const std::string t : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}) {
        d.tokens.push_back(t);
        d.types.push_back(TOKEN_TYPE_CONTROL);
    }
    d.tokens.push_back("<tool>");
    d.types.push_back(TOKEN_TYPE_USER_DEFINED);
    d.eos_id = 256 + 5;  // <|im_end|>
    return Vocab(d);
}

// The ids the matcher allows next.
std::set<int32_t> allowed(GrammarMatcher& m) {
    std::vector<float> logits(kRows, 0.0f);
    m.apply(logits.data());
    std::set<int32_t> out;
    for (int64_t i = 0; i < kRows; ++i)
        if (!std::isinf(logits[i])) out.insert(static_cast<int32_t>(i));
    return out;
}

// Feeds `text` token by token (our tokenization), checking each token is allowed before it.
void feed(GrammarMatcher& m, const Vocab& v, const std::string& text) {
    for (int32_t t : v.tokenize(text, false, false)) {
        CHECK(allowed(m).count(t) == 1);
        m.accept(t);
    }
}

void test_json_schema(const Vocab& v, const std::vector<int32_t>& eog) {
    GrammarSource src{GrammarSource::Kind::JSON_SCHEMA,
                      R"({"type": "object", "properties": {"a": {"enum": ["hello", "he"]}}, "required": ["a"],
                          "additionalProperties": false})", "-j"};
    Grammar g(src, v, kRows, eog);
    GrammarMatcher m(g);
    CHECK(allowed(m) == std::set<int32_t>{'{'});  // compact: no whitespace first
    feed(m, v, "{\"a\":\"he");
    const std::set<int32_t> mid = allowed(m);
    CHECK(mid.count('"') == 1 && mid.count('l') == 1 && mid.count(v.find_token("ll")) == 1);
    CHECK(mid.count(eog[0]) == 0 && mid.count(eog[1]) == 0 && !m.is_accepting());
    feed(m, v, "llo\"}");
    CHECK(allowed(m) == std::set<int32_t>(eog.begin(), eog.end()));  // both end tokens, nothing else
    CHECK(m.is_accepting() && m.is_stopped());
    m.reset();  // the next chat reply starts over
    CHECK(allowed(m) == std::set<int32_t>{'{'} && !m.is_stopped() && !m.is_accepting());
    feed(m, v, "{\"a\":\"he\"}");
    CHECK(m.is_stopped());
    CHECK_THROWS(m.accept('x'), "-j: token 120 does not fit");

    GrammarMatcher fresh(g);
    CHECK_THROWS(fresh.accept(' '), "-j: token 32 does not fit");
}

void test_gbnf(const Vocab& v, const std::vector<int32_t>& eog) {
    Grammar g({GrammarSource::Kind::GRAMMAR, "root ::= \"hello\" [0-9]+", "--grammar"}, v, kRows, eog);
    GrammarMatcher m(g);
    // forced text is tokenized by our tokenizer (the callback): "hello" is one token, the only one allowed
    CHECK(allowed(m) == std::set<int32_t>{v.find_token("hello")});
    feed(m, v, "hello1");
    const std::set<int32_t> next = allowed(m);
    CHECK(next.count('2') == 1 && next.count(eog[0]) == 1 && next.count(eog[1]) == 1);
    CHECK(next.count(v.find_token("<|im_start|>")) == 0 && next.count(v.find_token("<tool>")) == 0);
    CHECK(m.is_accepting() && !m.is_stopped());

    // Lark as llguidance reads it, when no `::=` rule makes it GBNF
    Grammar lark({GrammarSource::Kind::GRAMMAR, "start: \"he\" | \"ll\"", "--grammar"}, v, kRows, eog);
    GrammarMatcher lm(lark);
    const std::set<int32_t> l = allowed(lm);
    CHECK(l.count('h') == 1 && l.count('l') == 1 && l.count(v.find_token("he")) == 1 && l.count('e') == 0);
}

void test_errors(const Vocab& v, const std::vector<int32_t>& eog) {
    using K = GrammarSource::Kind;
    CHECK_THROWS(Grammar({K::JSON_SCHEMA, R"({"type": "objekt"})", "-j"}, v, kRows, eog),
                 "-j: the JSON schema does not compile");
    CHECK_THROWS(Grammar({K::JSON_SCHEMA, "[1]", "-j"}, v, kRows, eog), "-j: a JSON schema must be an object");
    CHECK_THROWS(Grammar({K::JSON_SCHEMA, "  ", "-j"}, v, kRows, eog), "-j: the JSON schema is empty");
    CHECK_THROWS(Grammar({K::GRAMMAR, "root ::= x", "--grammar"}, v, kRows, eog),
                 "--grammar: the GBNF grammar does not parse: line 1, column 10: undefined rule 'x'");
    CHECK_THROWS(Grammar({K::GRAMMAR, "start: x", "--grammar"}, v, kRows, eog),
                 "--grammar: the grammar does not compile");
    CHECK_THROWS(Grammar({K::GRAMMAR, "\n", "--grammar"}, v, kRows, eog), "--grammar: the grammar is empty");
    CHECK_THROWS(Grammar({K::GRAMMAR, "start: \"a\"", "--grammar"}, v, kRows, {}), "end-of-generation token");
    CHECK(grammar_for_run({}, v, kRows, eog) == nullptr);
}

}  // namespace

int main() {
    const Vocab v = make_vocab();
    const std::vector<int32_t> eog = {v.find_token("<|im_end|>"), v.find_token("<|endoftext|>")};
    try {
        test_json_schema(v, eog);
        test_gbnf(v, eog);
        test_errors(v, eog);
    } catch (const Error& e) {
        std::fprintf(stderr, "test_grammar: unexpected error: %s\n", e.what());
        return 1;
    }
    if (g_failures) {
        std::fprintf(stderr, "test_grammar: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("test_grammar: all passed\n");
    return 0;
}
