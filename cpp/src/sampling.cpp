// Sampling chain (see sampling.h). Candidates are (id, logit, p) triples; each stage keeps a
// prefix of them sorted by descending logit, so later stages only touch what earlier ones kept.
#include "bonsai/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <limits>
#include <unordered_map>

#include "bonsai/error.h"

namespace bonsai {

void validate_sampling_params(const SamplingParams& p) {
    if (!(p.temp >= 0.0f) || std::isinf(p.temp)) {
        throw Error("temperature must be >= 0 (0 = greedy), got " + std::to_string(p.temp));
    }
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
        throw Error("top_p must be in (0, 1], got " + std::to_string(p.top_p));
    }
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
        throw Error("min_p must be in [0, 1], got " + std::to_string(p.min_p));
    }
    if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty)) {
        throw Error("repeat_penalty must be > 0 (1 = off), got " + std::to_string(p.repeat_penalty));
    }
    if (p.repeat_last_n < -1) {
        throw Error("repeat_last_n must be >= -1 (-1 = whole history, 0 = off), got " +
                    std::to_string(p.repeat_last_n));
    }
    if (!std::isfinite(p.frequency_penalty)) {
        throw Error("frequency_penalty must be a finite number (0 = off), got " + std::to_string(p.frequency_penalty));
    }
    if (!std::isfinite(p.presence_penalty)) {
        throw Error("presence_penalty must be a finite number (0 = off), got " + std::to_string(p.presence_penalty));
    }
    for (const auto& [id, bias] : p.logit_bias) {
        if (id < 0) throw Error("logit_bias: token id " + std::to_string(id) + " is negative");
        if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
            throw Error("logit_bias for token " + std::to_string(id) + " must be a number or -inf (ban), got " +
                        std::to_string(bias));
        }
    }
}

uint64_t random_seed() {
    std::random_device rd;
    for (;;) {
        const uint64_t s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
        if (s != kRandomSeed) return s;
    }
}

uint64_t offset_seed(uint64_t base, uint64_t k) {
    constexpr uint64_t m = kRandomSeed;  // the modulus 2^64 - 1
    base %= m;
    k %= m;
    return k < m - base ? base + k : k - (m - base);
}

Sampler::Sampler(const SamplingParams& params) : p_(params) {
    validate_sampling_params(p_);
    reset();
}

void Sampler::reset() {
    history_.clear();
    seed_ = p_.seed == kRandomSeed ? random_seed() : p_.seed;
    rng_.seed(seed_);
}

void Sampler::accept(int32_t token) {
    if (p_.repeat_last_n == 0) return;
    history_.push_back(token);
    const size_t cap = p_.repeat_last_n < 0 ? SIZE_MAX : static_cast<size_t>(p_.repeat_last_n);
    while (history_.size() > cap) history_.pop_front();
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::adjust(float* logits, int64_t n_vocab) const {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (const auto& [id, bias] : p_.logit_bias) {
        if (id >= n_vocab) {
            throw Error("logit_bias: token id " + std::to_string(id) + " is outside the vocabulary (" +
                        std::to_string(n_vocab) + " tokens)");
        }
        logits[id] = bias <= kBanBias ? kNegInf : logits[id] + bias;
    }
    const bool penalize = p_.repeat_penalty != 1.0f || p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f;
    if (!penalize || history_.empty()) return;
    std::unordered_map<int32_t, int32_t> count;
    for (int32_t id : history_) ++count[id];
    for (const auto& [id, n] : count) {
        if (id < 0 || id >= n_vocab) continue;
        float& l = logits[id];
        if (p_.repeat_penalty != 1.0f) l = l > 0.0f ? l / p_.repeat_penalty : l * p_.repeat_penalty;
        l -= static_cast<float>(n) * p_.frequency_penalty + p_.presence_penalty;
    }
}

int32_t Sampler::sample(const float* logits, int64_t n_vocab, TokenConstraint* constraint) {
    if (n_vocab <= 0) throw Error("sample: empty logits");
    adjusted_.resize(n_vocab);
    for (int64_t i = 0; i < n_vocab; ++i) {
        if (std::isnan(logits[i])) throw Error("sample: logit " + std::to_string(i) + " is NaN");
    }
    std::copy_n(logits, n_vocab, adjusted_.data());
    adjust(adjusted_.data(), n_vocab);
    if (constraint != nullptr) constraint->apply(adjusted_.data());
    cand_.resize(n_vocab);
    bool any = false;
    for (int64_t i = 0; i < n_vocab; ++i) {
        cand_[i] = {static_cast<int32_t>(i), adjusted_[i], 0.0f};
        any = any || adjusted_[i] != -std::numeric_limits<float>::infinity();
    }
    if (!any && constraint != nullptr)
        throw Error("sample: the grammar allows only tokens that logit_bias or --ignore-eos ban; ban fewer tokens");
    if (!any) throw Error("sample: every token is banned (all logits are -inf after logit_bias); ban fewer tokens");
    auto by_logit = [](const Candidate& a, const Candidate& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    if (p_.temp <= 0.0f) {
        return std::min_element(cand_.begin(), cand_.end(), by_logit)->id;
    }

    size_t n = cand_.size();
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) n = static_cast<size_t>(p_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), by_logit);

    // Probabilities of the kept candidates at temperature 1 (for top-p / min-p).
    auto softmax = [&](float temp) {
        const float m = cand_[0].logit;
        double sum = 0.0;
        for (size_t i = 0; i < n; ++i) {
            cand_[i].p = std::exp((cand_[i].logit - m) / temp);
            sum += cand_[i].p;
        }
        for (size_t i = 0; i < n; ++i) cand_[i].p = static_cast<float>(cand_[i].p / sum);
    };
    softmax(1.0f);
    if (p_.top_p < 1.0f) {
        double cum = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            cum += cand_[i].p;
            if (cum >= p_.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = std::max<size_t>(keep, 1);
    }
    if (p_.min_p > 0.0f) {
        const float floor_p = cand_[0].p * p_.min_p;
        size_t keep = 1;
        while (keep < n && cand_[keep].p >= floor_p) ++keep;
        n = keep;
    }
    softmax(p_.temp);
    const double u = uniform();
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        cum += cand_[i].p;
        if (u < cum) return cand_[i].id;
    }
    return cand_[n - 1].id;
}

}  // namespace bonsai
