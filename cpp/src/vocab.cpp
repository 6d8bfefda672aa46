// bonsai::Vocab: validation and indexing of the tokenizer metadata, the special-token partition
// shared by both tokenizer models, BOS/EOS rules and detokenization.
//
// Special tokens (control, user-defined and unknown types) are matched in the raw text before the
// tokenizer model runs, longest text first: each one splits every remaining text fragment at its
// occurrences. Control and unknown tokens take part only with parse_special; user-defined ones
// always do (as llama.cpp and Hugging Face tokenizers treat added tokens).
#include "bonsai/vocab.h"

#include <algorithm>
#include <cstdio>

#include "bonsai/error.h"
#include "bonsai/unicode.h"
#include "vocab_state.h"

namespace bonsai {

namespace {

const char* const kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

std::string supported_pre_names() {
    return "\"default\", \"gpt-2\", \"llama-bpe\" (also \"llama3\", \"llama-v3\"), \"qwen2\", \"qwen35\"";
}

PreTokenizer parse_pre(const std::string& pre) {
    if (pre.empty() || pre == "default") return PreTokenizer::DEFAULT;
    if (pre == "gpt-2" || pre == "gpt2") return PreTokenizer::GPT2;
    if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return PreTokenizer::LLAMA3;
    if (pre == "qwen2") return PreTokenizer::QWEN2;
    if (pre == "qwen35") return PreTokenizer::QWEN35;
    throw Error("tokenizer.ggml.pre = \"" + pre + "\" is not a supported pre-tokenizer (supported: " +
                supported_pre_names() + "). Convert the model with one of them.");
}

void check_id(const VocabState& st, int32_t id, const char* key) {
    if (id < -1 || id >= static_cast<int32_t>(st.tokens.size())) {
        throw Error(std::string(key) + " = " + std::to_string(id) + " is out of range for a vocabulary of " +
                    std::to_string(st.tokens.size()) + " tokens. Fix the GGUF metadata.");
    }
}

// SPM piece of a token: U+2581 -> ' ', <0xNN> -> the byte.
std::string spm_piece(const std::string& text, TokenType type) {
    if (type == TOKEN_TYPE_BYTE) {
        unsigned v = 0;
        if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>' &&
            std::sscanf(text.c_str() + 3, "%2x", &v) == 1) {
            return std::string(1, static_cast<char>(v));
        }
        return text;
    }
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        if (text.compare(i, 3, kSpmSpace) == 0) {
            out += ' ';
            i += 3;
        } else {
            out += text[i++];
        }
    }
    return out;
}

bool special_type(TokenType t) {
    return t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED || t == TOKEN_TYPE_UNKNOWN;
}

struct Fragment {
    int32_t token;  // >= 0: a matched special token; -1: raw text
    size_t offset;
    size_t len;
};

std::vector<Fragment> partition_specials(const VocabState& st, std::string_view text, bool parse_special) {
    std::vector<Fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({-1, 0, text.size()});
    bool present[256] = {};  // bytes of the text: a token whose first byte is absent cannot occur
    for (unsigned char c : text) present[c] = true;
    std::vector<Fragment> next;
    for (int32_t id : st.special_ids) {
        const TokenType t = st.types[id];
        if (!parse_special && t != TOKEN_TYPE_USER_DEFINED) continue;
        const std::string& s = st.tokens[id];
        if (!present[static_cast<unsigned char>(s[0])] || s.size() > text.size()) continue;
        next.clear();
        for (const Fragment& f : frags) {
            if (f.token >= 0) {
                next.push_back(f);
                continue;
            }
            size_t pos = f.offset;
            const size_t end = f.offset + f.len;
            while (true) {
                const size_t hit = text.substr(0, end).find(s, pos);
                if (hit == std::string_view::npos) break;
                if (hit > pos) next.push_back({-1, pos, hit - pos});
                next.push_back({id, hit, s.size()});
                pos = hit + s.size();
            }
            if (pos < end) next.push_back({-1, pos, end - pos});
        }
        frags.swap(next);
    }
    return frags;
}

