// Unit tests of the llama-cli conveniences in bonsai_run's parser (bonsai/cli_args.h): the chat
// flags and their aliases, repeatable -r, escapes (on by default, llama.cpp's set of sequences,
// applied to -p and -r), --ignore-eos, --verbose-prompt and --version (no --model needed).
#include <cstdio>
#include <string>
#include <vector>

#include "bonsai/cli_args.h"
#include "bonsai/error.h"
#include "check.h"

using namespace bonsai;

namespace {

RunOptions parse(std::vector<std::string> args) {
    args.insert(args.begin(), "bonsai_run");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return parse_run_args(static_cast<int>(argv.size()), argv.data());
}

void test_flags() {
    const RunOptions d = parse({"-m", "x"});
    CHECK(d.escape && !d.ignore_eos && !d.verbose_prompt && !d.version && d.reverse_prompts.empty());
    CHECK(d.system_prompt.empty());
    for (const char* alias : {"-i", "-cnv", "--conversation", "--interactive"}) CHECK(parse({"-m", "x", alias}).interactive);
    const RunOptions o = parse({"-m", "x", "-i", "-sys", "Be brief", "-r", "User:", "--reverse-prompt=Q:",
                                "--ignore-eos", "--verbose-prompt"});
    CHECK(o.system_prompt == "Be brief" && o.ignore_eos && o.verbose_prompt);
    CHECK((o.reverse_prompts == std::vector<std::string>{"User:", "Q:"}));
    CHECK(parse({"--version"}).version);  // no --model needed
    CHECK(!parse({"-m", "x", "--no-escape"}).escape);
    CHECK(parse({"-m", "x", "--no-escape", "-e"}).escape);  // the last one wins
    CHECK_THROWS(parse({"-m", "x", "-sys", "S"}), "-sys/--system-prompt is the system message of a chat; add -i");
    CHECK_THROWS(parse({"-m", "x", "-r", ""}), "invalid value '' for -r (--reverse-prompt): expected a non-empty text");
    CHECK_THROWS(parse({"-m", "x", "--ignore-eos=1"}), "--ignore-eos takes no value");
    CHECK_THROWS(parse({"-m", "x", "--escape=no"}), "--escape takes no value");
}

void test_escapes() {
    CHECK(process_escapes("a\\nb\\tc\\rd") == "a\nb\tc\rd");
    CHECK(process_escapes("\\'\\\"\\\\") == "'\"\\");
    CHECK(process_escapes("\\x41\\x7a\\x0A") == "Az\n");
    CHECK(process_escapes("\\x4") == "\\x4");      // needs two hex digits
    CHECK(process_escapes("\\xg1") == "\\xg1");
    CHECK(process_escapes("\\q\\0") == "\\q\\0");  // unknown sequences stay as written
    CHECK(process_escapes("end\\") == "end\\");    // so does a trailing backslash
    CHECK(process_escapes("\\\\n") == "\\n");      // an escaped backslash is not the start of another
    const RunOptions o = parse({"-m", "x", "-p", "a\\nb", "-r", "\\tX"});
    CHECK(o.prompt == "a\nb" && o.reverse_prompts[0] == "\tX");
    const RunOptions raw = parse({"-m", "x", "-p", "a\\nb", "-r", "\\tX", "--no-escape"});
    CHECK(raw.prompt == "a\\nb" && raw.reverse_prompts[0] == "\\tX");
}

void test_help() {
    const std::string h = run_help("bonsai_run");
    for (const char* s : {"-i, -cnv, --conversation, --interactive", "-sys, --system-prompt TEXT",
                          "-r, --reverse-prompt TEXT", "-e, --escape", "--no-escape", "--ignore-eos",
                          "--verbose-prompt", "--version"})
        CHECK(h.find(s) != std::string::npos);
    CHECK(run_usage("bonsai_run").find("bonsai_run --version") != std::string::npos);
}

}  // namespace

int main() {
    test_flags();
    test_escapes();
    test_help();
    if (g_failures) {
        std::fprintf(stderr, "test_run_conveniences: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("test_run_conveniences: all passed\n");
    return 0;
}
