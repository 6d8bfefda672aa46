// Token sampling from a logits row: logit bias, then the penalties (repeat, frequency, presence),
// then greedy (temp <= 0) or the chain top-k -> top-p -> min-p -> temperature -> draw, as
// llama.cpp's default sampler chain.
//
// The penalties look at the same window: the last repeat_last_n accepted tokens (the caller
// accepts the prompt's tokens as well as the generated ones, as llama.cpp and llama-server do;
// repeat_last_n = 0 turns all three off). For a token seen `count` times in the window, the
// logit is divided (if positive) or multiplied (if not) by repeat_penalty, then
//     logit -= count * frequency_penalty + (count > 0) * presence_penalty     (OpenAI's formula).
// logit_bias adds its value to a token's logit before the penalties; a bias of -100 or below
// (or -inf) bans the token outright, so it is never drawn, not even greedily.
//
// The draw uses std::mt19937_64 seeded from `seed` and maps its 64-bit output to [0, 1) itself
// (top 53 bits), so a fixed seed gives the same tokens on every platform and standard library.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <utility>
#include <vector>

namespace bonsai {

// The seed value that asks for a random seed. random_seed() never returns it, so every seed a run
// prints (Sampler::seed()) can be given back to replay the run.
constexpr uint64_t kRandomSeed = 0xFFFFFFFFFFFFFFFFull;
// A seed from std::random_device, in [0, kRandomSeed).
uint64_t random_seed();
// base + k modulo 2^64 - 1: the seed of the k-th of several sequences sampled from one base seed;
// never kRandomSeed, for every base in [0, kRandomSeed).
uint64_t offset_seed(uint64_t base, uint64_t k);

struct SamplingParams {
    float temp = 0.8f;            // 0: greedy (argmax); negative is an error
    int32_t top_k = 40;           // <= 0: disabled
    float top_p = 0.95f;          // in (0, 1]; 1 disables
    float min_p = 0.05f;          // in [0, 1]; 0 disables
    float repeat_penalty = 1.0f;  // > 0; 1 disables
    int32_t repeat_last_n = 64;   // tokens the penalties look back over (0 = off, -1 = all accepted)
    float frequency_penalty = 0.0f;  // subtracted per occurrence in the window; 0 disables
    float presence_penalty = 0.0f;   // subtracted once if the token is in the window; 0 disables
    std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added to its logit (<= -100: ban)
    uint64_t seed = kRandomSeed;  // kRandomSeed draws a random seed (see random_seed())
};

// A constraint on the next token (a grammar matcher, see grammar.h): sets the logits of the tokens
// it forbids to -inf. Sampler::sample applies it after logit_bias and the penalties and before
// the truncation stages, so every stage (and the greedy pick) sees only allowed tokens.
class TokenConstraint {
public:
    virtual ~TokenConstraint() = default;
    virtual void apply(float* logits) = 0;
};

class Sampler {
public:
    // Throws bonsai::Error naming the first invalid parameter.
    explicit Sampler(const SamplingParams& params);

    // Picks a token from n_vocab logits (not modified), among those `constraint` allows (when
    // given). Throws if logit_bias names a token outside the vocabulary or every token is banned.
    int32_t sample(const float* logits, int64_t n_vocab, TokenConstraint* constraint = nullptr);
    // Applies logit_bias and the penalties to n_vocab logits in place: the logits the truncation
    // stages (top-k ...) and the greedy pick see. Banned tokens become -inf.
    void adjust(float* logits, int64_t n_vocab) const;
    // Records a token into the repeat-penalty history (the generated and, typically, prompt tokens).
    void accept(int32_t token);
    // Clears the history and re-seeds the generator.
    void reset();

    const SamplingParams& params() const { return p_; }
    uint64_t seed() const { return seed_; }

private:
    struct Candidate {
        int32_t id;
        float logit;
        float p;
    };
    double uniform();

    SamplingParams p_;
    uint64_t seed_ = 0;
    std::mt19937_64 rng_;
    std::deque<int32_t> history_;
    std::vector<Candidate> cand_;
    std::vector<float> adjusted_;
};

// A logit_bias value of this or below bans the token (OpenAI: "-100 should result in a ban").
constexpr float kBanBias = -100.0f;

// Validates sampling parameters (the checks the constructor does), throwing bonsai::Error.
void validate_sampling_params(const SamplingParams& p);

}  // namespace bonsai
