// Grammar-constrained sampling through llguidance's C ABI, loaded with dlopen (see bonsai/grammar.h
// for the lookup order, the tokenizer handed over and the schema options).
//
// The library is opened once per process and never closed (its thread pool may outlive us). A
// failed load is remembered, so every later use reports the same error.
#include "bonsai/grammar.h"

#include <dlfcn.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "llguidance_abi.h"

namespace bonsai {

namespace {

// major.minor versions whose C ABI layout was checked against these declarations.
constexpr const char* kVerifiedVersions[] = {"1.8.", "1.9."};

struct Library {
    llg::Api api{};
    std::string path;
    std::string version;
    std::string error;  // non-empty: loading failed
};

std::string missing_message(const std::string& flag, const std::string& detail) {
    return flag + " needs the llguidance package (pip install llguidance) or "
           "BONSAI_LLGUIDANCE_LIB=path/to/_lib.abi3.so" + (detail.empty() ? "" : " (" + detail + ")");
}

std::vector<std::string> glob_paths(const std::string& pattern) {
    std::vector<std::string> out;
    glob_t g{};
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    return out;
}

std::string exe_dir() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return "";
    const std::string exe(buf, static_cast<size_t>(n));
    return exe.substr(0, exe.rfind('/'));
}

// <exe dir>/../lib/python3*/site-packages/llguidance/_lib*.so (a venv or pip prefix).
std::string find_next_to_executable() {
    const auto found = glob_paths(exe_dir() + "/../lib/python3*/site-packages/llguidance/_lib*.so");
    return found.empty() ? "" : found.front();
}

// The one line `python -c code` prints ("" on failure or when it prints more than one line).
std::string python_line(const std::string& python, const std::string& code) {
    FILE* p = popen((python + " -c '" + code + "' 2>/dev/null").c_str(), "r");
    if (p == nullptr) return "";
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out.find('\n') == std::string::npos ? out : "";
}

// The Pythons to ask, in order: the one beside the executable (a venv), the active virtual
// environment's ($VIRTUAL_ENV: a wrapper such as a pyenv shim may have put another Python first on
// PATH), then python3 on PATH.
std::vector<std::string> pythons() {
    std::vector<std::string> out;
    std::vector<std::string> candidates = {exe_dir() + "/python3"};
    const char* venv = std::getenv("VIRTUAL_ENV");
    if (venv != nullptr && *venv != '\0') candidates.push_back(std::string(venv) + "/bin/python3");
    for (const std::string& py : candidates)
        if (access(py.c_str(), X_OK) == 0) out.push_back("\"" + py + "\"");
    out.emplace_back("python3");
    return out;
}

// The library in the package directory that python3 reports (pyenv, system site-packages).
std::string find_with_python() {
    for (const std::string& py : pythons()) {
        const std::string dir =
            python_line(py, "import llguidance, os; print(os.path.dirname(os.path.abspath(llguidance.__file__)))");
        const auto found = dir.empty() ? std::vector<std::string>{} : glob_paths(dir + "/_lib*.so");
        if (!found.empty()) return found.front();
    }
    return "";
}

// The package's library is a Python extension module as well: it refers to libpython's symbols
// (never called through the C ABI), which must be resolvable when it is loaded into a process that
// is not Python. So on an "undefined symbol" failure, Python's shared library is loaded (globally,
// never initialized) and the load is retried.
void* open_library(const std::string& path, std::string& error) {
    void* h = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (h != nullptr) return h;
    const char* why = dlerror();
    error = "cannot load " + path + ": " + (why ? why : "dlopen failed");
    if (error.find("undefined symbol: Py") == std::string::npos) return nullptr;
    for (const std::string& py : pythons()) {
        const std::string libpython = python_line(
            py, "import sysconfig as s, os; print(os.path.join(s.get_config_var(\"LIBDIR\") or \"\", "
                "s.get_config_var(\"LDLIBRARY\") or \"\"))");
        if (libpython.size() < 3 || libpython.compare(libpython.size() - 3, 3, ".so") != 0) continue;
        if (dlopen(libpython.c_str(), RTLD_LAZY | RTLD_GLOBAL) == nullptr) continue;
        h = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
        if (h != nullptr) {
            error.clear();
            return h;
        }
    }
    error += "; it needs Python's shared library (libpython3.*.so), which no python3 here provides";
    return nullptr;
}

template <typename F>
bool bind(void* h, const char* name, F& dst, std::string& missing) {
    dst = reinterpret_cast<F>(dlsym(h, name));
    if (dst == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
    return dst != nullptr;
}

Library load_library() {
    Library lib;
    const char* env = std::getenv("BONSAI_LLGUIDANCE_LIB");
    if (env != nullptr && *env != '\0') {
        lib.path = env;
    } else {
        lib.path = find_next_to_executable();
        if (lib.path.empty()) lib.path = find_with_python();
        if (lib.path.empty()) {
            lib.error = "not found next to the executable nor by python3";
            return lib;
        }
    }
    void* h = open_library(lib.path, lib.error);
    if (h == nullptr) return lib;
    llg::Api& a = lib.api;
    std::string missing;
    bind(h, "llg_get_version", a.get_version, missing);
    bind(h, "llg_constraint_init_set_defaults", a.constraint_init_set_defaults, missing);
    bind(h, "llg_new_tokenizer_v2", a.new_tokenizer_v2, missing);
    bind(h, "llg_free_tokenizer", a.free_tokenizer, missing);
    bind(h, "llg_new_matcher", a.new_matcher, missing);
    bind(h, "llg_matcher_get_error", a.matcher_get_error, missing);
    bind(h, "llg_matcher_is_error", a.matcher_is_error, missing);
    bind(h, "llg_matcher_compute_mask_into", a.matcher_compute_mask_into, missing);
    bind(h, "llg_matcher_get_mask_byte_size", a.matcher_get_mask_byte_size, missing);
    bind(h, "llg_matcher_consume_token", a.matcher_consume_token, missing);
    bind(h, "llg_matcher_is_accepting", a.matcher_is_accepting, missing);
    bind(h, "llg_matcher_is_stopped", a.matcher_is_stopped, missing);
    bind(h, "llg_matcher_reset", a.matcher_reset, missing);
    bind(h, "llg_clone_matcher", a.clone_matcher, missing);
    bind(h, "llg_free_matcher", a.free_matcher, missing);
    if (!missing.empty()) {
        lib.error = lib.path + " lacks " + missing + "; it is not llguidance's library (pip install -U llguidance)";
        return lib;
    }
    const char* v = a.get_version();
    lib.version = v ? v : "";  // "llguidance@1.9.1 derivre@..."
    const size_t at = lib.version.find("llguidance@");
    const std::string num = at == std::string::npos ? "" : lib.version.substr(at + 11);
    bool ok = false;
    for (const char* prefix : kVerifiedVersions) ok = ok || num.rfind(prefix, 0) == 0;
    if (!ok) {
        lib.error = lib.path + " is llguidance '" + lib.version + "'; bonsai_run supports llguidance 1.8 and 1.9 "
                    "(pip install 'llguidance>=1.8,<1.10')";
    }
    return lib;
}

const Library& library(const std::string& flag) {
    static std::once_flag once;
    static Library lib;
    std::call_once(once, [] { lib = load_library(); });
    if (!lib.error.empty()) throw Error(missing_message(flag, lib.error));
    return lib;
}

// The first line of a (possibly multi-line) llguidance message.
std::string first_line(const char* msg) {
    std::string s = msg ? msg : "unknown error";
    const size_t nl = s.find('\n');
    if (nl != std::string::npos) s.resize(nl);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
    return s;
}

size_t tokenize_callback(const void* user, const uint8_t* bytes, size_t n, uint32_t* out, size_t out_len) {
    try {
        const Vocab& v = *static_cast<const Vocab*>(user);
        const std::vector<int32_t> ids =
            v.tokenize(std::string_view(reinterpret_cast<const char*>(bytes), n), false, false);
        for (size_t i = 0; i < ids.size() && i < out_len; ++i) out[i] = static_cast<uint32_t>(ids[i]);
        return ids.size();
    } catch (...) {
        return 0;  // never unwind into the library; the matcher then sees no tokens
    }
}

}  // namespace

// The llguidance tokenizer of one vocabulary and the constraint settings that use it.
class GrammarVocab {
public:
    GrammarVocab(const llg::Api& api, const Vocab& vocab, int64_t n_vocab, const std::vector<int32_t>& eog,
                 const std::string& flag)
        : api_(api), vocab_(vocab) {
        if (eog.empty()) throw Error(flag + " needs the model's end-of-generation token, and its vocabulary has none");
        std::vector<uint32_t> lens(static_cast<size_t>(n_vocab));
        std::string bytes;
        for (int64_t i = 0; i < n_vocab; ++i) {
            std::string piece;
            if (i < vocab.n_vocab()) {
                const int32_t id = static_cast<int32_t>(i);
                const TokenType t = vocab.token_type(id);
                const std::string& text = vocab.token_text(id);
                const bool special = t == TOKEN_TYPE_CONTROL || (t == TOKEN_TYPE_USER_DEFINED && text.size() >= 2 &&
                                                                 text.front() == '<' && text.back() == '>');
                piece = special ? "\xFF" + text : vocab.token_to_piece(id);
            }
            lens[static_cast<size_t>(i)] = static_cast<uint32_t>(piece.size());
            bytes += piece;
        }
        std::vector<uint32_t> extra(eog.begin() + 1, eog.end());
        llg::TokenizerInitV2 init{};
        init.struct_size = sizeof init;
        init.vocab_size = static_cast<uint32_t>(n_vocab);
        init.tok_eos = static_cast<uint32_t>(eog[0]);
        init.token_lens = lens.data();
        init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
        // llguidance tokenizes forced text (e.g. the '{' a schema starts with) to pick the tokens it
        // allows. A SentencePiece vocabulary with add_space_prefix would put its U+2581 before every
        // such fragment, so there llguidance's own greedy tokenization over the token bytes is used.
        if (vocab.type() == VocabType::SPM && vocab.add_space_prefix()) {
            init.use_approximate_greedy_tokenize_fn = true;
        } else {
            init.tokenize_fn = tokenize_callback;
            init.tokenize_user_data = &vocab_;
        }
        init.tok_eos_extra = extra.empty() ? nullptr : extra.data();
        init.tok_eos_extra_count = static_cast<uint32_t>(extra.size());
        char err[1024] = {0};
        tok_ = api_.new_tokenizer_v2(&init, err, sizeof err);
        if (tok_ == nullptr) throw Error(flag + ": llguidance refused the vocabulary: " + first_line(err));
        init_.assign((sizeof(llg::ConstraintInit) + llg::kConstraintInitSpare) / 8 + 1, 0);
        api_.constraint_init_set_defaults(constraint_init(), tok_);
        try {
            check_constraint_init_layout(flag);
        } catch (...) {
            api_.free_tokenizer(tok_);  // the destructor does not run for a throwing constructor
            throw;
        }
        constraint_init()->log_buffer_level = 0;
        constraint_init()->log_stderr_level = 0;  // errors come back through llg_matcher_get_error
    }
    ~GrammarVocab() { api_.free_tokenizer(tok_); }
    GrammarVocab(const GrammarVocab&) = delete;
    GrammarVocab& operator=(const GrammarVocab&) = delete;