// Texts of control tokens that end a turn in common chat formats, and the fill-in-the-middle
// padding / repository / file separators that end a code completion (the ones llama.cpp also
// treats as end of generation for the llama / qwen2 / qwen3 families).
const char* const kEogTexts[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                                 "<|end_of_text|>", "<end_of_turn>", "<EOT>", "<|fim_pad|>",
                                 "<|repo_name|>", "<|fim_repo|>", "<|file_sep|>"};

void collect_eog_ids(VocabState& st) {
    for (int32_t id : {st.eos, st.eot, st.eom}) {
        if (id >= 0) st.eog_ids.push_back(id);
    }
    for (const char* text : kEogTexts) {
        const int32_t id = st.find(text);
        if (id >= 0 && st.types[id] == TOKEN_TYPE_CONTROL) st.eog_ids.push_back(id);
    }
    std::sort(st.eog_ids.begin(), st.eog_ids.end());
    st.eog_ids.erase(std::unique(st.eog_ids.begin(), st.eog_ids.end()), st.eog_ids.end());
}

}  // namespace

Vocab::Vocab(VocabData d) {
    auto st = std::make_shared<VocabState>();
    if (d.model == "llama") {
        st->type = VocabType::SPM;
    } else if (d.model == "gpt2") {
        st->type = VocabType::BPE;
        st->pre = parse_pre(d.pre);
        st->pre_name = d.pre.empty() ? "default" : d.pre;
    } else {
        throw Error("tokenizer.ggml.model = \"" + d.model + "\" is not a supported tokenizer (supported: " +
                    "\"llama\" = SentencePiece, \"gpt2\" = byte-level BPE).");
    }
    st->model_name = d.model;
    const size_t n = d.tokens.size();
    if (n == 0) throw Error("tokenizer.ggml.tokens is empty: the file has no vocabulary.");
    if (n > 0x7FFFFFFF) throw Error("tokenizer.ggml.tokens has too many entries.");
    if (st->type == VocabType::SPM && d.scores.empty()) {
        throw Error("tokenizer.ggml.scores is missing: a SentencePiece vocabulary needs a score per token.");
    }
    if (!d.scores.empty() && d.scores.size() != n) {
        throw Error("tokenizer.ggml.scores has " + std::to_string(d.scores.size()) + " entries but "
                    "tokenizer.ggml.tokens has " + std::to_string(n) + "; the arrays must have the same length.");
    }
    if (!d.types.empty() && d.types.size() != n) {
        throw Error("tokenizer.ggml.token_type has " + std::to_string(d.types.size()) + " entries but "
                    "tokenizer.ggml.tokens has " + std::to_string(n) + "; the arrays must have the same length.");
    }
    if (st->type == VocabType::BPE && d.merges.empty()) {
        throw Error("tokenizer.ggml.merges is missing or empty: a byte-level BPE (gpt2) vocabulary needs its merges.");
    }

    st->tokens = std::move(d.tokens);
    st->scores = d.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(d.scores);
    st->types.resize(n, TOKEN_TYPE_NORMAL);
    for (size_t i = 0; i < d.types.size(); ++i) {
        if (d.types[i] < TOKEN_TYPE_UNDEFINED || d.types[i] > TOKEN_TYPE_BYTE) {
            throw Error("tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(d.types[i]) +
                        " is not a token type (0..6).");
        }
        st->types[i] = d.types[i] == TOKEN_TYPE_UNDEFINED ? TOKEN_TYPE_NORMAL : static_cast<TokenType>(d.types[i]);
    }
    st->token_to_id.reserve(n);
    for (size_t i = 0; i < n; ++i) st->token_to_id.emplace(st->tokens[i], static_cast<int32_t>(i));

    st->bos = d.bos_id;
    st->eos = d.eos_id;
    st->unk = d.unk_id;
    st->pad = d.pad_id;
    check_id(*st, st->bos, "tokenizer.ggml.bos_token_id");
    check_id(*st, st->eos, "tokenizer.ggml.eos_token_id");
    check_id(*st, st->unk, "tokenizer.ggml.unknown_token_id");
    check_id(*st, st->pad, "tokenizer.ggml.padding_token_id");
    st->eot = d.eot_id;
    st->eom = d.eom_id;
    check_id(*st, st->eot, "tokenizer.ggml.eot_token_id");
    check_id(*st, st->eom, "tokenizer.ggml.eom_token_id");
    const bool spm = st->type == VocabType::SPM;
    st->add_bos = d.add_bos.value_or(spm || st->pre == PreTokenizer::LLAMA3);
    st->add_eos = d.add_eos.value_or(false);
    st->add_space_prefix = spm && d.add_space_prefix.value_or(true);
    st->ignore_merges = st->pre == PreTokenizer::LLAMA3;
    if (st->add_bos && st->bos < 0) {
        throw Error("the vocabulary asks for a BOS token (tokenizer.ggml.add_bos_token) but "
                    "tokenizer.ggml.bos_token_id is missing; add it or set add_bos_token = false.");
    }
    if (st->add_eos && st->eos < 0) {
        throw Error("the vocabulary asks for an EOS token (tokenizer.ggml.add_eos_token) but "
                    "tokenizer.ggml.eos_token_id is missing; add it or set add_eos_token = false.");
    }

    st->pieces.resize(n);
    st->byte_tokens.fill(-1);
    st->byte_char_tokens.fill(-1);
    for (size_t i = 0; i < n; ++i) {
        const TokenType t = st->types[i];
        if (t == TOKEN_TYPE_USER_DEFINED) st->pieces[i] = spm ? spm_piece(st->tokens[i], t) : st->tokens[i];
        else if (spm && (t == TOKEN_TYPE_NORMAL || t == TOKEN_TYPE_BYTE)) st->pieces[i] = spm_piece(st->tokens[i], t);
        if (spm && t == TOKEN_TYPE_BYTE && st->pieces[i].size() == 1) {
            st->byte_tokens[static_cast<unsigned char>(st->pieces[i][0])] = static_cast<int32_t>(i);
        }
        if (special_type(t) && !st->tokens[i].empty()) st->special_ids.push_back(static_cast<int32_t>(i));
    }
    std::stable_sort(st->special_ids.begin(), st->special_ids.end(), [&](int32_t a, int32_t b) {
        return st->tokens[a].size() > st->tokens[b].size();
    });
    if (!spm) build_bpe_tables(*st, d.merges);
    collect_eog_ids(*st);
    state_ = std::move(st);
}

