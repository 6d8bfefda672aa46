// bonsai_run's flag table, value parsing and help text (see bonsai/cli_args.h).
//
// The table below is the single list of flags: parsing, `--config` keys and the help text are all
// generated from it, so a flag cannot be accepted without being documented or vice versa.
// Numbers are parsed strictly (the whole argument must be a finite number in range).
#include "bonsai/cli_args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/input_file.h"
#include "config_json.h"

namespace bonsai {

namespace {

struct Flag {
    std::vector<std::string> names;  // e.g. {"-c", "--ctx-size"}; the last one is the long name
    std::string metavar;             // "" for on/off flags
    std::string help;
    std::function<void(const std::string& flag, const std::string& value)> set_value;
    std::function<void(bool)> set_bool;

    const std::string& long_name() const { return names.back(); }
};

[[noreturn]] void bad_value(const std::string& flag, const std::string& value,
                            const std::string& expected) {
    throw Error("invalid value '" + value + "' for " + flag + ": expected " + expected);
}

// strtoll/strtod skip leading white space; a value must be the number and nothing else.
bool starts_with_space(const std::string& v) {
    return !v.empty() && std::isspace(static_cast<unsigned char>(v[0]));
}

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi,
                  const std::string& expected) {
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || starts_with_space(v) || *end != '\0' || errno == ERANGE || x < lo || x > hi)
        bad_value(flag, v, expected);
    return x;
}

// A finite number in [lo, hi], or in (lo, hi] when lo_open (the bounds the engine accepts).
float parse_float(const std::string& flag, const std::string& v, double lo, double hi, bool lo_open,
                  const std::string& expected) {
    errno = 0;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || starts_with_space(v) || *end != '\0' || errno == ERANGE || !std::isfinite(x) ||
        (lo_open ? x <= lo : x < lo) || x > hi)
        bad_value(flag, v, expected);
    return static_cast<float>(x);
}

// -1 (a random seed) or a seed in [0, kRandomSeed): every seed a run prints, 64-bit included.
uint64_t parse_seed(const std::string& flag, const std::string& v) {
    const std::string expected = "-1 (random) or an integer from 0 to " + std::to_string(kRandomSeed - 1);
    if (v == "-1") return kRandomSeed;
    const bool digits = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
    if (!digits) bad_value(flag, v, expected);
    errno = 0;
    const unsigned long long x = std::strtoull(v.c_str(), nullptr, 10);
    if (errno == ERANGE || x >= kRandomSeed) bad_value(flag, v, expected);
    return x;
}