    llg::ConstraintInit* constraint_init() const { return reinterpret_cast<llg::ConstraintInit*>(init_.data()); }
    const llg::Api& api() const { return api_; }

private:
    // The defaults the library wrote must sit where our declaration puts them, with nothing written
    // past it: otherwise the library's struct differs from ours and using it would corrupt memory.
    void check_constraint_init_layout(const std::string& flag) const {
        const llg::ConstraintInit& c = *constraint_init();
        const llg::ParserLimits& l = c.limits;
        bool ok = c.tokenizer == tok_ && c.log_buffer_level <= 2 && c.log_stderr_level <= 2 && !c.ff_tokens_ok &&
                  !c.backtrack_ok && l.max_items_in_row > 0 && l.initial_lexer_fuel > 0 && l.step_lexer_fuel > 0 &&
                  l.step_max_items > 0 && l.max_lexer_states > 0 && l.max_grammar_size > 0 && l.verbose_errors;
        const auto* tail = reinterpret_cast<const unsigned char*>(init_.data()) + sizeof(llg::ConstraintInit);
        for (size_t i = 0; i < llg::kConstraintInitSpare; ++i) ok = ok && tail[i] == 0;
        if (!ok) {
            throw Error(flag + ": the llguidance library's LlgConstraintInit does not match the layout bonsai_run "
                        "was built for (pip install 'llguidance>=1.8,<1.10')");
        }
    }

