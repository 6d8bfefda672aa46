// libFuzzer harness of the GBNF -> Lark translator, cpp/src/gbnf.cpp (ASan + UBSan build,
// BONSAI_FUZZ=ON). bonsai_run hands it whatever --grammar / --grammar-file gives.
//
// Input: the grammar text.
// Property: is_gbnf returns, and gbnf_to_lark returns or throws bonsai::Error with a message; when
// it returns, the Lark opens with `%llguidance {}`, has a `start:` rule, and holds no control
// byte but '\n' (every character of a literal or class is escaped), and translating again gives
// the same text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bonsai/error.h"
#include "bonsai/grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    (void)bonsai::is_gbnf(text);
    std::string lark;
    try {
        lark = bonsai::gbnf_to_lark(text);
    } catch (const bonsai::Error& e) {
        if (std::string(e.what()).empty()) std::abort();  // an error always says what is wrong
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gbnf_to_lark threw a non-bonsai exception: %s\n", e.what());
        std::abort();
    }
    bool ok = lark.rfind("%llguidance {}\n", 0) == 0 && lark.find("\nstart: ") != std::string::npos;
    for (unsigned char c : lark) ok = ok && (c >= 0x20 || c == '\n');
    if (!ok || bonsai::gbnf_to_lark(text) != lark) {
        std::fprintf(stderr, "gbnf_to_lark wrote Lark that breaks its contract:\n%s\n", lark.c_str());
        std::abort();
    }
    return 0;
}