// -l / --logit-bias: TOKEN_ID followed by +BIAS or -BIAS (llama.cpp's form, e.g. 15043+1, 2-inf).
std::pair<int32_t, float> parse_logit_bias(const std::string& flag, const std::string& v) {
    const std::string expected = "TOKEN_ID(+|-)BIAS, e.g. 15043+1.5 or 2-inf (-inf or a bias <= -100 bans the token)";
    const size_t sign = v.find_first_of("+-", 1);
    if (v.empty() || sign == std::string::npos) bad_value(flag, v, expected);
    const std::string id_text = v.substr(0, sign), bias_text = v.substr(sign + 1);
    const bool digits = !id_text.empty() && std::all_of(id_text.begin(), id_text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
    if (!digits || bias_text.empty()) bad_value(flag, v, expected);
    const int64_t id = parse_int(flag, id_text, 0, 2147483647, expected);
    if (v[sign] == '-' && bias_text == "inf") return {static_cast<int32_t>(id), -INFINITY};
    const float bias = parse_float(flag, bias_text, 0, 1e30, false, expected);
    return {static_cast<int32_t>(id), v[sign] == '-' ? -bias : bias};
}

GgmlType parse_cache_type(const std::string& flag, const std::string& v) {
    if (v == "f16") return TYPE_F16;
    if (v == "q8_0") return TYPE_Q8_0;
    bad_value(flag, v, "f16 or q8_0");
}

std::vector<Flag> make_flags(RunOptions& o) {
    using S = const std::string&;
    auto i32 = [](int32_t& dst, int64_t lo, int64_t hi, std::string expected) {
        return [&dst, lo, hi, expected](S f, S v) {
            dst = static_cast<int32_t>(parse_int(f, v, lo, hi, expected));
        };
    };
    auto f32 = [](float& dst, double lo, double hi, bool lo_open, std::string expected) {
        return [&dst, lo, hi, lo_open, expected](S f, S v) { dst = parse_float(f, v, lo, hi, lo_open, expected); };
    };
    auto str = [](std::string& dst) { return [&dst](S, S v) { dst = v; }; };
    auto nonempty = [](std::string& dst, std::string expected) {
        return [&dst, expected](S f, S v) {
            if (v.empty()) bad_value(f, v, expected);
            dst = v;
        };
    };
    auto on = [](bool& dst) { return [&dst](bool b) { dst = b; }; };
    constexpr int64_t kMaxI32 = 2147483647;
    return {
        {{"-m", "--model"}, "FILE", "GGUF model file to run (required)", str(o.model), nullptr},
        {{"--config"}, "FILE",
         "JSON object of default flag values, keys are long flag names without dashes, e.g. "
         "{\"ctx-size\": 8192, \"temp\": 0.2}; command-line flags override it",
         str(o.config), nullptr},
        {{"--tokenizer"}, "FILE",
         "tokenizer.model to use instead of the vocabulary embedded in the model (must match it)",
         str(o.tokenizer), nullptr},
        {{"-p", "--prompt"}, "TEXT", "prompt to complete",
         [&o](S, S v) { o.prompt = v; o.has_prompt = true; }, nullptr},
        {{"-f", "--file"}, "FILE", "read the prompt from a text file", str(o.prompt_file), nullptr},
        {{"-n", "--n-predict"}, "N", "tokens to generate; -1 = until end of text or context full (default -1)",
         [&o](S f, S v) {
             const char* expected = "-1 (until end of text) or an integer from 1 to 2147483647";
             o.n_predict = static_cast<int32_t>(parse_int(f, v, -1, kMaxI32, expected));
             if (o.n_predict == 0) bad_value(f, v, expected);
         },
         nullptr},
        {{"-i", "-cnv", "--conversation", "--interactive"}, "", "interactive chat in the format of the file's "
         "chat template (ChatML, Llama 2/3, Mistral, Gemma, Phi-3, Zephyr, DeepSeek 2/3, Vicuna; plain "
         "User:/Assistant: turns otherwise); -p/-f is the first user message", nullptr, on(o.interactive)},
        {{"-sys", "--system-prompt"}, "TEXT", "system message of the chat (-i)", str(o.system_prompt), nullptr},
        {{"-r", "--reverse-prompt"}, "TEXT", "stop when the output ends with TEXT: -i hands the turn back to "
         "the user, otherwise generation ends there; repeatable",
         [&o](S f, S v) {
             if (v.empty()) bad_value(f, v, "a non-empty text");
             o.reverse_prompts.push_back(v);
         },
         nullptr},
        {{"-e", "--escape"}, "", "process escapes (\\n \\r \\t \\' \\\" \\\\ \\xNN) in -p, -f, -r and typed chat "
         "lines (default on)",
         nullptr, on(o.escape)},
        {{"--no-escape"}, "", "take -p, -f, -r and chat text literally", nullptr, [&o](bool b) { o.escape = !b; }},
        {{"--ignore-eos"}, "", "do not stop at end-of-generation tokens; they are never sampled (with a grammar "
         "or schema, generation still ends where the grammar admits nothing more)", nullptr, on(o.ignore_eos)},
        {{"--grammar"}, "GRAMMAR", "constrain the output to a grammar: GBNF as llama.cpp writes it (root ::= ...; "
         "any 'name ::=' rule means GBNF) or Lark as llguidance reads it (start: ...); with -i it applies to each "
         "reply; needs the llguidance package (pip install llguidance)", nonempty(o.grammar, "a grammar text"),
         nullptr},
        {{"--grammar-file"}, "FILE", "read the --grammar text (GBNF or Lark) from FILE",
         nonempty(o.grammar_file, "a file path"), nullptr},
        {{"-j", "--json-schema"}, "SCHEMA", "constrain the output to JSON valid against SCHEMA, a JSON schema "
         "object, e.g. '{\"type\": \"object\"}'; written compactly (no whitespace between JSON tokens), as the "
         "server's response_format; needs llguidance", nonempty(o.json_schema, "a JSON schema"), nullptr},
        {{"-jf", "--json-schema-file"}, "FILE", "read the --json-schema from FILE",
         nonempty(o.json_schema_file, "a file path"), nullptr},
        {{"--verbose-prompt"}, "", "print every prompt text the model evaluates (chat turns included) to stderr",
         nullptr, on(o.verbose_prompt)},
        {{"--inspect"}, "", "print the model's metadata, tensor table, per-type totals and bits "
         "per weight, then exit", nullptr, on(o.inspect)},
        {{"-c", "--ctx-size"}, "N", "context length in tokens; 0 = the model's training context (default 4096)",
         i32(o.ctx_size, 0, kMaxI32, "an integer >= 0"), nullptr},
        {{"--temp"}, "T", "sampling temperature; 0 = greedy (default 0.8)",
         f32(o.temp, 0, 100, false, "a number from 0 to 100 (0 = greedy)"), nullptr},
        {{"--top-p"}, "P", "nucleus sampling: keep the smallest set of tokens with probability >= P; "
         "0 < P <= 1; 1 = off (default 0.95)",
         f32(o.top_p, 0, 1, true, "a number between 0 and 1, greater than 0 (1 = off)"), nullptr},
        {{"--top-k"}, "K", "keep the K most likely tokens; 0 = off (default 40)",
         i32(o.top_k, 0, kMaxI32, "an integer >= 0"), nullptr},
        {{"--min-p"}, "P", "drop tokens below P times the most likely token's probability; 0 = off "
         "(default 0.05)", f32(o.min_p, 0, 1, false, "a number between 0 and 1 (0 = off)"), nullptr},
        {{"--repeat-penalty"}, "X", "penalize tokens seen in the last --repeat-last-n; 1 = off "
         "(default 1.0)", f32(o.repeat_penalty, 0, 100, true, "a number in (0, 100] (1 = off)"), nullptr},
        {{"--repeat-last-n"}, "N", "tokens considered by --repeat-penalty; -1 = whole context, 0 = "
         "off (default 64)", i32(o.repeat_last_n, -1, kMaxI32, "an integer >= -1"), nullptr},
        {{"--frequency-penalty"}, "X", "subtract X times a token's count in the last --repeat-last-n tokens "
         "from its logit; -2 .. 2, 0 = off (default 0)",
         f32(o.frequency_penalty, -2, 2, false, "a number from -2 to 2 (0 = off)"), nullptr},
        {{"--presence-penalty"}, "X", "subtract X from the logit of every token seen in the last "
         "--repeat-last-n tokens; -2 .. 2, 0 = off (default 0)",
         f32(o.presence_penalty, -2, 2, false, "a number from -2 to 2 (0 = off)"), nullptr},
        {{"-l", "--logit-bias"}, "ID(+|-)BIAS", "add BIAS to token ID's logit, e.g. 15043+1 or 15043-inf "
         "(-inf or <= -100 bans it); repeat the flag for more tokens",
         [&o](S f, S v) { o.logit_bias.push_back(parse_logit_bias(f, v)); }, nullptr},
        {{"-s", "--seed"}, "N", "random seed, 0 .. 18446744073709551614 (the seed a run prints replays it); "
         "-1 = random (default -1)",
         [&o](S f, S v) { o.seed = parse_seed(f, v); }, nullptr},
        {{"-ngl", "--n-gpu-layers"}, "N", "layers to run on the GPU, the rest on the CPU; -1 = all "
         "(default -1; ignored without CUDA)", i32(o.n_gpu_layers, -1, kMaxI32, "an integer >= -1"),
         nullptr},
        {{"-ctk", "--cache-type-k"}, "TYPE", "KV cache type for keys: f16 or q8_0 (default f16)",
         [&o](S f, S v) { o.cache_type_k = parse_cache_type(f, v); }, nullptr},
        {{"-ctv", "--cache-type-v"}, "TYPE", "KV cache type for values: f16 or q8_0 (default f16)",
         [&o](S f, S v) { o.cache_type_v = parse_cache_type(f, v); }, nullptr},
        {{"-fa", "--flash-attn"}, "", "fused attention over the KV cache without a score matrix", nullptr, on(o.flash_attn)},
        {{"--cuda-graph"}, "", "replay each decode step shape as a captured CUDA graph (default on; "
         "GPU layers only)", nullptr, on(o.cuda_graph)},
        {{"--no-cuda-graph"}, "", "launch every GPU kernel of every step instead of replaying CUDA graphs",
         nullptr, [&o](bool b) { o.cuda_graph = !b; }},
        {{"--no-mmap"}, "", "read the whole model file into memory (2 MiB pages where the kernel allows) "
         "instead of mapping it", nullptr, [&o](bool b) { o.use_mmap = !b; }},
        {{"--no-huge-pages"}, "", "decode from the file mapping: by default the weights the CPU reads for every "
         "token are copied into 2 MiB pages (Linux transparent huge pages, when the copy takes at most half "
         "of the available memory), which decode reads faster", nullptr, [&o](bool b) { o.huge_pages = !b; }},
        {{"--no-repack"}, "", "copy the weights into huge pages in the file's order: by default, on AVX-512 "
         "CPUs, PTQ1_0 matrices of 1024 or more columns are regrouped 8 blocks at a time and Q8_0 ones "
         "interleaved 4 rows at a time, which the kernels read faster (same bytes, same results)", nullptr,
         [&o](bool b) { o.repack = !b; }},
        {{"-np", "--parallel"}, "N", "N > 1: every non-blank line of -f FILE is its own prompt, N decoded "
         "together by continuous batching; -c is the context of EACH slot (the KV cache holds N x c tokens); "
         "prompt i samples with seed + i; outputs print as they finish, lines prefixed [i] (default 1)",
         i32(o.parallel, 1, 64, "an integer from 1 to 64"), nullptr},
        {{"-b", "--batch-size"}, "N", "prompt tokens per forward pass (default 512)",
         i32(o.batch_size, 1, kMaxI32, "an integer >= 1"), nullptr},
        {{"--cache-prompt"}, "", "reuse the KV cache of a prompt prefix shared between requests (--parallel)",
         nullptr, on(o.cache_prompt)},
        {{"-t", "--threads"}, "N", "CPU threads; 0 = one per hardware thread (default 0)",
         i32(o.threads, 0, 4096, "an integer from 0 to 4096"), nullptr},
        {{"-h", "--help"}, "", "show this help and exit", nullptr, on(o.help)},
        {{"--version"}, "", "print the version and build (compiler, CPU features, CUDA) and exit", nullptr,
         on(o.version)},
    };
}

const Flag* find_flag(const std::vector<Flag>& flags, const std::string& name) {
    for (const Flag& f : flags)
        for (const std::string& n : f.names)
            if (n == name) return &f;
    return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
            diag = up;
        }
    }
    return row[b.size()];
}

