// Token sampling from a logits row: repeat penalty, then greedy (temp <= 0) or the chain
// top-k -> top-p -> min-p -> temperature -> draw, as llama.cpp's default sampler chain.
//
// The draw uses std::mt19937_64 seeded from `seed` and maps its 64-bit output to [0, 1) itself
// (top 53 bits), so a fixed seed gives the same tokens on every platform and standard library.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
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
    int32_t repeat_last_n = 64;   // tokens the penalty looks back over (0 = off, -1 = all accepted)
    uint64_t seed = kRandomSeed;  // kRandomSeed draws a random seed (see random_seed())
};

class Sampler {
public:
    // Throws bonsai::Error naming the first invalid parameter.
    explicit Sampler(const SamplingParams& params);

    // Picks a token from n_vocab logits (not modified).
    int32_t sample(const float* logits, int64_t n_vocab);
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
};

// Validates sampling parameters (the checks the constructor does), throwing bonsai::Error.
void validate_sampling_params(const SamplingParams& p);

}  // namespace bonsai