std::vector<int32_t> Vocab::tokenize(std::string_view text, bool add_special, bool parse_special) const {
    const VocabState& st = *state_;
    std::vector<int32_t> out;
    if (add_special && st.add_bos) out.push_back(st.bos);
    bool prev_special = true;  // SPM: a space is prefixed to text at the start or after a special
    std::string buf;
    for (const Fragment& f : partition_specials(st, text, parse_special)) {
        if (f.token >= 0) {
            out.push_back(f.token);
            prev_special = true;
            continue;
        }
        const std::string_view raw = text.substr(f.offset, f.len);
        if (st.type == VocabType::BPE) {
            tokenize_bpe(st, raw, out);
            continue;
        }
        buf.clear();
        if (st.add_space_prefix && prev_special) buf += kSpmSpace;
        for (char c : raw) {
            if (c == ' ') buf += kSpmSpace;
            else buf += c;
        }
        tokenize_spm(st, buf, out);
        prev_special = false;
    }
    if (add_special && st.add_eos) out.push_back(st.eos);
    return out;
}

std::string Vocab::token_to_piece(int32_t id, bool render_special) const {
    const VocabState& st = *state_;
    if (id < 0 || id >= n_vocab()) {
        throw Error("token id " + std::to_string(id) + " is out of range (the vocabulary has " +
                    std::to_string(n_vocab()) + " tokens).");
    }
    const TokenType t = st.types[id];
    if (t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_UNKNOWN || t == TOKEN_TYPE_UNUSED) {
        return render_special ? st.tokens[id] : std::string();
    }
    return st.pieces[id];
}

