// bonsai_run --parallel N: many prompts generated concurrently by continuous batching.
//
// Input: every non-blank line of -f FILE is one prompt (a trailing '\r' is dropped); prompt i
// (0-based, blank lines not counted) samples with seed + i (modulo 2^64 - 1, see offset_seed), so
// with the same seed it draws the same tokens as a single run `--seed <seed+i> -p <line>`, and with
// --temp 0 the same text.
//
// Memory: one Context with S = min(N, prompts) sequence ids (the slots) and S * C KV cells, where
// C = --ctx-size (0: the model's training context) is the context of EACH slot: a sequence holds
// at most C tokens (prompt + generated), exactly as a single run with -c C does, so S sequences
// always fit at once.
//
// Step loop: each step is ONE Context::decode whose batch holds, in this order,
//   1. the last sampled token of every generating slot (logits flagged), then
//   2. prompt tokens of slots still prefilling, oldest first, until the batch has --batch-size
//      tokens; the last prompt token of a slot whose prefill completes is flagged.
// Every flagged row is sampled by its slot's own Sampler. A sequence leaves its slot at an
// end-of-generation token, after -n tokens, or when its slot context is full; its text (the prompt
// echoed, then the generation, as a single run prints them) goes to stdout at once, every line
// prefixed by "[i] ", so the outputs of different sequences never interleave. The next waiting
// prompt then takes the slot at the start of the next step.
//
// Slot state: `cached` lists the tokens whose KV the slot's sequence holds, at positions
// 0..cached.size()-1, always exactly. Without --cache-prompt a finished slot's KV is removed
// (seq_rm) at once. With it the KV stays; a newcomer takes the free slot whose cached tokens share
// the longest prefix with its prompt and removes the rest, or, when another slot (busy or free)
// shares a longer prefix, clears its own and shares those cells with seq_cp (no K/V copied). At
// least the last prompt token is always evaluated so there are logits to sample from. A token's
// KV depends only on the tokens before it, so the output does not change with reuse.
//
// With --grammar / --json-schema every sequence has its own matcher (created when it takes a slot),
// applied as in a single run (generate.cpp).
//
// Timing (stderr): per sequence, its prompt/generated token counts and generated tokens/s over
// the time it held a slot; then aggregate prompt and generation tokens/s over the whole run.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bonsai/context.h"
#include "bonsai/error.h"
#include "bonsai/generate.h"
#include "bonsai/model.h"
#include "bonsai/sampling.h"
#include "bonsai/vocab.h"
#include "generate_common.h"

namespace bonsai {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

struct PromptSeq {
    std::string text;             // the prompt line
    int line = 0;                 // 1-based line in the file
    std::vector<int32_t> tokens;  // tokenized with BOS, as a single run does
    std::string output;           // generated text
    int64_t n_gen = 0;
    int64_t n_reused = 0;         // prompt tokens whose KV came from the cache
    const char* finish = "";
    Clock::time_point t_start, t_end;
};

struct Slot {
    int id = 0;
    int seq = -1;                    // index into the prompts, -1 = free
    std::vector<int32_t> cached;     // tokens whose KV the sequence holds, positions 0..size-1
    int32_t pending = -1;            // sampled token to evaluate next step, -1 = none
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<GrammarMatcher> grammar;  // --grammar / --json-schema, else null
    std::unique_ptr<TokenStreamDecoder> stream;
};

// Every non-blank line; with `escape` (-e, the default) each line's escapes are processed after
// the split, so "\n" puts a newline inside that prompt.
std::vector<PromptSeq> read_prompt_lines(const std::string& path, bool escape) {
    const std::string data = read_prompt_file(path);
    std::vector<PromptSeq> out;
    size_t start = 0;
    int line = 0;
    while (start < data.size()) {
        size_t end = data.find('\n', start);
        if (end == std::string::npos) end = data.size();
        std::string text = data.substr(start, end - start);
        ++line;
        if (!text.empty() && text.back() == '\r') text.pop_back();
        if (text.find_first_not_of(" \t\v\f") != std::string::npos) {
            PromptSeq p;
            p.text = escape ? process_escapes(text) : std::move(text);
            p.line = line;
            out.push_back(std::move(p));
        }
        start = end + 1;
    }
    if (out.empty()) {
        throw Error("the prompt file '" + path + "' has no prompts; --parallel reads one prompt per line "
                    "(blank lines are skipped)");
    }
    return out;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

class ParallelRunner {
public:
    ParallelRunner(Context& ctx, const RunOptions& o, const SamplingParams& sp, uint64_t seed_base,
                   std::vector<PromptSeq>& seqs, int n_slots, int slot_ctx, const Grammar* grammar)
        : ctx_(ctx), o_(o), sp_(sp), seed_base_(seed_base), seqs_(seqs), slot_ctx_(slot_ctx), grammar_(grammar),
          vocab_(ctx.model().vocab()), stops_(end_tokens(vocab_)), n_vocab_(ctx.model().hparams().n_vocab) {
        if (o.ignore_eos) banned_.swap(stops_);  // --ignore-eos: never stop at, never sample them
        slots_.resize(n_slots);
        for (int i = 0; i < n_slots; ++i) {
            slots_[i].id = i;
            slots_[i].stream = std::make_unique<TokenStreamDecoder>(vocab_);
        }
    }

    void run() {
        while (true) {
            admit();
            if (std::none_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.seq >= 0; })) break;
            step();
        }
    }