[[noreturn]] void unknown_flag(const std::vector<Flag>& flags, const std::string& name) {
    std::string best;
    size_t best_d = 3;
    for (const Flag& f : flags) {
        const size_t d = edit_distance(name, f.long_name());
        if (d < best_d) {
            best_d = d;
            best = f.long_name();
        }
    }
    throw Error("unknown flag '" + name + "'" + (best.empty() ? "" : " (did you mean " + best + "?)"));
}

// Applies a list of arguments (already split into tokens) to the options.
void apply_args(const std::vector<Flag>& flags, const std::vector<std::string>& args) {
    for (size_t k = 0; k < args.size(); ++k) {
        const std::string& arg = args[k];
        if (arg.size() < 2 || arg[0] != '-') {
            throw Error("unexpected argument '" + arg +
                        "'; flags start with '-' (to give a prompt use -p \"TEXT\")");
        }
        const size_t eq = arg.find('=');
        const std::string name = arg.substr(0, eq);
        const Flag* f = find_flag(flags, name);
        if (!f) unknown_flag(flags, name);
        if (f->set_bool) {
            if (eq != std::string::npos)
                throw Error(name + " takes no value (got '" + arg.substr(eq + 1) + "')");
            f->set_bool(true);
            continue;
        }
        std::string value;
        if (eq != std::string::npos) {
            value = arg.substr(eq + 1);
        } else if (k + 1 < args.size()) {
            value = args[++k];
        } else {
            throw Error(name + " needs a value (" + f->metavar + ")");
        }
        // a short flag is named with its long name too: "invalid value '0' for -n (--n-predict)"
        f->set_value(name == f->long_name() ? name : name + " (" + f->long_name() + ")", value);
    }
}

