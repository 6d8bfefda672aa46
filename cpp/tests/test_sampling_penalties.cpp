// Unit tests of the sampler's logit bias and frequency / presence penalties (bonsai/sampling.h):
// the adjusted logits against a double-precision recomputation of the formula, bans that hold
// under greedy and random draws, a large bias forcing a token, zero penalties changing nothing,
// the parameter checks, and bonsai_run's --frequency-penalty / --presence-penalty / --logit-bias.
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bonsai/cli_args.h"
#include "bonsai/error.h"
#include "bonsai/sampling.h"
#include "check.h"

using namespace bonsai;

namespace {

std::vector<float> random_logits(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<float> out(n);
    for (float& x : out) x = dist(rng);
    return out;
}

// The formula of sampling.h in double precision: bias (<= -100 bans), then for each token seen
// `count` times in the window: repeat penalty, minus count * freq, minus presence once.
std::vector<double> reference(const std::vector<float>& logits, const std::vector<int32_t>& window,
                              const SamplingParams& p) {
    std::vector<double> out(logits.begin(), logits.end());
    for (const auto& [id, bias] : p.logit_bias) {
        out[id] = bias <= -100.0f ? -INFINITY : out[id] + bias;
    }
    std::map<int32_t, int> count;
    for (int32_t t : window) ++count[t];
    for (const auto& [id, n] : count) {
        double& l = out[id];
        l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
        l -= n * static_cast<double>(p.frequency_penalty) + static_cast<double>(p.presence_penalty);
    }
    return out;
}

void test_adjust_matches_reference() {
    const int n = 300;
    const std::vector<float> logits = random_logits(n, 7);
    SamplingParams p;
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.7f;
    p.presence_penalty = -0.4f;
    p.repeat_last_n = 16;
    p.logit_bias = {{3, 2.5f}, {10, -1.25f}, {11, -100.0f}, {12, -INFINITY}, {5, 0.5f}};
    Sampler s(p);
    std::vector<int32_t> history;
    std::mt19937 rng(3);
    for (int i = 0; i < 40; ++i) {  // repeats, and more than the window holds
        const int32_t t = static_cast<int32_t>(rng() % 20);
        history.push_back(t);
        s.accept(t);
    }
    const std::vector<int32_t> window(history.end() - 16, history.end());
    const std::vector<double> want = reference(logits, window, p);
    std::vector<float> got = logits;
    s.adjust(got.data(), n);
    for (int i = 0; i < n; ++i) {
        if (std::isinf(want[i])) {
            CHECK(std::isinf(got[i]) && got[i] < 0);
        } else {
            CHECK(std::fabs(got[i] - want[i]) <= 1e-5 * (1.0 + std::fabs(want[i])));
        }
    }
}

void test_bans_and_forcing() {
    const int n = 64;
    const std::vector<float> logits = random_logits(n, 11);
    int best = 0;
    for (int i = 1; i < n; ++i) if (logits[i] > logits[best]) best = i;

    SamplingParams greedy;
    greedy.temp = 0.0f;
    greedy.logit_bias = {{best, -100.0f}};
    CHECK(Sampler(greedy).sample(logits.data(), n) != best);

    SamplingParams hot;  // a flat distribution over every token but the banned ones
    hot.temp = 100.0f;
    hot.top_k = 0;
    hot.top_p = 1.0f;
    hot.min_p = 0.0f;
    hot.seed = 5;
    hot.logit_bias = {{0, -INFINITY}, {1, -100.0f}, {2, -250.0f}};
    Sampler h(hot);
    for (int i = 0; i < 2000; ++i) CHECK(h.sample(logits.data(), n) > 2);

    SamplingParams force = hot;
    force.temp = 1.0f;
    force.logit_bias = {{17, 100.0f}};
    Sampler f(force);
    for (int i = 0; i < 200; ++i) CHECK(f.sample(logits.data(), n) == 17);

    // a token penalized out of the argmax: with the best one in the window and a large penalty
    SamplingParams pen;
    pen.temp = 0.0f;
    pen.presence_penalty = 2.0f;
    pen.frequency_penalty = 2.0f;
    Sampler ps(pen);
    for (int i = 0; i < 10; ++i) ps.accept(best);
    CHECK(ps.sample(logits.data(), n) != best);

    SamplingParams all;
    all.temp = 0.0f;
    for (int i = 0; i < 4; ++i) all.logit_bias.emplace_back(i, -INFINITY);
    const float four[4] = {1, 2, 3, 4};
    CHECK_THROWS(Sampler(all).sample(four, 4), "every token is banned");
    SamplingParams outside;
    outside.logit_bias = {{9, 1.0f}};
    CHECK_THROWS(Sampler(outside).sample(four, 4), "outside the vocabulary");
}

void test_zero_penalties_unchanged() {
    const int n = 200;
    const std::vector<float> logits = random_logits(n, 23);
    SamplingParams a, b;
    a.seed = b.seed = 99;
    b.frequency_penalty = 0.0f;
    b.presence_penalty = 0.0f;
    b.logit_bias = {{4, 0.0f}};
    Sampler sa(a), sb(b);
    for (int i = 0; i < 300; ++i) {
        const int32_t x = sa.sample(logits.data(), n), y = sb.sample(logits.data(), n);
        CHECK(x == y);
        sa.accept(x);
        sb.accept(y);
    }
    std::vector<float> adjusted = logits;
    sb.adjust(adjusted.data(), n);
    CHECK(adjusted == logits);  // repeat_penalty 1, no frequency/presence: the history changes nothing
}

void test_validation() {
    SamplingParams bad;
    bad.frequency_penalty = NAN;
    CHECK_THROWS(Sampler{bad}, "frequency_penalty");
    bad = SamplingParams{};
    bad.presence_penalty = INFINITY;
    CHECK_THROWS(Sampler{bad}, "presence_penalty");
    bad = SamplingParams{};
    bad.logit_bias = {{-1, 1.0f}};
    CHECK_THROWS(Sampler{bad}, "negative");
    bad.logit_bias = {{1, INFINITY}};
    CHECK_THROWS(Sampler{bad}, "logit_bias for token 1");
    bad.logit_bias = {{1, NAN}};
    CHECK_THROWS(Sampler{bad}, "logit_bias for token 1");
}

RunOptions parse(std::vector<std::string> args) {
    args.insert(args.begin(), "bonsai_run");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return parse_run_args(static_cast<int>(argv.size()), argv.data());
}

void test_cli_flags() {
    const RunOptions d = parse({"-m", "x"});
    CHECK(d.frequency_penalty == 0.0f && d.presence_penalty == 0.0f && d.logit_bias.empty());
    const RunOptions o = parse({"-m", "x", "--frequency-penalty", "0.5", "--presence-penalty=-1.5", "-l",
                                "15043+1", "--logit-bias", "7-2.5", "-l", "2-inf"});
    CHECK(o.frequency_penalty == 0.5f && o.presence_penalty == -1.5f);
    CHECK(o.logit_bias.size() == 3);
    if (o.logit_bias.size() == 3) {
        CHECK(o.logit_bias[0].first == 15043 && o.logit_bias[0].second == 1.0f);
        CHECK(o.logit_bias[1].first == 7 && o.logit_bias[1].second == -2.5f);
        CHECK(o.logit_bias[2].first == 2 && std::isinf(o.logit_bias[2].second) && o.logit_bias[2].second < 0);
    }
    CHECK_THROWS(parse({"-m", "x", "--frequency-penalty", "2.5"}), "invalid value '2.5' for --frequency-penalty");
    CHECK_THROWS(parse({"-m", "x", "--presence-penalty", "nan"}), "--presence-penalty");
    CHECK_THROWS(parse({"-m", "x", "-l", "15043"}), "TOKEN_ID(+|-)BIAS");
    CHECK_THROWS(parse({"-m", "x", "-l", "abc+1"}), "invalid value 'abc+1' for -l (--logit-bias)");
    CHECK_THROWS(parse({"-m", "x", "-l", "3+inf"}), "--logit-bias");
    CHECK_THROWS(parse({"-m", "x", "-l", "3+"}), "--logit-bias");
}

}  // namespace

int main() {
    test_adjust_matches_reference();
    test_bans_and_forcing();
    test_zero_penalties_unchanged();
    test_validation();
    test_cli_flags();
    if (g_failures == 0) std::printf("test_sampling_penalties: all passed\n");
    return g_failures == 0 ? 0 : 1;
}
