// The checks shared by the C++ unit tests: each test is a main() that counts failed CHECKs in
// g_failures (one counter per test executable) and returns non-zero when any failed.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include "bonsai/error.h"

static int g_failures = 0;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++g_failures;                                                                \
        }                                                                                \
    } while (0)

// Runs f and requires a bonsai::Error whose message contains `needle`.
inline void check_throws(const std::function<void()>& f, const std::string& needle, int line) {
    try {
        f();
    } catch (const bonsai::Error& e) {
        if (std::string(e.what()).find(needle) == std::string::npos) {
            std::fprintf(stderr, "line %d: error \"%s\" does not mention \"%s\"\n", line, e.what(),
                         needle.c_str());
            ++g_failures;
        }
        return;
    }
    std::fprintf(stderr, "line %d: expected bonsai::Error mentioning \"%s\"\n", line, needle.c_str());
    ++g_failures;
}
#define CHECK_THROWS(expr, needle) check_throws([&] { (void)(expr); }, needle, __LINE__)
