// Internal state of a bonsai::Vocab: the token table and the lookup structures the SentencePiece
// and byte-level BPE tokenizers use. Built once by Vocab's constructor (vocab.cpp), then shared
// read-only. token_to_id's keys are views into `tokens`, so the state is never moved or resized
// after construction.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bonsai/vocab.h"

namespace bonsai {

struct BpeMerge {
    int32_t rank;    // index in tokenizer.ggml.merges: lower merges first
    int32_t result;  // id of the merged token
};

struct VocabState {
    VocabType type = VocabType::SPM;
    PreTokenizer pre = PreTokenizer::NONE;
    std::string model_name;
    std::string pre_name;

    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<TokenType> types;
    std::vector<std::string> pieces;  // token_to_piece bytes of each token (specials: "")
    std::unordered_map<std::string_view, int32_t> token_to_id;  // first id of each text

    int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;
    std::vector<int32_t> eog_ids;  // end-of-generation ids, sorted
    bool add_bos = false, add_eos = false, add_space_prefix = false;
    bool ignore_merges = false;  // llama-bpe: a pre-token that is itself a token is not merged

    std::vector<int32_t> special_ids;  // control, user-defined, unknown: longest text first

    std::array<int32_t, 256> byte_tokens;       // SPM: id of <0xNN>, -1 if absent
    std::array<int32_t, 256> byte_char_tokens;  // BPE: id of the byte alphabet char, -1 if absent
    std::unordered_map<uint64_t, BpeMerge> merges;  // (left id << 32 | right id) -> merge

    int32_t find(std::string_view text) const {
        auto it = token_to_id.find(text);
        return it == token_to_id.end() ? -1 : it->second;
    }
};

// Appends the ids of a SentencePiece text fragment whose spaces are already U+2581.
void tokenize_spm(const VocabState& st, std::string_view escaped, std::vector<int32_t>& out);

// Appends the ids of a byte-level BPE text fragment (pre-tokenized here).
void tokenize_bpe(const VocabState& st, std::string_view text, std::vector<int32_t>& out);

// Splits text into pre-tokens (byte offset, byte length), as the pre-tokenizer's regular
// expression would, in order and covering every byte.
struct TextSpan {
    uint32_t offset;
    uint32_t len;
};
std::vector<TextSpan> pretokenize(PreTokenizer pre, std::string_view text);

// GPT-2's byte alphabet: every byte maps to one printable code point and back.
uint32_t byte_to_codepoint(uint8_t b);
int codepoint_to_byte(uint32_t cp);  // -1 when cp is not in the alphabet

// Builds the BPE-specific tables (merges, byte alphabet ids, pieces); throws for bad merges.
void build_bpe_tables(VocabState& st, const std::vector<std::string>& merges);

}  // namespace bonsai
