// bonsai_run: the command-line runner. Parses the flags of SPEC section 6 (bonsai/cli_args.h),
// opens and validates the model, and for --inspect prints the file summary.
//
// Exit status: 0 success, 1 bad model or runtime error (one line on stderr), 2 bad command line
// (the problem and the usage synopsis on stderr).
#include <cstdio>
#include <exception>
#include <string>

#include "bonsai/cli_args.h"
#include "bonsai/error.h"
#include "bonsai/generate.h"
#include "bonsai/gguf.h"
#include "bonsai/inspect.h"

int main(int argc, char** argv) {
    const std::string prog = "bonsai_run";
    bonsai::RunOptions opts;
    try {
        opts = bonsai::parse_run_args(argc, argv);
    } catch (const bonsai::Error& e) {
        std::fprintf(stderr, "%s: error: %s\n%s", prog.c_str(), e.what(),
                     bonsai::run_usage(prog).c_str());
        return 2;
    }
    if (opts.help) {
        std::fputs(bonsai::run_help(prog).c_str(), stdout);
        return 0;
    }
    try {
        auto model = bonsai::GgufFile::open(opts.model, opts.use_mmap);
        if (opts.inspect) {
            std::fputs(bonsai::format_inspect(*model).c_str(), stdout);
            return 0;
        }
        return bonsai::run_generate(opts);
    } catch (const bonsai::Error& e) {
        std::fprintf(stderr, "%s: error: %s\n", prog.c_str(), e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: internal error: %s\n", prog.c_str(), e.what());
        return 1;
    }
}
