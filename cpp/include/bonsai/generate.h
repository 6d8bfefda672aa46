// The bonsai_run text-generation driver: load the model, report devices and memory, run the prompt
// (-p / -f) or an interactive chat (-i), stream the sampled text and print a timing summary.
#pragma once

#include "bonsai/cli_args.h"

namespace bonsai {

// Runs generation as the options say. Generated text goes to stdout; the load report, notices and
// the timing summary go to stderr. Bad input (empty or over-long prompt, -n 0, bad sampling values,
// unsupported model or cache type, ...) throws bonsai::Error with one line naming the problem;
// the caller prints it and exits non-zero. Returns the process exit status on success (0).
int run_generate(const RunOptions& opts);

// --parallel N > 1 (run_generate dispatches here): every non-blank line of -f is a prompt; up to N
// of them are decoded together by continuous batching (generate_parallel.cpp). Same contract.
int run_generate_parallel(const RunOptions& opts);

}  // namespace bonsai