    const llg::Api& api_;
    Vocab vocab_;
    llg::Tokenizer* tok_ = nullptr;
    mutable std::vector<uint64_t> init_;  // ConstraintInit plus spare room, 8-byte aligned
};

namespace {

// The schema with our compile options, {..., "x-guidance": {"whitespace_flexible": false}}, added
// before the closing brace, so llguidance's positions in error messages stay the user's. When the
// schema has its own "x-guidance", ours goes first instead: llguidance keeps the later of two equal
// keys, so the schema's options win, as the Python side applies defaults, then the schema's own.
// Text that does not end in '}' is passed unchanged, for llguidance to say what is wrong with it.
std::string schema_with_options(const std::string& text, const std::string& flag) {
    const std::string opts = "\"x-guidance\":{\"whitespace_flexible\":false}";
    const char* ws = " \t\r\n";
    const size_t b = text.find_first_not_of(ws);
    if (b == std::string::npos)
        throw Error(flag + ": the JSON schema is empty; give an object such as {\"type\": \"object\"}");
    const size_t e = text.find_last_not_of(ws);
    if (text.compare(b, e + 1 - b, "true") == 0) return "{" + opts + "}";
    if (text[b] != '{') {
        throw Error(flag + ": a JSON schema must be an object such as {\"type\": \"object\"} (or true), not '" +
                    text.substr(b, 20) + "'");
    }
    if (text[e] != '}' || e == b) return text;
    if (text.find("\"x-guidance\"") != std::string::npos)
        return text.substr(0, b + 1) + opts + "," + text.substr(b + 1);
    const bool empty = text.find_first_not_of(ws, b + 1) == e;
    return text.substr(0, e) + (empty ? "" : ",") + opts + text.substr(e);
}

}  // namespace

Grammar::Grammar(const GrammarSource& src, const Vocab& vocab, int64_t n_vocab, const std::vector<int32_t>& eog_ids)
    : src_(src), n_vocab_(n_vocab) {
    if (src.kind == GrammarSource::Kind::JSON_SCHEMA) {
        json_ = schema_with_options(src.text, src.flag);
    } else {
        if (src.text.find_first_not_of(" \t\r\n") == std::string::npos)
            throw Error(src.flag + ": the grammar is empty; give GBNF rules (root ::= ...) or Lark (start: ...)");
        try {
            lark_ = is_gbnf(src.text) ? gbnf_to_lark(src.text) : src.text;
        } catch (const Error& e) {
            throw Error(src.flag + ": the GBNF grammar does not parse: " + e.what());
        }
    }
    const Library& lib = library(src.flag);
    vocab_ = std::make_unique<GrammarVocab>(lib.api, vocab, n_vocab, eog_ids, src.flag);
    // compiled once, here, so errors surface before generation; sequences get clones of it
    const llg::Api& api = vocab_->api();
    const bool json = src_.kind == GrammarSource::Kind::JSON_SCHEMA;
    proto_ = api.new_matcher(vocab_->constraint_init(), json ? "json" : "lark", json ? json_.c_str() : lark_.c_str());
    if (proto_ == nullptr) throw Error(src_.flag + ": llguidance returned no matcher");
    if (api.matcher_is_error(proto_)) {
        const std::string msg = first_line(api.matcher_get_error(proto_));
        api.free_matcher(proto_);
        throw Error(src_.flag + ": the " + (json ? "JSON schema" : "grammar") + " does not compile: " + msg);
    }
}

Grammar::~Grammar() { vocab_->api().free_matcher(proto_); }

llg::Matcher* Grammar::new_matcher() const {
    llg::Matcher* m = vocab_->api().clone_matcher(proto_);
    if (m == nullptr) throw Error(src_.flag + ": llguidance could not copy the compiled grammar");
    return m;
}

std::unique_ptr<Grammar> grammar_for_run(const GrammarSource& src, const Vocab& vocab, int64_t n_vocab,
                                         const std::vector<int32_t>& eog_ids) {
    if (src.kind == GrammarSource::Kind::NONE) return nullptr;
    return std::make_unique<Grammar>(src, vocab, n_vocab, eog_ids);
}

GrammarMatcher::GrammarMatcher(const Grammar& g) : g_(g), m_(g.new_matcher()), n_vocab_(g.n_vocab()) {
    mask_.resize(g_.vocab_->api().matcher_get_mask_byte_size(m_) / 4);
    if (mask_.size() * 32 < static_cast<size_t>(n_vocab_)) {
        g_.vocab_->api().free_matcher(m_);
        throw Error(g_.flag() + ": llguidance's mask is shorter than the vocabulary");
    }
}

GrammarMatcher::~GrammarMatcher() { g_.vocab_->api().free_matcher(m_); }

void GrammarMatcher::fail(const std::string& what) const {
    const llg::Api& api = g_.vocab_->api();
    throw Error(g_.flag() + ": " + what + ": " + first_line(api.matcher_get_error(m_)));
}

void GrammarMatcher::apply(float* logits) {
    const llg::Api& api = g_.vocab_->api();
    if (api.matcher_compute_mask_into(m_, mask_.data(), mask_.size() * 4) != 0) fail("computing the token mask failed");
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (size_t w = 0; w < mask_.size(); ++w) {
        const uint32_t bits = mask_[w];
        if (bits == 0xFFFFFFFFu) continue;
        const size_t end = std::min<size_t>(w * 32 + 32, static_cast<size_t>(n_vocab_));
        for (size_t i = w * 32; i < end; ++i)
            if (!((bits >> (i - w * 32)) & 1u)) logits[i] = kNegInf;
    }
}

void GrammarMatcher::accept(int32_t token) {
    if (g_.vocab_->api().matcher_consume_token(m_, static_cast<uint32_t>(token)) != 0)
        fail("token " + std::to_string(token) + " does not fit");
}

bool GrammarMatcher::is_stopped() const { return g_.vocab_->api().matcher_is_stopped(m_); }

bool GrammarMatcher::is_accepting() const { return g_.vocab_->api().matcher_is_accepting(m_); }

void GrammarMatcher::reset() {
    if (g_.vocab_->api().matcher_reset(m_) != 0) fail("resetting the grammar failed");
}

}  // namespace bonsai
