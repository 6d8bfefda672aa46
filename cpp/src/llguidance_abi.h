// Our own declarations of the part of llguidance's C ABI that grammar.cpp uses (the library is
// loaded with dlopen at run time, so there is no build-time dependency on its header).
//
// Layouts as of llguidance 1.8 / 1.9 (parser/src/ffi.rs, #[repr(C)]). What must stay true:
//   - LlgTokenizerInitV2 begins with struct_size and the library reads only struct_size bytes,
//     so fields appended by later versions default to zero.
//   - LlgConstraintInit has no size field: the library's llg_constraint_init_set_defaults writes
//     the whole struct, so we hand it a zeroed buffer with spare room (kConstraintInitSpare) and
//     check at load time that the defaults landed where these declarations expect them
//     (grammar.cpp, check_constraint_init_layout) and nothing was written past them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bonsai::llg {

struct Tokenizer;  // opaque LlgTokenizer
struct Matcher;    // opaque LlgMatcher

struct ParserLimits {
    size_t max_items_in_row;       // default 2000
    uint64_t initial_lexer_fuel;   // default 1'000'000
    uint64_t step_lexer_fuel;      // default 200'000
    size_t step_max_items;         // default 50'000
    size_t max_lexer_states;       // default 250'000
    size_t max_grammar_size;       // default 500'000
    bool precompute_large_lexemes; // default true
    bool verbose_errors;           // default true
};

struct ConstraintInit {
    const Tokenizer* tokenizer;
    uint32_t log_buffer_level;  // 0 none, 1 warnings, 2 info
    uint32_t log_stderr_level;
    bool ff_tokens_ok;
    bool backtrack_ok;
    ParserLimits limits;
};

// Room after ConstraintInit for fields a newer library might write (checked to stay zero).
constexpr size_t kConstraintInitSpare = 256;

// Total number of tokens of `bytes`; writes at most output_len of them. Must be thread-safe.
using TokenizeFn = size_t (*)(const void* user_data, const uint8_t* bytes, size_t bytes_len,
                              uint32_t* output_tokens, size_t output_len);

struct TokenizerInitV2 {
    size_t struct_size;             // sizeof(TokenizerInitV2)
    uint32_t vocab_size;
    uint32_t tok_eos;
    const uint32_t* token_lens;     // vocab_size lengths
    const uint8_t* token_bytes;     // all token bytes, concatenated
    const char* tokenizer_json;     // null: token_lens / token_bytes are used
    bool tokenize_assumes_string;
    TokenizeFn tokenize_fn;
    bool use_approximate_greedy_tokenize_fn;
    const void* tokenize_user_data;
    const char* const* slices;      // null: the library's default slices
    const uint32_t* tok_eos_extra;  // further end-of-sequence ids
    uint32_t tok_eos_extra_count;
};

// The functions grammar.cpp looks up, with their C signatures.
struct Api {
    const char* (*get_version)();
    void (*constraint_init_set_defaults)(ConstraintInit* init, const Tokenizer* tok);
    Tokenizer* (*new_tokenizer_v2)(const TokenizerInitV2* init, char* error, size_t error_len);
    void (*free_tokenizer)(Tokenizer* tok);
    Matcher* (*new_matcher)(const ConstraintInit* init, const char* constraint_type, const char* data);
    const char* (*matcher_get_error)(Matcher* m);
    bool (*matcher_is_error)(const Matcher* m);
    int32_t (*matcher_compute_mask_into)(Matcher* m, uint32_t* mask, size_t mask_byte_len);
    size_t (*matcher_get_mask_byte_size)(const Matcher* m);
    int32_t (*matcher_consume_token)(Matcher* m, uint32_t token);
    bool (*matcher_is_accepting)(Matcher* m);
    bool (*matcher_is_stopped)(const Matcher* m);
    int32_t (*matcher_reset)(Matcher* m);
    Matcher* (*clone_matcher)(const Matcher* m);
    void (*free_matcher)(Matcher* m);
};

}  // namespace bonsai::llg
