// Pieces of bonsai_run generation shared by the single-sequence driver (generate.cpp) and the
// parallel one (generate_parallel.cpp); defined in generate.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bonsai/cli_args.h"
#include "bonsai/context.h"
#include "bonsai/grammar.h"
#include "bonsai/model.h"
#include "bonsai/sampling.h"
#include "bonsai/vocab.h"

namespace bonsai {

// The whole file as bytes; throws bonsai::Error naming the path when it cannot be read.
std::string read_prompt_file(const std::string& path);
// The model of --model with the load-time options (mmap, --tokenizer); the engine runs on the CPU.
std::shared_ptr<const Model> load_model_for_run(const RunOptions& o);
// Context parameters of the options (batch size, threads, KV types, flash attention) for n_ctx
// cells and n_seq_max sequences.
ContextParams context_params_from(const RunOptions& o, int n_ctx, int n_seq_max = 1);
// The --grammar / --grammar-file / -j / -jf constraint of the options, files read (Kind::NONE
// without one); throws bonsai::Error naming the flag when a file cannot be read.
GrammarSource grammar_source_from(const RunOptions& o);
// Sampling parameters of the options, validated (throws bonsai::Error on a bad value).
SamplingParams sampling_from(const RunOptions& o);
// Token ids that end a generation: EOS plus the end-of-turn control tokens the vocabulary has.
std::vector<int32_t> end_tokens(const Vocab& v);
// --ignore-eos: the logits with the given tokens at -infinity (copied into `scratch`, which the
// returned pointer points into), so they are never sampled. `logits` itself when `ids` is empty.
const float* ban_tokens(const float* logits, int64_t n_vocab, const std::vector<int32_t>& ids,
                        std::vector<float>& scratch);
// -r: whether `text`, whose last `n_new` bytes just arrived, now contains a reverse prompt that
// ends inside those bytes (a piece may run past the reverse prompt, as in llama.cpp).
bool hit_reverse_prompt(const std::string& text, size_t n_new, const std::vector<std::string>& prompts);
// --verbose-prompt: a text about to be evaluated and its token count, between marker lines (stderr).
void print_verbose_prompt(const std::string& text, size_t n_tokens);
// The model line, per-layer table, memory of weights / KV cache / compute buffers, threads (stderr).
void print_load_report(const Model& m, const Context& ctx, const RunOptions& o);

}  // namespace bonsai
