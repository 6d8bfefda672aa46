// The per-op profile (see op_profile.h): totals per (kind, decode/prefill), printed at exit.
#include "op_profile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bonsai {

namespace {

constexpr int kKinds = static_cast<int>(OpKind::COUNT);
const char* const kNames[kKinds] = {"embed", "norm", "qkv", "rope+kv", "attention", "attn_out",
                                    "gate+up", "swiglu", "down", "residual", "head"};

struct Total {
    int64_t calls = 0;
    int64_t ns = 0;
    double bytes = 0.0;
};

struct Profile {
    Total t[2][kKinds];  // [0] decode (one token), [1] prefill
    ~Profile() { print(); }
    void print() const {
        for (int p = 0; p < 2; ++p) {
            int64_t all = 0;
            for (const Total& x : t[p]) all += x.ns;
            if (all == 0) continue;
            std::fprintf(stderr, "\nop profile, %s (wall time per op kind):\n", p == 0 ? "decode (1 token)" : "prefill");
            std::fprintf(stderr, "  %-10s %9s %10s %10s %7s %8s\n", "op", "calls", "ms", "us/call", "share", "GB/s");
            for (int k = 0; k < kKinds; ++k) {
                const Total& x = t[p][k];
                if (x.calls == 0) continue;
                char gbs[16] = "-";
                if (x.bytes > 0) std::snprintf(gbs, sizeof gbs, "%.1f", x.bytes / static_cast<double>(x.ns));
                std::fprintf(stderr, "  %-10s %9lld %10.2f %10.2f %6.1f%% %8s\n", kNames[k],
                             static_cast<long long>(x.calls), x.ns * 1e-6, x.ns * 1e-3 / x.calls,
                             100.0 * x.ns / all, gbs);
            }
            std::fprintf(stderr, "  %-10s %9s %10.2f\n", "total", "", all * 1e-6);
        }
    }
};

Profile& profile() {
    static Profile p;
    return p;
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

bool op_profile_on() {
    static const bool on = [] {
        const char* v = std::getenv("BONSAI_PROFILE");
        if (!v || !*v || std::strcmp(v, "0") == 0) return false;
        profile();  // constructed now, so it is destroyed (and printed) at exit
        return true;
    }();
    return on;
}

OpScope::OpScope(OpKind kind, int64_t n_tokens, size_t weight_bytes)
    : kind_(kind), decode_(n_tokens == 1), bytes_(weight_bytes) {
    if (op_profile_on()) t0_ns_ = now_ns();
}

OpScope::~OpScope() {
    if (t0_ns_ < 0) return;
    Total& x = profile().t[decode_ ? 0 : 1][static_cast<int>(kind_)];
    ++x.calls;
    x.ns += now_ns() - t0_ns_;
    x.bytes += static_cast<double>(bytes_);
}

}  // namespace bonsai