    int64_t prompt_tokens_evaluated() const { return n_prompt_eval_; }

private:
    // Gives free slots to waiting prompts, in file order.
    void admit() {
        while (next_ < seqs_.size()) {
            Slot* slot = pick_slot(seqs_[next_].tokens);
            if (slot == nullptr) return;
            start_seq(*slot, static_cast<int>(next_++));
        }
    }

    Slot* pick_slot(const std::vector<int32_t>& prompt) {
        Slot* best = nullptr;
        size_t best_lcp = 0;
        for (Slot& s : slots_) {
            if (s.seq >= 0) continue;
            const size_t lcp = o_.cache_prompt ? common_prefix(s.cached, prompt) : 0;
            if (best == nullptr || lcp > best_lcp) {
                best = &s;
                best_lcp = lcp;
            }
        }
        return best;
    }

    void start_seq(Slot& slot, int index) {
        PromptSeq& p = seqs_[index];
        const std::vector<int32_t>& prompt = p.tokens;
        size_t reuse = 0;
        if (o_.cache_prompt) {
            const size_t limit = prompt.size() - 1;  // evaluate at least the last prompt token
            // the longest prefix a slot keeps exactly (recurrent models: back to their checkpoint)
            auto reusable = [&](const Slot& s) {
                return static_cast<size_t>(
                    ctx_.seq_reusable(s.id, static_cast<int32_t>(std::min(common_prefix(s.cached, prompt), limit))));
            };
            const size_t own = reusable(slot);
            const Slot* donor = nullptr;
            size_t donor_lcp = own;
            for (const Slot& s : slots_) {
                if (&s == &slot) continue;
                const size_t lcp = reusable(s);
                if (lcp > donor_lcp) {
                    donor = &s;
                    donor_lcp = lcp;
                }
            }
            if (donor != nullptr) {
                ctx_.seq_rm(slot.id);
                ctx_.seq_cp(donor->id, slot.id, 0, static_cast<int32_t>(donor_lcp));
                reuse = donor_lcp;
            } else {
                ctx_.seq_rm(slot.id, static_cast<int32_t>(own), -1);
                reuse = own;
            }
        } else {
            ctx_.seq_rm(slot.id);
        }
        slot.cached.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(reuse));
        slot.seq = index;
        slot.pending = -1;
        SamplingParams sp = sp_;
        sp.seed = offset_seed(seed_base_, static_cast<uint64_t>(index));
        slot.sampler = std::make_unique<Sampler>(sp);
        for (int32_t t : prompt) slot.sampler->accept(t);
        if (grammar_ != nullptr) slot.grammar = std::make_unique<GrammarMatcher>(*grammar_);
        p.n_reused = static_cast<int64_t>(reuse);
        p.t_start = Clock::now();
    }

    bool prefilling(const Slot& s) const {
        return s.seq >= 0 && s.pending < 0 && s.cached.size() < seqs_[s.seq].tokens.size();
    }

    void step() {
        Batch b;
        std::vector<std::pair<Slot*, int32_t>> to_sample;  // slot, batch index of its logits
        std::vector<std::pair<Slot*, size_t>> fed;          // slot, tokens it got in this batch
        for (Slot& s : slots_) {
            if (s.seq < 0 || s.pending < 0) continue;
            to_sample.emplace_back(&s, static_cast<int32_t>(b.size()));
            b.add(s.pending, static_cast<int32_t>(s.cached.size()), s.id, true);
            fed.emplace_back(&s, 1);
        }
        std::vector<Slot*> waiting;
        for (Slot& s : slots_) {
            if (prefilling(s)) waiting.push_back(&s);
        }
        std::sort(waiting.begin(), waiting.end(), [](const Slot* a, const Slot* c) { return a->seq < c->seq; });
        for (Slot* s : waiting) {
            const size_t budget = b.size() < static_cast<size_t>(o_.batch_size) ? o_.batch_size - b.size() : 0;
            if (budget == 0) break;
            const std::vector<int32_t>& prompt = seqs_[s->seq].tokens;
            const size_t from = s->cached.size();
            const size_t take = std::min(prompt.size() - from, budget);
            for (size_t k = from; k < from + take; ++k) {
                const bool last = k + 1 == prompt.size();
                if (last) to_sample.emplace_back(s, static_cast<int32_t>(b.size()));
                b.add(prompt[k], static_cast<int32_t>(k), s->id, last);
            }
            fed.emplace_back(s, take);
            n_prompt_eval_ += static_cast<int64_t>(take);
        }
        ctx_.decode(b);
        for (auto& [s, n] : fed) {
            if (s->pending >= 0) {
                s->cached.push_back(s->pending);
                s->pending = -1;
            } else {
                const std::vector<int32_t>& prompt = seqs_[s->seq].tokens;
                s->cached.insert(s->cached.end(), prompt.begin() + static_cast<std::ptrdiff_t>(s->cached.size()),
                                 prompt.begin() + static_cast<std::ptrdiff_t>(s->cached.size() + n));
            }
        }
        for (auto& [s, i] : to_sample) sample_next(*s, ctx_.logits(i));
    }

    void sample_next(Slot& s, const float* logits) {
        PromptSeq& p = seqs_[s.seq];
        if (s.grammar && o_.ignore_eos && s.grammar->is_stopped()) return finish(s, "grammar complete");
        const int32_t tok =
            s.sampler->sample(ban_tokens(logits, n_vocab_, banned_, scratch_), n_vocab_, s.grammar.get());
        if (std::find(stops_.begin(), stops_.end(), tok) != stops_.end()) return finish(s, "stop");
        if (s.grammar) s.grammar->accept(tok);
        s.sampler->accept(tok);
        const std::string piece = s.stream->push(tok);
        p.output += piece;
        ++p.n_gen;
        if (hit_reverse_prompt(p.output, piece.size(), o_.reverse_prompts)) return finish(s, "reverse prompt");
        if (o_.n_predict > 0 && p.n_gen >= o_.n_predict) return finish(s, "length");
        if (static_cast<int64_t>(s.cached.size()) >= slot_ctx_) return finish(s, "context full");
        s.pending = tok;
    }

    void finish(Slot& s, const char* reason) {
        PromptSeq& p = seqs_[s.seq];
        p.output += s.stream->flush();
        p.finish = reason;
        p.t_end = Clock::now();
        print_output(s.seq, p.text + p.output);
        if (!o_.cache_prompt) {
            ctx_.seq_rm(s.id);
            s.cached.clear();
        }
        s.seq = -1;
        s.pending = -1;
        s.sampler.reset();
        s.grammar.reset();
    }

    // The whole text at once, each line prefixed by "[index] "; stdout is flushed so a reader sees
    // every sequence as soon as it completes.
    static void print_output(int index, const std::string& text) {
        const std::string prefix = "[" + std::to_string(index) + "] ";
        std::string out;
        size_t start = 0;
        while (true) {
            const size_t end = text.find('\n', start);
            out += prefix;
            out.append(text, start, end == std::string::npos ? std::string::npos : end - start);
            out += '\n';
            if (end == std::string::npos) break;
            start = end + 1;
        }
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);
    }

    Context& ctx_;
    const RunOptions& o_;
    SamplingParams sp_;
    uint64_t seed_base_;
    std::vector<PromptSeq>& seqs_;
    int64_t slot_ctx_;
    const Grammar* grammar_;
    const Vocab& vocab_;
    std::vector<int32_t> stops_;
    std::vector<int32_t> banned_;
    std::vector<float> scratch_;
    int64_t n_vocab_;
    std::vector<Slot> slots_;
    size_t next_ = 0;
    int64_t n_prompt_eval_ = 0;
};

