// bonsai_run generation (see generate.h).
//
// Flow: validate the options that need no model, load the model and create one context (the KV
// cache and compute buffers are allocated there, once), print the per-layer device/type table and
// the memory of weights / KV cache / compute buffers, then
//   prompt mode: tokenize, prefill (the context runs it in --batch-size chunks), sample up to -n
//     tokens, streaming each piece as soon as it completes a UTF-8 sequence, stop at end of text;
//   chat mode (-i): read lines from stdin, render each as a turn of the file's chat template
//     (bonsai/chat_format.h; ChatML when the file has no template but the vocabulary has
//     <|im_start|>, plain "User:/Assistant:" turns when the template is not recognised), answer,
//     repeat until EOF or "/exit". The cache keeps the whole conversation, so each turn only
//     prefills the text it adds (its user turn, the generation prompt, the end of the last reply).
// A reply ends at an end-of-generation token (never with --ignore-eos, which also bans them from
// sampling, as llama.cpp does), after -n tokens, at a full context, or when the output ends with a
// reverse prompt (-r): chat mode then hands the turn back, prompt mode stops.
// With --grammar / --json-schema (grammar.h) every reply is constrained: before each draw the tokens
// the grammar forbids get -inf (after logit bias and penalties, before top-k/top-p/min-p/temp),
// the drawn token advances the matcher, end-of-generation is allowed only where the grammar may
// end, and in chat mode each reply starts the grammar afresh. With --ignore-eos the reply also
// ends where the grammar admits nothing more (it could only be followed by end-of-generation).
// Timing: load, prompt (prefill) tokens/s and generation tokens/s are reported at the end.
#include "bonsai/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bonsai/chat_format.h"
#include "bonsai/context.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/grammar.h"
#include "bonsai/input_file.h"
#include "bonsai/model.h"
#include "bonsai/sampling.h"
#include "bonsai/vocab.h"
#include "generate_common.h"
#include "sys_memory.h"

namespace bonsai {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Timing {
    double load_ms = 0, prompt_ms = 0, gen_ms = 0;
    int64_t prompt_tokens = 0, gen_tokens = 0;
};

}  // namespace

std::string read_prompt_file(const std::string& path) {
    return read_input_file(path, "the prompt file", "-f", size_t{1} << 30);
}

std::shared_ptr<const Model> load_model_for_run(const RunOptions& o) {
    ModelParams mp;
    mp.use_mmap = o.use_mmap;
    mp.huge_pages = o.huge_pages;
    mp.repack = o.repack;
    mp.n_gpu_layers = o.n_gpu_layers;
    mp.tokenizer_path = o.tokenizer;
    return Model::load(o.model, mp);
}

ContextParams context_params_from(const RunOptions& o, int n_ctx, int n_seq_max) {
    ContextParams cp;
    cp.n_ctx = n_ctx;
    cp.n_seq_max = n_seq_max;
    cp.n_batch = o.batch_size;
    cp.n_threads = o.threads;
    cp.type_k = o.cache_type_k;
    cp.type_v = o.cache_type_v;
    cp.flash_attn = o.flash_attn;
    cp.cuda_graph = o.cuda_graph;
    return cp;
}

GrammarSource grammar_source_from(const RunOptions& o) {
    using K = GrammarSource::Kind;
    auto file = [](K kind, const std::string& path, const char* flag, const char* what) {
        return GrammarSource{kind, read_input_file(path, what, flag, size_t{16} << 20), std::string(flag) + " " + path};
    };
    if (!o.grammar.empty()) return {K::GRAMMAR, o.grammar, "--grammar"};
    if (!o.json_schema.empty()) return {K::JSON_SCHEMA, o.json_schema, "-j/--json-schema"};
    if (!o.grammar_file.empty()) return file(K::GRAMMAR, o.grammar_file, "--grammar-file", "the grammar file");
    if (!o.json_schema_file.empty())
        return file(K::JSON_SCHEMA, o.json_schema_file, "--json-schema-file", "the JSON schema file");
    return {};  // parse_run_args lets at most one of the four through
}

