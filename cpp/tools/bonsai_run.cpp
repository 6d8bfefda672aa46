// bonsai_run: the command-line runner. Parses the flags of SPEC section 6 (bonsai/cli_args.h),
// opens and validates the model, and for --inspect prints the file summary; --version prints the
// package version and how this binary was built.
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

#ifndef BONSAI_VERSION
#error "BONSAI_VERSION is defined by CMakeLists.txt from pyproject.toml"
#endif

namespace {

// The version, compiler, build type, the CPU instruction sets this binary was compiled for (the
// kernels use what the compiler enabled, e.g. with -march=native) and whether CUDA is built in.
std::string version_text() {
    std::string cpu;
    auto add = [&cpu](bool on, const char* name) {
        if (on) cpu += std::string(cpu.empty() ? "" : " ") + name;
    };
#if defined(__x86_64__) || defined(_M_X64)
    bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false, avx512f = false, avx512bw = false,
         avx512vl = false, avx512vnni = false, avx512bf16 = false, avx512vbmi = false, avxvnni = false;
#ifdef __SSE4_2__
    sse42 = true;
#endif
#ifdef __AVX__
    avx = true;
#endif
#ifdef __AVX2__
    avx2 = true;
#endif
#ifdef __FMA__
    fma = true;
#endif
#ifdef __F16C__
    f16c = true;
#endif
#ifdef __AVX512F__
    avx512f = true;
#endif
#ifdef __AVX512BW__
    avx512bw = true;
#endif
#ifdef __AVX512VL__
    avx512vl = true;
#endif
#ifdef __AVX512VNNI__
    avx512vnni = true;
#endif
#ifdef __AVX512BF16__
    avx512bf16 = true;
#endif
#ifdef __AVX512VBMI__
    avx512vbmi = true;
#endif
#ifdef __AVXVNNI__
    avxvnni = true;
#endif
    add(sse42, "SSE4.2");
    add(avx, "AVX");
    add(avx2, "AVX2");
    add(fma, "FMA");
    add(f16c, "F16C");
    add(avxvnni, "AVX_VNNI");
    add(avx512f, "AVX512F");
    add(avx512bw, "AVX512BW");
    add(avx512vl, "AVX512VL");
    add(avx512vnni, "AVX512_VNNI");
    add(avx512bf16, "AVX512_BF16");
    add(avx512vbmi, "AVX512_VBMI");
    const char* arch = "x86_64";
#elif defined(__aarch64__)
    bool neon = false, dotprod = false, fp16 = false;
#ifdef __ARM_NEON
    neon = true;
#endif
#ifdef __ARM_FEATURE_DOTPROD
    dotprod = true;
#endif
#ifdef __ARM_FEATURE_FP16_VECTOR_ARITHMETIC
    fp16 = true;
#endif
    add(neon, "NEON");
    add(dotprod, "DOTPROD");
    add(fp16, "FP16");
    const char* arch = "aarch64";
#else
    const char* arch = "other";
#endif
#if defined(__clang__)
    const std::string compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
    const std::string compiler = "gcc " __VERSION__;
#else
    const std::string compiler = "unknown compiler";
#endif
#ifdef BONSAI_CUDA
    const char* cuda = "on";
#else
    const char* cuda = "off";
#endif
    return std::string("bonsai_run (bonsai-runner) ") + BONSAI_VERSION + "\n" +
           "built with " + compiler + " (" + BONSAI_BUILD_TYPE + ") for " + arch + "\n" +
           "CPU features: " + (cpu.empty() ? "none beyond the base instruction set" : cpu) + "\n" +
           "CUDA: " + cuda + "\n";
}

}  // namespace

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
    if (opts.version) {
        std::fputs(version_text().c_str(), stdout);
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
