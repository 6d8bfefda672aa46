// Unit tests of bonsai_run's argument parsing: defaults, every value flag in both spellings,
// range and type errors naming the flag, unknown flags with a suggestion, --config files and
// their precedence, the help text listing every flag, and the 64-bit seeds (a printed seed replays).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bonsai/cli_args.h"
#include "bonsai/error.h"
#include "bonsai/sampling.h"
#include "check.h"

using namespace bonsai;

namespace {

RunOptions parse(std::vector<std::string> args) {
    args.insert(args.begin(), "bonsai_run");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return parse_run_args(static_cast<int>(argv.size()), argv.data());
}

void expect_error(const std::vector<std::string>& args, const std::string& needle, int line) {
    std::string msg;
    try {
        parse(args);
    } catch (const Error& e) {
        msg = e.what();
    }
    if (msg.find(needle) == std::string::npos) {
        std::fprintf(stderr, "line %d: expected an error containing '%s', got '%s'\n", line,
                     needle.c_str(), msg.c_str());
        ++g_failures;
    }
}
#define EXPECT_ERROR(needle, ...) expect_error({__VA_ARGS__}, needle, __LINE__)

std::string write_temp(const std::string& text) {
    static int n = 0;
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("bonsai_test_cli_" + std::to_string(::getpid()) + "_" +
                               std::to_string(n++) + ".json")).string();
    std::ofstream(path) << text;
    return path;
}

void test_values() {
    const RunOptions d = parse({"-m", "x.gguf"});
    CHECK(d.model == "x.gguf" && d.ctx_size == 4096 && d.use_mmap && !d.flash_attn && d.cuda_graph);
    CHECK(d.huge_pages && !parse({"-m", "x.gguf", "--no-huge-pages"}).huge_pages);
    CHECK(d.repack && !parse({"-m", "x.gguf", "--no-repack"}).repack);
    CHECK(!parse({"-m", "x.gguf", "--no-cuda-graph"}).cuda_graph);
    CHECK(d.cache_type_k == TYPE_F16 && d.seed == kRandomSeed && d.n_predict == -1 && !d.has_prompt);

    const RunOptions o = parse({"--model=m.gguf", "-c", "8192", "--temp", "0.25", "--top-p=0.5",
                                "--top-k", "7", "--min-p", "0.1", "--repeat-penalty", "1.1",
                                "--repeat-last-n", "-1", "-ctk", "q8_0", "--cache-type-v=q8_0",
                                "-fa", "--cuda-graph", "--no-mmap", "-np", "4", "-b", "256",
                                "--cache-prompt", "-t", "8", "-s", "18446744073709551614", "-p", "",
                                "-n", "16", "-ngl", "20", "--tokenizer", "tok.model"});
    CHECK(o.model == "m.gguf" && o.ctx_size == 8192 && o.temp == 0.25f && o.top_p == 0.5f);
    CHECK(o.top_k == 7 && o.min_p == 0.1f && o.repeat_penalty == 1.1f && o.repeat_last_n == -1);
    CHECK(o.cache_type_k == TYPE_Q8_0 && o.cache_type_v == TYPE_Q8_0);
    CHECK(o.flash_attn && o.cuda_graph && !o.use_mmap && o.cache_prompt);
    CHECK(o.parallel == 4 && o.batch_size == 256 && o.threads == 8 && o.seed == 18446744073709551614ull);
    CHECK(o.has_prompt && o.prompt.empty() && o.n_predict == 16 && o.n_gpu_layers == 20);
    CHECK(o.tokenizer == "tok.model");
    CHECK(parse({"-m", "x", "-p", "-starts with a dash"}).prompt == "-starts with a dash");
    CHECK(parse({"--help"}).help);  // no --model needed
    CHECK(parse({"-m", "x", "-i"}).interactive);
    CHECK(parse({"-m", "x", "--inspect"}).inspect);
    // every seed a run can print replays: the whole 64-bit range but the "random" value itself
    CHECK(parse({"-m", "x", "-s", "4294967296"}).seed == 4294967296ull);
    CHECK(parse({"-m", "x", "-s", "0"}).seed == 0);
    CHECK(parse({"-m", "x", "-s", "-1"}).seed == kRandomSeed);
    // the lower bounds the engine accepts, open where the engine's is
    CHECK(parse({"-m", "x", "--top-p", "1e-9"}).top_p == 1e-9f);
    CHECK(parse({"-m", "x", "--repeat-penalty", "1e-9"}).repeat_penalty == 1e-9f);
    CHECK(parse({"-m", "x", "--min-p", "0"}).min_p == 0.0f);
    CHECK(parse({"-m", "x", "-n", "-1"}).n_predict == -1);
}