SamplingParams sampling_from(const RunOptions& o) {
    SamplingParams p;
    p.temp = o.temp;
    p.top_k = o.top_k;
    p.top_p = o.top_p;
    p.min_p = o.min_p;
    p.repeat_penalty = o.repeat_penalty;
    p.repeat_last_n = o.repeat_last_n;
    p.frequency_penalty = o.frequency_penalty;
    p.presence_penalty = o.presence_penalty;
    p.logit_bias = o.logit_bias;
    p.seed = o.seed;
    validate_sampling_params(p);
    return p;
}

// Token ids that end a generation: EOS plus the usual end-of-turn markers the vocabulary has.
std::vector<int32_t> end_tokens(const Vocab& v) {
    std::vector<int32_t> ids = v.eog_ids();  // EOS, EOT and the end-of-turn tokens of chat formats
    if (v.eos() >= 0) ids.push_back(v.eos());
    for (const char* t : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>"}) {
        const int32_t id = v.find_token(t);
        if (id >= 0 && v.is_control(id)) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

const float* ban_tokens(const float* logits, int64_t n_vocab, const std::vector<int32_t>& ids,
                        std::vector<float>& scratch) {
    if (ids.empty()) return logits;
    scratch.assign(logits, logits + n_vocab);
    for (int32_t id : ids)
        if (id >= 0 && id < n_vocab) scratch[id] = -INFINITY;
    return scratch.data();
}

void print_verbose_prompt(const std::string& text, size_t n_tokens) {
    std::fprintf(stderr, "\n--- prompt (%zu tokens) ---\n%s\n--- end prompt ---\n", n_tokens, text.c_str());
}

bool hit_reverse_prompt(const std::string& text, size_t n_new, const std::vector<std::string>& prompts) {
    for (const std::string& r : prompts) {
        // an occurrence that ends after text.size() - n_new starts at or after this position
        const size_t old_end = text.size() - std::min(n_new, text.size());
        const size_t from = old_end + 1 > r.size() ? old_end + 1 - r.size() : 0;
        if (text.find(r, from) != std::string::npos) return true;
    }
    return false;
}

namespace {

// How a reply ended, and its text.
struct Reply {
    std::string text;
    int32_t eog = -1;            // the end-of-generation token that ended it, -1 = none
    bool reverse_prompt = false; // the output ended with a -r text
    bool context_full = false;   // no room left in the context
};

class Runner {
public:
    Runner(std::shared_ptr<const Model> model, Context& ctx, Sampler& sampler, Timing& timing, const RunOptions& o,
           const Grammar* grammar)
        : model_(std::move(model)), ctx_(ctx), sampler_(sampler), timing_(timing), o_(o),
          vocab_(model_->vocab()), stops_(end_tokens(vocab_)) {
        if (o.ignore_eos) banned_.swap(stops_);
        if (grammar != nullptr) grammar_ = std::make_unique<GrammarMatcher>(*grammar);
    }

    // Tokenizes prompt text (special tokens parsed) and feeds it; `verbose_prompt` prints it first.
    // BOS is added before the first text when the vocabulary wants one and the text has none.
    const float* feed_text(const std::string& text) {
        std::vector<int32_t> toks = vocab_.tokenize(text, false, true);
        if (n_past_ == 0 && vocab_.add_bos() && vocab_.bos() >= 0 && (toks.empty() || toks[0] != vocab_.bos()))
            toks.insert(toks.begin(), vocab_.bos());
        if (o_.verbose_prompt) print_verbose_prompt(text, toks.size());
        if (toks.empty()) return nullptr;
        return feed(toks, true);
    }

    // Feeds tokens at the end of the sequence; returns the logits of the last one.
    const float* feed(const std::vector<int32_t>& toks, bool is_prompt) {
        if (n_past_ + static_cast<int64_t>(toks.size()) > ctx_.n_ctx()) {
            throw Error("the input is " + std::to_string(toks.size()) + " tokens but only " +
                        std::to_string(ctx_.n_ctx() - n_past_) + " of the context's " +
                        std::to_string(ctx_.n_ctx()) + " remain; raise --ctx-size or shorten the prompt");
        }
        Batch b;
        for (size_t i = 0; i < toks.size(); ++i) {
            b.add(toks[i], static_cast<int32_t>(n_past_ + i), 0, i + 1 == toks.size());
        }
        const auto t0 = Clock::now();
        ctx_.decode(b);
        (is_prompt ? timing_.prompt_ms : timing_.gen_ms) += ms_since(t0);
        if (is_prompt) timing_.prompt_tokens += static_cast<int64_t>(toks.size());
        n_past_ += static_cast<int64_t>(toks.size());
        for (int32_t t : toks) sampler_.accept(t);
        return ctx_.logits(-1);
    }

    // Samples up to n_predict tokens (-1: until end of text or a full context), streaming them.
    // An end-of-generation token that ends the reply is in the cache too; so is a reverse prompt.
    Reply generate(const float* logits, int64_t n_predict) {
        TokenStreamDecoder stream(vocab_);
        const int64_t n_vocab = model_->hparams().n_vocab;
        Reply reply;
        if (grammar_) grammar_->reset();
        for (int64_t i = 0; n_predict < 0 || i < n_predict; ++i) {
            if (grammar_ && o_.ignore_eos && grammar_->is_stopped()) break;
            const auto t0 = Clock::now();
            const int32_t tok =
                sampler_.sample(ban_tokens(logits, n_vocab, banned_, scratch_), n_vocab, grammar_.get());
            const bool stop = std::find(stops_.begin(), stops_.end(), tok) != stops_.end();
            if (grammar_ && !stop) grammar_->accept(tok);
            timing_.gen_ms += ms_since(t0);
            if (!stop) {
                const std::string piece = stream.push(tok);
                std::fwrite(piece.data(), 1, piece.size(), stdout);
                std::fflush(stdout);
                reply.text += piece;
                reply.reverse_prompt = hit_reverse_prompt(reply.text, piece.size(), o_.reverse_prompts);
                ++timing_.gen_tokens;
            }
            if (n_past_ >= ctx_.n_ctx()) {
                std::fprintf(stderr, "\n[context full after %lld tokens; raise --ctx-size for longer output]\n",
                             static_cast<long long>(n_past_));
                reply.context_full = true;
                break;
            }
            logits = feed({tok}, false);
            if (stop) reply.eog = tok;
            if (stop || reply.reverse_prompt) break;
        }
        const std::string rest = stream.flush();
        std::fwrite(rest.data(), 1, rest.size(), stdout);
        std::fflush(stdout);
        reply.text += rest;
        return reply;
    }

    int64_t n_past() const { return n_past_; }

private:
    std::shared_ptr<const Model> model_;
    Context& ctx_;
    Sampler& sampler_;
    Timing& timing_;
    const RunOptions& o_;
    const Vocab& vocab_;
    std::vector<int32_t> stops_;   // end-of-generation tokens that end a reply
    std::vector<int32_t> banned_;  // --ignore-eos: the same tokens, never sampled
    std::vector<float> scratch_;
    std::unique_ptr<GrammarMatcher> grammar_;  // --grammar / --json-schema, else null
    int64_t n_past_ = 0;
};

}  // namespace

void print_load_report(const Model& m, const Context& ctx, const RunOptions& o) {
    const Hparams& hp = m.hparams();
    std::fprintf(stderr, "model: %s (%s, %lld layers, n_embd %lld, %lld heads / %lld kv, vocab %lld)\n",
                 o.model.c_str(), hp.arch.c_str(), static_cast<long long>(hp.n_layer),
                 static_cast<long long>(hp.n_embd), static_cast<long long>(hp.n_head),
                 static_cast<long long>(hp.n_head_kv), static_cast<long long>(hp.n_vocab));
    std::fputs(m.layer_table().c_str(), stderr);
    const ModelMemory mm = m.memory_report();
    std::string types;
    for (const auto& [name, bytes] : mm.bytes_by_type) types += " " + name + " " + format_bytes(bytes) + ",";
    if (!types.empty()) types.pop_back();
    const ContextMemory cm = ctx.memory_report();
    std::fprintf(stderr, "memory (CPU): weights %s (%s;%s), KV cache %s (n_ctx %d, K %s, V %s), compute buffers %s\n",
                 format_bytes(mm.weights_bytes).c_str(), mm.mapped ? "mapped" : "read into memory", types.c_str(),
                 format_bytes(cm.kv_bytes).c_str(), ctx.n_ctx(), type_traits(ctx.params().type_k)->name,
                 type_traits(ctx.params().type_v)->name, format_bytes(cm.compute_bytes + cm.logits_bytes).c_str());
    if (mm.n_gpu_layers > 0) {
        std::string gtypes;
        for (const auto& [name, bytes] : mm.gpu_bytes_by_type) gtypes += " " + name + " " + format_bytes(bytes) + ",";
        if (!gtypes.empty()) gtypes.pop_back();
        std::fprintf(stderr, "memory (GPU): weights %s (%d layers%s;%s), KV cache %s, compute buffers %s, logits %s\n",
                     format_bytes(mm.gpu_weights_bytes).c_str(), mm.n_gpu_layers,
                     mm.gpu_output ? " + output head" : "", gtypes.c_str(), format_bytes(cm.gpu_kv_bytes).c_str(),
                     format_bytes(cm.gpu_compute_bytes).c_str(), format_bytes(cm.gpu_logits_bytes).c_str());
    }
    std::fprintf(stderr, "threads: %d, batch size %d%s%s\n", ctx.n_threads(), ctx.params().n_batch,
                 ctx.params().flash_attn ? ", flash attention" : "",
                 mm.n_gpu_layers > 0 && ctx.params().cuda_graph && !ctx.recurrent() ? ", CUDA graphs" : "");
}

namespace {

void print_timing(const Timing& t) {
    auto rate = [](int64_t n, double ms) { return ms > 0 ? 1000.0 * static_cast<double>(n) / ms : 0.0; };
    std::fprintf(stderr, "\n\ntiming: load %.1f ms | prompt %lld tokens in %.1f ms (%.2f tokens/s) | "
                 "generation %lld tokens in %.1f ms (%.2f tokens/s)\n",
                 t.load_ms, static_cast<long long>(t.prompt_tokens), t.prompt_ms, rate(t.prompt_tokens, t.prompt_ms),
                 static_cast<long long>(t.gen_tokens), t.gen_ms, rate(t.gen_tokens, t.gen_ms));
}

// The chat format of the model's template. A file without a template whose vocabulary has the
// ChatML markers is chatted with in ChatML, as most small instruction-tuned models expect.
ChatFormat chat_format_of(const Model& m) {
    const Vocab& v = m.vocab();
    const GgufValue* t = m.gguf().find("tokenizer.chat_template");
    const std::string tmpl = t && t->type == GgufValueType::STRING && !t->s.empty() ? t->s[0] : "";
    const std::string bos = v.bos() >= 0 ? v.token_text(v.bos()) : "";
    const std::string eos = v.eos() >= 0 ? v.token_text(v.eos()) : "";
    const bool has_chatml = v.find_token("<|im_start|>") >= 0 && v.find_token("<|im_end|>") >= 0;
    if (tmpl.empty()) {
        if (has_chatml) {
            std::fprintf(stderr, "note: the model file has no chat template; its vocabulary has <|im_start|>, "
                         "so the chat uses ChatML turns\n");
            return detect_chat_format("<|im_start|>", bos, eos);
        }
        std::fprintf(stderr, "note: the model file has no chat template (tokenizer.chat_template); the chat "
                     "uses plain User:/Assistant: turns\n");
        return detect_chat_format("", bos, eos);
    }
    ChatFormat f = detect_chat_format(tmpl, bos, eos);
    if (f.family == ChatFamily::PLAIN) {
        std::fprintf(stderr, "note: the model's chat template is not one of the formats bonsai_run knows "
                     "(ChatML, Llama 2/3, Mistral, Gemma, Phi-3, Zephyr, DeepSeek 2/3, Vicuna); the chat uses "
                     "plain User:/Assistant: turns\n");
    }
    return f;
}

void run_chat(Runner& r, const Vocab& v, const RunOptions& o, ChatSession& chat, const std::string& first) {
    std::fprintf(stderr, "chat mode (%s turns): type a message and press enter; /exit or end of input quits\n",
                 chat.format().name());
    std::string line = first;
    bool have_line = !first.empty();
    while (true) {
        if (!have_line) {
            std::fputs("\n> ", stderr);
            std::fflush(stderr);
            if (!std::getline(std::cin, line) || line == "/exit") break;
            if (line.empty()) continue;
            if (o.escape) line = process_escapes(line);  // typed lines too, as llama-cli does
        }
        have_line = false;
        const float* logits = r.feed_text(chat.add_user(line));
        if (logits == nullptr) throw Error("the chat turn tokenized to nothing");
        const Reply reply = r.generate(logits, o.n_predict);
        if (reply.context_full) break;  // nothing more fits; the chat ends here
        const std::string eog_text = reply.eog >= 0 ? v.token_to_piece(reply.eog, true) : "";
        const std::string closing = chat.end_reply(reply.text, eog_text);
        if (!closing.empty()) r.feed_text(closing);
    }
}

}  // namespace

int run_generate(const RunOptions& o) {
    if (o.n_predict == 0 || o.n_predict < -1) {
        throw Error("-n/--n-predict must be a positive number of tokens (or -1 = until end of text), got " +
                    std::to_string(o.n_predict));
    }
    if (o.cache_type_k != TYPE_F16 && o.cache_type_k != TYPE_Q8_0) {
        throw Error("--cache-type-k must be f16 or q8_0");
    }
    if (o.cache_type_v != TYPE_F16 && o.cache_type_v != TYPE_Q8_0) {
        throw Error("--cache-type-v must be f16 or q8_0");
    }
    if (o.parallel > 1) return run_generate_parallel(o);
    const SamplingParams sp = sampling_from(o);
    const GrammarSource grammar_src = grammar_source_from(o);
    std::string prompt;
    if (o.has_prompt && !o.prompt_file.empty()) throw Error("give the prompt with -p or -f, not both");
    if (o.has_prompt) prompt = o.prompt;
    if (!o.prompt_file.empty()) prompt = read_prompt_file(o.prompt_file);
    if (o.escape && !o.prompt_file.empty()) prompt = process_escapes(prompt);
    if (!o.interactive) {
        if (!o.has_prompt && o.prompt_file.empty()) {
            throw Error("no prompt: give -p TEXT or -f FILE (or -i for an interactive chat)");
        }
        if (prompt.empty()) throw Error("the prompt is empty; give some text with -p or -f");
    }

    Timing timing;
    const auto t_load = Clock::now();
    std::shared_ptr<const Model> model = load_model_for_run(o);
    Context ctx(model, context_params_from(o, o.ctx_size > 0 ? o.ctx_size
                                                           : static_cast<int>(model->hparams().n_ctx_train)));
    timing.load_ms = ms_since(t_load);
    print_load_report(*model, ctx, o);
    if (o.cache_prompt) std::fprintf(stderr, "note: --cache-prompt has no effect on a single prompt\n");
    if (model->hparams().n_ctx_train > 0 && ctx.n_ctx() > model->hparams().n_ctx_train) {
        std::fprintf(stderr, "note: --ctx-size %d exceeds the model's training context %lld; quality may drop "
                     "past it\n", ctx.n_ctx(), static_cast<long long>(model->hparams().n_ctx_train));
    }

    const std::unique_ptr<Grammar> grammar =
        grammar_for_run(grammar_src, model->vocab(), model->hparams().n_vocab, end_tokens(model->vocab()));
    Sampler sampler(sp);
    std::fprintf(stderr, "sampling: temp %.2f, top_k %d, top_p %.2f, min_p %.2f, repeat_penalty %.2f "
                 "(last %d), seed %llu\n\n", sp.temp, sp.top_k, sp.top_p, sp.min_p, sp.repeat_penalty,
                 sp.repeat_last_n, static_cast<unsigned long long>(sampler.seed()));
    Runner runner(model, ctx, sampler, timing, o, grammar.get());
    const Vocab& vocab = model->vocab();
    if (o.interactive) {
        ChatSession chat(chat_format_of(*model));
        if (!o.system_prompt.empty()) chat.set_system(o.system_prompt);
        run_chat(runner, vocab, o, chat, prompt);
    } else {
        const std::vector<int32_t> toks = vocab.tokenize(prompt, true, true);
        if (toks.empty()) throw Error("the prompt tokenized to nothing; give some text with -p or -f");
        if (static_cast<int64_t>(toks.size()) >= ctx.n_ctx()) {
            throw Error("the prompt is " + std::to_string(toks.size()) + " tokens but the context holds " +
                        std::to_string(ctx.n_ctx()) + "; raise --ctx-size or shorten the prompt");
        }
        std::fwrite(prompt.data(), 1, prompt.size(), stdout);
        std::fflush(stdout);
        if (o.verbose_prompt) print_verbose_prompt(prompt, toks.size());
        const float* logits = runner.feed(toks, true);
        runner.generate(logits, o.n_predict);
    }
    print_timing(timing);
    return 0;
}

}  // namespace bonsai