std::string Vocab::detokenize(const std::vector<int32_t>& ids, bool render_special) const {
    const VocabState& st = *state_;
    std::string out;
    bool prev_special = true;
    for (int32_t id : ids) {
        std::string piece = token_to_piece(id, render_special);
        const TokenType t = st.types[id];
        if (special_type(t)) {
            prev_special = true;
        } else {
            // Undo the space tokenize() put in front of text that starts the input or follows a special.
            if (st.add_space_prefix && prev_special && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
            prev_special = false;
        }
        out += piece;
    }
    return out;
}

int32_t Vocab::n_vocab() const { return static_cast<int32_t>(state_->tokens.size()); }
VocabType Vocab::type() const { return state_->type; }
PreTokenizer Vocab::pre_tokenizer() const { return state_->pre; }
const std::string& Vocab::model_name() const { return state_->model_name; }
const std::string& Vocab::pre_name() const { return state_->pre_name; }
int32_t Vocab::bos() const { return state_->bos; }
int32_t Vocab::eos() const { return state_->eos; }
int32_t Vocab::unk() const { return state_->unk; }
int32_t Vocab::pad() const { return state_->pad; }
bool Vocab::add_bos() const { return state_->add_bos; }
bool Vocab::add_eos() const { return state_->add_eos; }
bool Vocab::add_space_prefix() const { return state_->add_space_prefix; }

TokenType Vocab::token_type(int32_t id) const {
    token_to_piece(id);  // range check
    return state_->types[id];
}
const std::string& Vocab::token_text(int32_t id) const {
    token_to_piece(id);
    return state_->tokens[id];
}
float Vocab::token_score(int32_t id) const {
    token_to_piece(id);
    return state_->scores[id];
}
int32_t Vocab::find_token(std::string_view text) const { return state_->find(text); }
bool Vocab::is_control(int32_t id) const {
    const TokenType t = token_type(id);
    return t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_UNKNOWN;
}

bool Vocab::is_eog(int32_t id) const {
    return std::binary_search(state_->eog_ids.begin(), state_->eog_ids.end(), id);
}
const std::vector<int32_t>& Vocab::eog_ids() const { return state_->eog_ids; }

void Vocab::check_compatible(int64_t n_vocab_model) const {
    if (n_vocab_model != n_vocab()) {
        throw Error("the tokenizer has " + std::to_string(n_vocab()) + " tokens but the model's token "
                    "embedding has " + std::to_string(n_vocab_model) + " rows; use the tokenizer the model "
                    "was trained with.");
    }
}

void Vocab::check_replaces(const Vocab& embedded, int64_t n_vocab_model) const {
    check_compatible(n_vocab_model);
    auto same = [&](int32_t mine, int32_t theirs, const char* what) {
        if (mine != theirs) {
            throw Error(std::string("the tokenizer's ") + what + " id is " + std::to_string(mine) +
                        " but the model file's is " + std::to_string(theirs) +
                        "; this tokenizer does not belong to the model.");
        }
    };
    same(bos(), embedded.bos(), "BOS");
    same(eos(), embedded.eos(), "EOS");
    if (unk() >= 0 && embedded.unk() >= 0) same(unk(), embedded.unk(), "UNK");
}

std::string TokenStreamDecoder::push(int32_t id) {
    pending_ += vocab_.token_to_piece(id, render_special_);
    const size_t hold = unicode::utf8_incomplete_tail(pending_);
    std::string ready = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return ready;
}

std::string TokenStreamDecoder::flush() {
    std::string rest;
    rest.swap(pending_);
    return rest;
}

}  // namespace bonsai
