// Command-line options of bonsai_run (SPEC section 6), parsed and validated in one place so that
// the engine, the binary and the tests agree on names, defaults and ranges.
//
// Flags take their value as the next argument or after '=' (`--ctx-size 4096`, `--ctx-size=4096`).
// `--config FILE` reads defaults from a JSON object whose keys are long flag names without the
// dashes (`{"ctx-size": 8192, "temp": 0.2, "flash-attn": true}`); flags on the command line
// override it. Bad input throws bonsai::Error with one line naming the flag and what is accepted.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bonsai/sampling.h"
#include "bonsai/types.h"

namespace bonsai {

struct RunOptions {
    // model and inputs
    std::string model;            // -m, --model: GGUF file (required unless --help)
    std::string config;           // --config: JSON file of default flag values
    std::string tokenizer;        // --tokenizer: tokenizer.model overriding the embedded vocabulary
    std::string prompt;           // -p, --prompt
    bool has_prompt = false;      // -p given (an empty prompt is valid)
    std::string prompt_file;      // -f, --file: read the prompt from this file
    bool interactive = false;     // -i, -cnv, --interactive: chat mode (the file's chat template)
    std::string system_prompt;    // -sys, --system-prompt: the chat's system message (-i only)
    bool verbose_prompt = false;  // --verbose-prompt: print each evaluated prompt text to stderr
    bool escape = true;           // -e / --no-escape: \n, \t, \xNN, ... in -p, -f, -r, chat lines
    std::vector<std::string> reverse_prompts;  // -r, --reverse-prompt (repeatable)
    bool ignore_eos = false;      // --ignore-eos: never stop at (and never sample) end-of-generation tokens
    bool inspect = false;         // --inspect: print the file summary and exit
    // at most one of these four (grammar.h): the output is constrained by a grammar or JSON schema
    std::string grammar;          // --grammar: GBNF or Lark text
    std::string grammar_file;     // --grammar-file: a file of GBNF or Lark
    std::string json_schema;      // -j, --json-schema: a JSON schema text
    std::string json_schema_file; // -jf, --json-schema-file: a file holding a JSON schema

    // generation and sampling
    int32_t n_predict = -1;       // -n: tokens to generate, -1 = until end of text or context full
    int32_t ctx_size = 4096;      // -c: context length, 0 = the model's training context
    float temp = 0.8f;            // 0 = greedy
    float top_p = 0.95f;          // 1 = off
    int32_t top_k = 40;           // 0 = off
    float min_p = 0.05f;          // 0 = off
    float repeat_penalty = 1.0f;  // 1 = off
    int32_t repeat_last_n = 64;   // -1 = whole context, 0 = off
    float frequency_penalty = 0.0f;  // 0 = off; over the --repeat-last-n window
    float presence_penalty = 0.0f;   // 0 = off; over the --repeat-last-n window
    std::vector<std::pair<int32_t, float>> logit_bias;  // -l ID(+|-)BIAS, repeatable
    uint64_t seed = kRandomSeed;  // -s: 0 .. 2^64-2; kRandomSeed (-s -1) = random

    // engine
    int32_t n_gpu_layers = -1;    // -ngl: layers on the GPU, -1 = all
    GgmlType cache_type_k = TYPE_F16;  // TYPE_F16 or TYPE_Q8_0
    GgmlType cache_type_v = TYPE_F16;
    bool flash_attn = false;
    bool cuda_graph = true;
    bool use_mmap = true;         // false with --no-mmap
    bool huge_pages = true;       // false with --no-huge-pages
    bool repack = true;           // false with --no-repack
    int32_t parallel = 1;         // independent sequences decoded together
    int32_t batch_size = 512;     // -b: prompt tokens per forward pass
    bool cache_prompt = false;    // reuse the KV cache of a shared prompt prefix
    int32_t threads = 0;          // -t: CPU threads, 0 = one per hardware thread

    bool help = false;            // -h, --help
    bool version = false;         // --version
};

// Parses argv[1..argc-1]. Throws bonsai::Error on an unknown flag, a missing or bad value, a
// missing --model (unless --help or --version), conflicting flags, or an unreadable/malformed
// --config file.
RunOptions parse_run_args(int argc, const char* const* argv);

// llama.cpp's prompt escapes: \n \r \t \' \" \\ and \xNN (two hex digits) become the character;
// any other backslash sequence, and a trailing backslash, stay as written.
std::string process_escapes(const std::string& text);

// One-paragraph synopsis printed after a usage error.
std::string run_usage(const std::string& prog);

// Full help: every flag with its value, default and meaning, plus examples.
std::string run_help(const std::string& prog);

}  // namespace bonsai