void apply_config(const std::vector<Flag>& flags, const std::string& path) {
    const std::string text = read_input_file(path, "the --config file", "--config", size_t{1} << 20);
    for (const auto& [raw_key, value] : read_config_object(text, path)) {
        std::string key = raw_key;
        for (char& ch : key)
            if (ch == '_') ch = '-';
        const Flag* f = find_flag(flags, "--" + key);
        if (!f || key == "config")
            throw Error("--config " + path + ": unknown key \"" + raw_key + "\"; keys are long flag "
                        "names without dashes, e.g. \"ctx-size\"");
        if (f->set_bool) {
            if (value != "true" && value != "false")
                throw Error("--config " + path + ": \"" + raw_key + "\" must be true or false");
            f->set_bool(value == "true");
        } else {
            f->set_value("\"" + raw_key + "\" in " + path, value);
        }
    }
}

}  // namespace

RunOptions parse_run_args(int argc, const char* const* argv) {
    RunOptions o;
    const std::vector<Flag> flags = make_flags(o);
    std::vector<std::string> args(argv + 1, argv + argc);

    // --config is applied first so that every other command-line flag overrides it.
    RunOptions probe;
    apply_args(make_flags(probe), args);
    if (!probe.config.empty()) apply_config(flags, probe.config);
    apply_args(flags, args);

    if (o.help || o.version) return o;
    if (o.model.empty()) throw Error("--model is required (the GGUF file to run)");
    if (o.has_prompt && !o.prompt_file.empty())
        throw Error("-p/--prompt and -f/--file cannot be used together; give the prompt one way");
    if (o.interactive && o.inspect) throw Error("--interactive and --inspect cannot be used together");
    if (!o.system_prompt.empty() && !o.interactive)
        throw Error("-sys/--system-prompt is the system message of a chat; add -i (or put the text in the prompt)");
    std::vector<std::string> constraints;
    for (const auto& [value, name] : {std::pair{&o.grammar, "--grammar"}, {&o.grammar_file, "--grammar-file"},
                                      {&o.json_schema, "-j/--json-schema"}, {&o.json_schema_file, "-jf/--json-schema-file"}})
        if (!value->empty()) constraints.push_back(name);
    if (constraints.size() > 1)
        throw Error(constraints[0] + " and " + constraints[1] + " cannot be used together; give one grammar or schema");
    if (o.escape) {
        o.prompt = process_escapes(o.prompt);
        for (std::string& r : o.reverse_prompts) r = process_escapes(r);
    }
    return o;
}