// The seeds of --parallel's sequences: base + k modulo 2^64 - 1, never the "random" value.
void test_offset_seed() {
    CHECK(offset_seed(40, 2) == 42);
    CHECK(offset_seed(kRandomSeed - 1, 0) == kRandomSeed - 1);
    CHECK(offset_seed(kRandomSeed - 1, 1) == 0);
    CHECK(offset_seed(kRandomSeed - 2, 3) == 1);
    CHECK(offset_seed(0, kRandomSeed) == 0);
    for (uint64_t k = 0; k < 1000; ++k) CHECK(offset_seed(kRandomSeed - 500, k) != kRandomSeed);
    for (int k = 0; k < 1000; ++k) CHECK(random_seed() != kRandomSeed);
}

void test_errors() {
    EXPECT_ERROR("--model is required");
    EXPECT_ERROR("unknown flag '--bogus'", "-m", "x", "--bogus");
    EXPECT_ERROR("did you mean --top-k?", "-m", "x", "--topk", "3");
    EXPECT_ERROR("invalid value 'abc' for --ctx-size", "-m", "x", "--ctx-size", "abc");
    EXPECT_ERROR("invalid value '-5' for -c (--ctx-size): expected an integer >= 0", "-m", "x", "-c", "-5");
    EXPECT_ERROR("invalid value '12x' for --top-k", "-m", "x", "--top-k", "12x");
    EXPECT_ERROR("invalid value '1.5' for --top-p: expected a number between 0 and 1, greater than 0", "-m", "x",
                 "--top-p", "1.5");
    // the engine's top_p range is (0, 1]: 0 is a usage error, not a later runtime error
    EXPECT_ERROR("invalid value '0' for --top-p: expected a number between 0 and 1, greater than 0", "-m", "x",
                 "--top-p", "0");
    EXPECT_ERROR("invalid value '0' for -n (--n-predict): expected -1 (until end of text) or an integer from 1", "-m", "x",
                 "-n", "0");
    EXPECT_ERROR("invalid value ' 5' for -c", "-m", "x", "-c", " 5");
    EXPECT_ERROR("invalid value '-0.5' for --min-p", "-m", "x", "--min-p", "-0.5");
    EXPECT_ERROR("invalid value 'nan' for --temp", "-m", "x", "--temp", "nan");
    EXPECT_ERROR("invalid value '0' for --repeat-penalty", "-m", "x", "--repeat-penalty", "0");
    EXPECT_ERROR("invalid value 'q4_0' for --cache-type-k: expected f16 or q8_0", "-m", "x",
                 "--cache-type-k", "q4_0");
    EXPECT_ERROR("invalid value '0' for --parallel", "-m", "x", "--parallel", "0");
    EXPECT_ERROR("invalid value '18446744073709551615' for --seed: expected -1 (random) or an integer from 0 "
                 "to 18446744073709551614", "-m", "x", "--seed", "18446744073709551615");
    EXPECT_ERROR("invalid value '18446744073709551616' for --seed", "-m", "x", "--seed", "18446744073709551616");
    EXPECT_ERROR("invalid value '-2' for --seed", "-m", "x", "--seed", "-2");
    EXPECT_ERROR("invalid value '+7' for --seed", "-m", "x", "--seed", "+7");
    EXPECT_ERROR("invalid value '99999999999' for -n", "-m", "x", "-n", "99999999999");
    EXPECT_ERROR("--ctx-size needs a value", "-m", "x", "--ctx-size");
    EXPECT_ERROR("--flash-attn takes no value", "-m", "x", "--flash-attn=on");
    EXPECT_ERROR("unexpected argument 'hello'", "-m", "x", "hello");
    EXPECT_ERROR("cannot be used together", "-m", "x", "-p", "a", "-f", "b.txt");
}

