// Grammar-constrained sampling for bonsai_run (--grammar, --grammar-file, --json-schema,
// --json-schema-file), with llguidance computing the token masks.
//
// llguidance is not linked: its shared library (the `llguidance` Python package ships it as
// llguidance/_lib.abi3.so, which exports the C ABI) is loaded with dlopen on first use, found at
//   1. $BONSAI_LLGUIDANCE_LIB (a path to the library),
//   2. <dir of the executable>/../lib/python3*/site-packages/llguidance/_lib.abi3.so (a venv or
//      pip prefix, where pip installs bonsai_run),
//   3. the path `python3 -c 'import llguidance'` reports (pyenv / system installs).
// Its version is checked against the ones whose C ABI layout we verified (1.8, 1.9). That file
// is a Python extension module too, with references to libpython's symbols (never called
// through the C ABI), so Python's shared library is loaded beside it when they do not resolve.
//
// Grammar texts: a GBNF grammar (llama.cpp's format; any `name ::= ...` rule makes the text
// GBNF) is translated to llguidance's Lark by gbnf_to_lark; anything else is taken as Lark as
// llguidance reads it (`start: ...`). JSON schemas compile as the Python server compiles them
// (bonsai_runner/constrained.py): no whitespace between JSON tokens ({"a":1,"b":[2]}).
//
// The tokenizer handed to llguidance: every token's bytes (Vocab::token_to_piece), with control
// tokens and <...>-named user-defined tokens as 0xFF + their text, so no text produces them (as
// the Python ConstraintVocabulary does); the end-of-generation ids as its EOS tokens; tokenization
// by our own Vocab::tokenize (no special tokens parsed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bonsai/sampling.h"
#include "bonsai/vocab.h"

namespace bonsai {

namespace llg {
struct Matcher;
}

// What the user gave: which flag, and the grammar or schema text (files already read).
struct GrammarSource {
    enum class Kind { NONE, GRAMMAR, JSON_SCHEMA };
    Kind kind = Kind::NONE;
    std::string text;
    std::string flag;  // "--grammar", "--grammar-file FILE", "-j/--json-schema", ... (for errors)
};

// True when the text has a GBNF rule (a line `name ::= ...`, after leading blanks).
bool is_gbnf(const std::string& text);
// llama.cpp GBNF -> llguidance Lark. Rules whose bodies use only literals, character classes and
// other such rules become Lark terminals (one lexeme, as llguidance's own converter does); `root`
// becomes `start`. Throws bonsai::Error "line L, column C: <problem>" on bad input.
std::string gbnf_to_lark(const std::string& gbnf);

class GrammarVocab;  // the llguidance tokenizer of one vocabulary (grammar.cpp)

// A compiled grammar bound to one vocabulary; makes matchers (one per sequence).
class Grammar {
public:
    // Compiles the source for a logits row of n_vocab entries (>= vocab.n_vocab(); the rows past
    // the vocabulary are never allowed) with `eog_ids` as the end-of-generation tokens. Throws
    // bonsai::Error: library not found / unsupported version, or "<flag>: <llguidance's message>".
    Grammar(const GrammarSource& src, const Vocab& vocab, int64_t n_vocab, const std::vector<int32_t>& eog_ids);
    ~Grammar();
    Grammar(const Grammar&) = delete;
    Grammar& operator=(const Grammar&) = delete;

    const std::string& flag() const { return src_.flag; }
    int64_t n_vocab() const { return n_vocab_; }

private:
    friend class GrammarMatcher;
    llg::Matcher* new_matcher() const;

    GrammarSource src_;
    std::string lark_;  // the grammar as Lark (GRAMMAR)
    std::string json_;  // the schema with our compile options (JSON_SCHEMA)
    int64_t n_vocab_ = 0;
    std::unique_ptr<GrammarVocab> vocab_;
    llg::Matcher* proto_ = nullptr;  // the compiled grammar at its start; matchers are clones
};

// One sequence's position in the grammar.
class GrammarMatcher : public TokenConstraint {
public:
    explicit GrammarMatcher(const Grammar& g);
    ~GrammarMatcher() override;
    GrammarMatcher(const GrammarMatcher&) = delete;
    GrammarMatcher& operator=(const GrammarMatcher&) = delete;

    // Sets every logit the grammar forbids next to -inf (n_vocab entries). End-of-generation
    // tokens stay allowed only where the grammar may end. Throws on a matcher error.
    void apply(float* logits) override;
    // Advances by a sampled token; throws "<flag>: token N does not fit: <llguidance's message>"
    // when the grammar forbids it (the matcher is then in an error state for good).
    void accept(int32_t token);
    // True when the grammar admits no further token (only end-of-generation remains).
    bool is_stopped() const;
    // True when the text so far is a complete match (end-of-generation is allowed now).
    bool is_accepting() const;
    // Back to the start of the grammar (the next chat reply); not after an error.
    void reset();

private:
    [[noreturn]] void fail(const std::string& what) const;

    const Grammar& g_;
    llg::Matcher* m_ = nullptr;
    std::vector<uint32_t> mask_;
    int64_t n_vocab_ = 0;
};

// The compiled grammar of the run's --grammar/--json-schema flags, or nullptr without one.
std::unique_ptr<Grammar> grammar_for_run(const GrammarSource& src, const Vocab& vocab, int64_t n_vocab,
                                         const std::vector<int32_t>& eog_ids);

}  // namespace bonsai
