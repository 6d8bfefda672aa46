// libFuzzer harness of bonsai_run's flag parser, cpp/src/cli_args.cpp (ASan + UBSan build,
// BONSAI_FUZZ=ON).
//
// Input: an argv and a --config file: the bytes up to the first NUL are the arguments, one per
// line ('\n'; so an argument cannot hold a newline here), the bytes after it are the --config
// file's content. Every `--config X` / `--config=X` is pointed at that content (held in an
// in-memory file), so the parser never reads another file, and a config file can still be fuzzed.
//
// Property: parse_run_args returns or throws bonsai::Error; any other exception or a sanitizer
// report is a finding. When it returns, the options are inside the ranges cli_args.h documents.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bonsai/cli_args.h"
#include "bonsai/error.h"
#include "fuzz_common.h"

namespace {

void check_ranges(const bonsai::RunOptions& o) {
    const bool ok = (o.n_predict == -1 || o.n_predict >= 1) && o.ctx_size >= 0 && o.temp >= 0 &&
                    std::isfinite(o.temp) && o.top_p > 0 && o.top_p <= 1 && o.min_p >= 0 && o.min_p <= 1 &&
                    o.repeat_penalty > 0 && std::isfinite(o.repeat_penalty) && o.repeat_last_n >= -1 &&
                    o.top_k >= 0 && o.n_gpu_layers >= -1 && o.parallel >= 1 && o.parallel <= 64 &&
                    o.batch_size >= 1 && o.threads >= 0 && o.threads <= 4096;
    if (!ok) {
        std::fprintf(stderr, "parse_run_args returned an option outside its documented range\n");
        std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static bonsai_fuzz::MemFile config("fuzz_cli_config");
    const std::string input(reinterpret_cast<const char*>(data), size);
    const size_t nul = input.find('\0');
    const std::string argv_text = input.substr(0, nul);
    const std::string config_text = nul == std::string::npos ? std::string() : input.substr(nul + 1);
    config.write(reinterpret_cast<const uint8_t*>(config_text.data()), config_text.size());

    std::vector<std::string> args{"bonsai_run"};
    size_t start = 0;
    while (start <= argv_text.size() && !argv_text.empty()) {
        size_t end = argv_text.find('\n', start);
        if (end == std::string::npos) end = argv_text.size();
        args.push_back(argv_text.substr(start, end - start));
        start = end + 1;
    }
    for (size_t k = 1; k < args.size(); ++k) {
        if (args[k] == "--config" && k + 1 < args.size()) args[k + 1] = config.path();
        else if (args[k].rfind("--config=", 0) == 0) args[k] = "--config=" + config.path();
    }
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());

    try {
        const bonsai::RunOptions o = bonsai::parse_run_args(static_cast<int>(argv.size()), argv.data());
        if (!o.help) check_ranges(o);
    } catch (const bonsai::Error& e) {
        if (std::string(e.what()).empty()) std::abort();  // an error always says what is wrong
    } catch (const std::exception& e) {
        std::fprintf(stderr, "parse_run_args threw a non-bonsai exception: %s\n", e.what());
        std::abort();
    }
    return 0;
}