void test_config() {
    const std::string cfg = write_temp(
        "{\"ctx-size\": 1024, \"temp\": 0.1, \"flash_attn\": true, \"cache-type-k\": \"q8_0\",\n"
        " \"model\": \"from_config.gguf\"}");
    RunOptions o = parse({"--config", cfg, "--temp", "0.7"});
    CHECK(o.model == "from_config.gguf" && o.ctx_size == 1024 && o.flash_attn);
    CHECK(o.temp == 0.7f);  // the command line wins
    CHECK(o.cache_type_k == TYPE_Q8_0);
    const std::string bad_key = write_temp("{\"ctx\": 5}");
    EXPECT_ERROR("unknown key \"ctx\"", "-m", "x", "--config", bad_key);
    const std::string bad_value = write_temp("{\"ctx-size\": \"big\"}");
    EXPECT_ERROR("invalid value 'big' for \"ctx-size\"", "-m", "x", "--config", bad_value);
    const std::string bad_json = write_temp("{\"ctx-size\": 5,");
    EXPECT_ERROR("must be one JSON object", "-m", "x", "--config", bad_json);
    const std::string bad_bool = write_temp("{\"no-mmap\": 1}");
    EXPECT_ERROR("\"no-mmap\" must be true or false", "-m", "x", "--config", bad_bool);
    EXPECT_ERROR("cannot open the --config file '/nonexistent/c.json'", "-m", "x", "--config", "/nonexistent/c.json");
    EXPECT_ERROR("is a directory; give --config the path of a file", "-m", "x", "--config",
                 std::filesystem::temp_directory_path().string());
    for (const auto& p : {cfg, bad_key, bad_value, bad_json, bad_bool}) std::remove(p.c_str());
}

void test_grammar_flags() {
    const RunOptions g = parse({"-m", "x", "--grammar", "root ::= \"a\""});
    CHECK(g.grammar == "root ::= \"a\"" && g.json_schema.empty());
    CHECK(parse({"-m", "x", "-j", "{}"}).json_schema == "{}");
    CHECK(parse({"-m", "x", "--json-schema={\"type\": \"object\"}"}).json_schema == "{\"type\": \"object\"}");
    CHECK(parse({"-m", "x", "-jf", "s.json"}).json_schema_file == "s.json");
    CHECK(parse({"-m", "x", "--grammar-file", "g.gbnf"}).grammar_file == "g.gbnf");
    EXPECT_ERROR("--grammar and -j/--json-schema cannot be used together", "-m", "x", "--grammar", "a", "-j", "{}");
    EXPECT_ERROR("--grammar-file and -jf/--json-schema-file cannot be used together", "-m", "x", "-jf", "a",
                 "--grammar-file", "b");
    EXPECT_ERROR("--grammar and --grammar-file cannot be used together", "-m", "x", "--grammar-file", "b",
                 "--grammar", "a");
    EXPECT_ERROR("invalid value '' for -j (--json-schema): expected a JSON schema", "-m", "x", "-j", "");
    EXPECT_ERROR("invalid value '' for --grammar: expected a grammar text", "-m", "x", "--grammar=");
    EXPECT_ERROR("-jf needs a value (FILE)", "-m", "x", "-jf");
    // --config takes them as it takes every flag; a conflict with the command line is refused
    const std::string cfg = write_temp("{\"json-schema\": \"{\\\"type\\\": \\\"object\\\"}\"}");
    CHECK(parse({"-m", "x", "--config", cfg}).json_schema == "{\"type\": \"object\"}");
    EXPECT_ERROR("cannot be used together", "-m", "x", "--config", cfg, "--grammar", "root ::= \"a\"");
    std::remove(cfg.c_str());
}

void test_help() {
    const std::string help = run_help("bonsai_run");
    for (const char* flag : {"--model", "--config", "--tokenizer", "--n-gpu-layers", "--ctx-size",
                             "--temp", "--top-p", "--top-k", "--min-p", "--repeat-penalty",
                             "--repeat-last-n", "--cache-type-k", "--cache-type-v", "--flash-attn",
                             "--cuda-graph", "--no-mmap", "--no-huge-pages", "--no-repack", "--parallel", "--batch-size",
                             "--cache-prompt", "--threads", "--seed", "--prompt", "--file",
                             "--n-predict", "--interactive", "--inspect", "--help", "examples:",
                             "--grammar GRAMMAR", "--grammar-file FILE", "-j, --json-schema SCHEMA",
                             "-jf, --json-schema-file FILE", "GBNF", "Lark", "'name ::=' rule means GBNF"})
        CHECK(help.find(flag) != std::string::npos);
    CHECK(run_usage("bonsai_run").find("--help") != std::string::npos);
}

}  // namespace

int main() {
    test_values();
    test_offset_seed();
    test_errors();
    test_config();
    test_grammar_flags();
    test_help();
    if (g_failures) {
        std::fprintf(stderr, "test_cli_args: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("test_cli_args: all passed\n");
    return 0;
}