double rate(int64_t n, double ms) { return ms > 0 ? 1000.0 * static_cast<double>(n) / ms : 0.0; }

}  // namespace

int run_generate_parallel(const RunOptions& o) {
    if (o.interactive) throw Error("--parallel does not combine with -i; chat with --parallel 1");
    if (o.has_prompt || o.prompt_file.empty()) {
        throw Error("--parallel " + std::to_string(o.parallel) + " reads one prompt per line from -f FILE; "
                    "give -f (or use --parallel 1 for a single -p prompt)");
    }
    if (o.parallel > KvCache::kMaxSeq) {
        throw Error("--parallel " + std::to_string(o.parallel) + " exceeds the " + std::to_string(KvCache::kMaxSeq) +
                    " sequences one context holds; use --parallel " + std::to_string(KvCache::kMaxSeq) + " or less");
    }
    const SamplingParams sp = sampling_from(o);
    const GrammarSource grammar_src = grammar_source_from(o);
    std::vector<PromptSeq> seqs = read_prompt_lines(o.prompt_file, o.escape);

    const auto t_load = Clock::now();
    std::shared_ptr<const Model> model = load_model_for_run(o);
    const int64_t slot_ctx = o.ctx_size > 0 ? o.ctx_size : model->hparams().n_ctx_train;
    if (slot_ctx <= 0) throw Error("the model has no training context length; give --ctx-size");
    const int n_slots = static_cast<int>(std::min<size_t>(static_cast<size_t>(o.parallel), seqs.size()));
    if (slot_ctx * n_slots > INT_MAX) {
        throw Error("--ctx-size " + std::to_string(slot_ctx) + " per slot times " + std::to_string(n_slots) +
                    " slots is too many KV cells; lower --ctx-size or --parallel");
    }
    const Vocab& vocab = model->vocab();
    for (size_t i = 0; i < seqs.size(); ++i) {
        seqs[i].tokens = vocab.tokenize(seqs[i].text, true, true);
        if (seqs[i].tokens.empty()) {
            throw Error("prompt " + std::to_string(i) + " (line " + std::to_string(seqs[i].line) +
                        ") tokenized to nothing; remove the line or give it some text");
        }
        if (static_cast<int64_t>(seqs[i].tokens.size()) >= slot_ctx) {
            throw Error("prompt " + std::to_string(i) + " (line " + std::to_string(seqs[i].line) + ") is " +
                        std::to_string(seqs[i].tokens.size()) + " tokens but each slot holds " +
                        std::to_string(slot_ctx) + " (--ctx-size is per slot); raise --ctx-size or shorten it");
        }
        if (o.verbose_prompt) print_verbose_prompt(seqs[i].text, seqs[i].tokens.size());
    }
    Context ctx(model, context_params_from(o, static_cast<int>(slot_ctx * n_slots), n_slots));
    const double load_ms = ms_between(t_load, Clock::now());
    print_load_report(*model, ctx, o);

    const uint64_t seed_base = o.seed == kRandomSeed ? random_seed() : o.seed;
    std::fprintf(stderr, "parallel: %zu prompts, %d slots of %lld tokens each, prompt cache %s\n", seqs.size(),
                 n_slots, static_cast<long long>(slot_ctx), o.cache_prompt ? "on" : "off");
    std::fprintf(stderr, "sampling: temp %.2f, top_k %d, top_p %.2f, min_p %.2f, repeat_penalty %.2f "
                 "(last %d), seed %llu + prompt index\n\n", sp.temp, sp.top_k, sp.top_p, sp.min_p,
                 sp.repeat_penalty, sp.repeat_last_n, static_cast<unsigned long long>(seed_base));

    const std::unique_ptr<Grammar> grammar =
        grammar_for_run(grammar_src, vocab, model->hparams().n_vocab, end_tokens(vocab));
    ParallelRunner runner(ctx, o, sp, seed_base, seqs, n_slots, static_cast<int>(slot_ctx), grammar.get());
    const auto t0 = Clock::now();
    runner.run();
    const double wall_ms = ms_between(t0, Clock::now());

    std::fputs("\n", stderr);
    int64_t n_gen = 0, n_reused = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        const PromptSeq& p = seqs[i];
        const double ms = ms_between(p.t_start, p.t_end);
        std::fprintf(stderr, "[%zu] prompt %zu tokens (%lld reused) | generated %lld tokens in %.1f ms "
                     "(%.2f tokens/s) | %s\n", i, p.tokens.size(), static_cast<long long>(p.n_reused),
                     static_cast<long long>(p.n_gen), ms, rate(p.n_gen, ms), p.finish);
        n_gen += p.n_gen;
        n_reused += p.n_reused;
    }
    const int64_t n_prompt = runner.prompt_tokens_evaluated();
    std::fprintf(stderr, "aggregate: load %.1f ms | %zu sequences on %d slots in %.1f ms | prompt %lld tokens "
                 "evaluated (%lld reused) (%.2f tokens/s) | generation %lld tokens (%.2f tokens/s)\n",
                 load_ms, seqs.size(), n_slots, wall_ms, static_cast<long long>(n_prompt),
                 static_cast<long long>(n_reused), rate(n_prompt, wall_ms), static_cast<long long>(n_gen),
                 rate(n_gen, wall_ms));
    return 0;
}

}  // namespace bonsai