std::string process_escapes(const std::string& text) {
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\\' || i + 1 == text.size()) {
            out += text[i];
            continue;
        }
        const char e = text[++i];
        switch (e) {
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case '\'': case '"': case '\\': out += e; break;
            case 'x':
                if (i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
                    out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
                    i += 2;
                } else {
                    out += "\\x";
                }
                break;
            default: out += '\\'; out += e; break;
        }
    }
    return out;
}

namespace {

std::string synopsis(const std::string& prog) {
    return "usage: " + prog + " -m MODEL.gguf [-p PROMPT | -f FILE | -i] [options]\n"
           "       " + prog + " -m MODEL.gguf --inspect\n"
           "       " + prog + " --version\n";
}

constexpr size_t kHelpIndent = 30;
constexpr size_t kHelpWidth = 100;

// Word-wraps a help text to kHelpWidth columns, continuation lines indented by kHelpIndent.
std::string wrap(const std::string& text) {
    std::string out, word;
    size_t col = kHelpIndent;
    std::istringstream in(text);
    while (in >> word) {
        if (col > kHelpIndent && col + 1 + word.size() > kHelpWidth) {
            out += "\n" + std::string(kHelpIndent, ' ');
            col = kHelpIndent;
        } else if (col > kHelpIndent) {
            out += ' ';
            ++col;
        }
        out += word;
        col += word.size();
    }
    return out;
}

}  // namespace

std::string run_usage(const std::string& prog) {
    return synopsis(prog) + "run '" + prog + " --help' for every flag\n";
}

std::string run_help(const std::string& prog) {
    RunOptions o;
    std::string out = "bonsai_run: run a GGUF model (PTQ1_0 and other ternary or 8-bit types) "
                      "with the bonsai-runner engine.\n\n" + synopsis(prog) +
                      "\nflags (values follow the flag or '='):\n";
    for (const Flag& f : make_flags(o)) {
        std::string names;
        for (const std::string& n : f.names) names += (names.empty() ? "" : ", ") + n;
        if (!f.metavar.empty()) names += " " + f.metavar;
        std::string line = "  " + names;
        if (line.size() < kHelpIndent) line.resize(kHelpIndent, ' ');
        else line += "\n" + std::string(kHelpIndent, ' ');
        out += line + wrap(f.help) + "\n";
    }
    out += "\nexamples:\n"
           "  " + prog + " -m model.gguf -p \"Write a haiku about trees\" -n 64\n"
           "  " + prog + " -m model.gguf -i -c 8192 --temp 0.7 --top-p 0.9\n"
           "  " + prog + " -m model.gguf -i -sys \"You are terse.\" -r \"User:\"\n"
           "  " + prog + " -m model.gguf -f prompt.txt -ngl 99 -fa -ctk q8_0 -ctv q8_0\n"
           "  " + prog + " -m model.gguf -p \"Name a color as JSON:\" -j '{\"type\": \"object\", \"properties\": "
           "{\"color\": {\"enum\": [\"red\", \"green\"]}}, \"required\": [\"color\"]}'\n"
           "  " + prog + " -m model.gguf -p \"Answer:\" --grammar 'root ::= (\"yes\" | \"no\") \".\"'\n"
           "  " + prog + " -m model.gguf --inspect\n";
    return out;
}

}  // namespace bonsai
