// Unit tests of the GGUF reader: a valid file with every value type and a mix of tensor types,
// then one malformed file per validation rule (each must raise bonsai::Error whose message names
// the problem), every truncation point of a valid file, and random corruptions (which must end in
// either a successful open or a bonsai::Error, never a crash). Files are written by the test.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "check.h"

using namespace bonsai;

namespace {

// Little-endian byte builder for GGUF files.
struct Bytes {
    std::string b;
    template <class T>
    Bytes& raw(T v) {
        b.append(reinterpret_cast<const char*>(&v), sizeof v);
        return *this;
    }
    Bytes& u32(uint32_t v) { return raw(v); }
    Bytes& u64(uint64_t v) { return raw(v); }
    Bytes& str(const std::string& s) {
        u64(s.size());
        b += s;
        return *this;
    }
    Bytes& pad(size_t a) {
        while (b.size() % a) b.push_back('\0');
        return *this;
    }
};

struct TensorSpec {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t id;
    uint64_t offset;
};

// Header + the given KV bytes + tensor infos + padding + data_bytes of patterned data.
std::string build(uint64_t n_kv, const std::string& kv_bytes, const std::vector<TensorSpec>& ts,
                  size_t data_bytes, size_t alignment = 32) {
    Bytes f;
    f.b = "GGUF";
    f.u32(3).u64(ts.size()).u64(n_kv);
    f.b += kv_bytes;
    for (const auto& t : ts) {
        f.str(t.name).u32(static_cast<uint32_t>(t.ne.size()));
        for (uint64_t d : t.ne) f.u64(d);
        f.u32(t.id).u64(t.offset);
    }
    f.pad(alignment);
    for (size_t k = 0; k < data_bytes; ++k) f.b.push_back(static_cast<char>(k * 7 + 1));
    return f.b;
}

std::string temp_path() {
    static int n = 0;
    return (std::filesystem::temp_directory_path() /
            ("bonsai_test_gguf_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".gguf"))
        .string();
}

struct TempFile {
    std::string path;
    explicit TempFile(const std::string& bytes) : path(temp_path()) {
        std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    ~TempFile() { std::remove(path.c_str()); }
};

// Opens `bytes` as a file; returns the error message ("" if it opened).
std::string open_error(const std::string& bytes, bool use_mmap = true) {
    TempFile f(bytes);
    try {
        GgufFile::open(f.path, use_mmap);
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.find(f.path) != std::string::npos);  // every message names the file
        return msg;
    }
    return "";
}

void expect_error(const std::string& bytes, const std::vector<std::string>& needles, int line) {
    const std::string msg = open_error(bytes);
    bool ok = !msg.empty();
    for (const auto& n : needles) ok = ok && msg.find(n) != std::string::npos;
    if (!ok) {
        std::fprintf(stderr, "line %d: expected an error containing", line);
        for (const auto& n : needles) std::fprintf(stderr, " '%s'", n.c_str());
        std::fprintf(stderr, ", got '%s'\n", msg.c_str());
        ++g_failures;
    }
}
#define EXPECT_ERROR(bytes, ...) expect_error(bytes, {__VA_ARGS__}, __LINE__)

// KV section with one value of every type (13 entries).
std::string all_kvs() {
    Bytes k;
    k.str("general.architecture").u32(8).str("llama");
    k.str("u8").u32(0).raw<uint8_t>(200);
    k.str("i8").u32(1).raw<int8_t>(-5);
    k.str("u16").u32(2).raw<uint16_t>(60000);
    k.str("i16").u32(3).raw<int16_t>(-300);
    k.str("llama.block_count").u32(4).u32(2);
    k.str("i32").u32(5).raw<int32_t>(-7);
    k.str("f32").u32(6).raw<float>(0.5f);
    k.str("flag").u32(7).raw<uint8_t>(1);
    k.str("tokens").u32(9).u32(8).u64(3).str("a").str("bc").str("");
    k.str("u64").u32(10).u64(1ull << 40);
    k.str("i64").u32(11).raw<int64_t>(-(1ll << 40));
    k.str("f64").u32(12).raw<double>(2.25);
    return k.b;
}
constexpr uint64_t kAllKvs = 13;

constexpr size_t kValidDataBytes = 2928;

// A valid file with engine types, id 42 in both layouts and two types the engine cannot run.
std::string valid_file() {
    const std::vector<TensorSpec> ts = {
        {"norm", {64}, 0, 0},                     // F32: 256 bytes
        {"q8", {64, 2}, 8, 256},                  // Q8_0: 4 blocks * 34 = 136 -> 160
        {"ptq", {128, 2}, 143, 416},              // PTQ1_0: 2 * 28 = 56 -> 64
        {"q2_g64", {4096}, 42, 480},              // Q2_0 g64: 64 * 18 = 1152
        {"q2_g128", {4096}, 42, 1632},            // Q2_0 g128: 32 * 34 = 1088
        {"k4", {256}, 12, 2784},                  // Q4_K: 144, the file ends right after it
        {"mystery", {10}, 99, 2720},              // unknown id: size = span to the next (64)
    };
    return build(kAllKvs, all_kvs(), ts, kValidDataBytes);
}

void test_valid_file(bool use_mmap) {
    TempFile tf(valid_file());
    auto f = GgufFile::open(tf.path, use_mmap);
    CHECK(f->version() == 3);
    CHECK(f->alignment() == 32);
    CHECK(f->metadata().size() == kAllKvs);
    CHECK(f->metadata()[0].key == "general.architecture");
    CHECK(f->get_string("general.architecture") == "llama");
    CHECK(f->get_u32("u8") == 200);
    CHECK(f->get_i32("i8") == -5);
    CHECK(f->get_u32("u16") == 60000);
    CHECK(f->get_i64("i16") == -300);
    CHECK(f->get_u32("llama.block_count") == 2);
    CHECK(f->get_i32("llama.block_count") == 2);  // any integer width that fits
    CHECK(f->get_f32("f32") == 0.5f);
    CHECK(f->get_bool("flag"));
    CHECK(f->get_u64("u64") == (1ull << 40));
    CHECK(f->get_i64("i64") == -(1ll << 40));
    CHECK(f->get_f64("f64") == 2.25);
    CHECK(f->get_array_strings("tokens") == (std::vector<std::string>{"a", "bc", ""}));
    CHECK(f->get_array_size("tokens") == 3);
    CHECK(f->find("tokens")->type_name() == "ARRAY[STRING]");
    CHECK(f->find("absent") == nullptr);
    CHECK(f->get_u32("absent", 7) == 7);
    CHECK(f->get_string("absent", "x") == "x");

    const std::pair<std::function<void()>, std::string> bad_gets[] = {
        {[&] { f->get_u32("absent"); }, "'absent' is missing"},
        {[&] { f->get_u32("general.architecture"); }, "'general.architecture' holds STRING"},
        {[&] { f->get_u32("i8"); }, "'i8' = -5 is out of range"},
        {[&] { f->get_i32("u64"); }, "'u64' = 1099511627776 is out of range"},
        {[&] { f->get_string("u8"); }, "'u8' holds UINT8, expected STRING"},
        {[&] { f->get_bool("u8"); }, "expected BOOL"},
        {[&] { f->get_array_strings("u8"); }, "expected ARRAY[STRING]"},
        {[&] { f->get_array_i64("tokens"); }, "expected an integer array"},
        {[&] { f->get_tensor("nope"); }, "tensor 'nope' is missing"},
    };
    for (const auto& [call, needle] : bad_gets) {
        std::string msg;
        try {
            call();
        } catch (const Error& e) {
            msg = e.what();
        }
        if (msg.find(needle) == std::string::npos) {
            std::fprintf(stderr, "getter error: expected '%s', got '%s'\n", needle.c_str(), msg.c_str());
            ++g_failures;
        }
    }

    CHECK(f->tensors().size() == 7);
    const GgufTensor& norm = f->get_tensor("norm");
    CHECK(norm.supported && norm.type == TYPE_F32 && norm.nbytes == 256 && norm.n_elements() == 64);
    CHECK(norm.data == f->mapping()->data() + f->data_offset());
    CHECK(f->data_offset() % 32 == 0);
    const GgufTensor& q8 = f->get_tensor("q8");
    CHECK(q8.type == TYPE_Q8_0 && q8.nbytes == 136 && q8.ne == (std::vector<int64_t>{64, 2}));
    CHECK(q8.data[0] == static_cast<uint8_t>(256 * 7 + 1));
    CHECK(f->get_tensor("ptq").type == TYPE_PTQ1_0 && f->get_tensor("ptq").nbytes == 56);
    CHECK(f->get_tensor("q2_g64").type == TYPE_Q2_0 && f->get_tensor("q2_g64").nbytes == 1152);
    CHECK(f->get_tensor("q2_g128").type == TYPE_Q2_0_G128 && f->get_tensor("q2_g128").nbytes == 1088);
    const GgufTensor& k4 = f->get_tensor("k4");
    CHECK(!k4.supported && k4.file_id == 12 && k4.nbytes == 144);
    const GgufTensor& mystery = f->get_tensor("mystery");
    CHECK(!mystery.supported && mystery.file_id == 99 && mystery.nbytes == 64);
    std::string msg;
    try {
        f->check_engine_types();
    } catch (const Error& e) {
        msg = e.what();
    }
    CHECK(msg.find("'k4' has type Q4_K, which is not supported by the engine") != std::string::npos);
    // names for tables, labels for messages: "has type unknown ggml type id 99", never "type type 99"
    CHECK(ggml_type_name(99) == "type 99" && ggml_type_name(12) == "Q4_K");
    CHECK(ggml_type_label(99) == "unknown ggml type id 99" && ggml_type_label(12) == "Q4_K");
    CHECK(ggml_type_label(143) == "PTQ1_0");

    // The mapping outlives the GgufFile through mapping().
    auto mapping = f->mapping();
    const uint8_t* p = f->get_tensor("q8").data;
    f.reset();
    CHECK(p[0] == static_cast<uint8_t>(256 * 7 + 1));
    CHECK(mapping->is_mapped() == use_mmap);
}

// The id-42 rule with padding: a tensor padded up to the alignment still resolves when only one
// layout fits, and a span that fits both (too small to tell apart) is refused.
void test_id42_padding() {
    const auto kv = Bytes().str("general.architecture").u32(8).str("llama").b;
    // 2048 elements: g64 = 576 bytes (exact multiple of 32), g128 = 544 (also a multiple).
    TempFile a(build(1, kv, {{"w", {2048}, 42, 0}, {"x", {8}, 0, 544}}, 576));
    CHECK(GgufFile::open(a.path)->get_tensor("w").type == TYPE_Q2_0_G128);
    // 1024 elements g128 = 272 bytes padded to 288, g64 = 288: exact g64 wins.
    TempFile b(build(1, kv, {{"w", {1024}, 42, 0}, {"x", {8}, 0, 288}}, 320));
    CHECK(GgufFile::open(b.path)->get_tensor("w").type == TYPE_Q2_0);
    // 3072 elements: g64 = 864 -> 864, g128 = 816 -> 832: span 832 only fits g128 with padding.
    TempFile c(build(1, kv, {{"w", {3072}, 42, 0}, {"x", {8}, 0, 832}}, 864));
    CHECK(GgufFile::open(c.path)->get_tensor("w").type == TYPE_Q2_0_G128);
    // 128 elements: g64 = 36, g128 = 34, both pad to 64.
    EXPECT_ERROR(build(1, kv, {{"w", {128}, 42, 0}, {"x", {8}, 0, 64}}, 96), "'w'",
                 "fits both");
    // 4096 elements in a 1000-byte span: neither 1152 nor 1088.
    EXPECT_ERROR(build(1, kv, {{"w", {4096}, 42, 0}, {"x", {8}, 0, 1024}}, 1056), "'w'",
                 "size of neither");
}

void test_malformed() {
    const auto arch = Bytes().str("general.architecture").u32(8).str("llama").b;
    const std::string good = valid_file();

    EXPECT_ERROR("", "too small to be a GGUF file");
    EXPECT_ERROR("PK\x03\x04rest of a zip file", "not a GGUF file", "PK\\x03\\x04");
    {
        std::string v2 = good;
        v2[4] = 2;
        EXPECT_ERROR(v2, "unsupported GGUF version 2");
        std::string v1 = good;
        v1[4] = 1;
        EXPECT_ERROR(v1, "unsupported GGUF version 1");
        std::string be = good;
        std::memcpy(&be[4], "\0\0\0\3", 4);
        EXPECT_ERROR(be, "big-endian");
    }
    EXPECT_ERROR(build(1, Bytes().str("k").u32(13).u32(0).b, {}, 0),
                 "'k' has unknown value type 13");
    EXPECT_ERROR(build(1, Bytes().str("k").u32(9).u32(77).u64(0).b, {}, 0),
                 "'k' is an array of unknown value type 77");
    EXPECT_ERROR(build(1, Bytes().str("k").u32(9).u32(9).u64(0).b, {}, 0), "array of arrays");
    EXPECT_ERROR(build(2, arch + arch, {}, 0), "duplicate metadata key 'general.architecture'");
    EXPECT_ERROR(build(1, Bytes().str("k").u32(8).u64(1ull << 40).b, {}, 0),
                 "'k'", "string length 1099511627776 runs past the end of the file");
    EXPECT_ERROR(build(1, Bytes().str("k").u32(9).u32(4).u64(1ull << 50).b, {}, 0),
                 "'k' claims an array of 1125899906842624 UINT32");
    EXPECT_ERROR(build(1, Bytes().str("k").u32(7).raw<uint8_t>(2).b, {}, 0), "bool value 2");
    EXPECT_ERROR(build(1, Bytes().str("general.alignment").u32(4).u32(48).b, {}, 0),
                 "general.alignment is 48");
    EXPECT_ERROR(build(1, Bytes().str("general.alignment").u32(8).str("x").b, {}, 0),
                 "'general.alignment' holds STRING");
    {
        Bytes h;
        h.b = "GGUF";
        h.u32(3).u64(1ull << 60).u64(0);
        EXPECT_ERROR(h.b, "claims 1152921504606846976 tensors");
        Bytes k;
        k.b = "GGUF";
        k.u32(3).u64(0).u64(1000);
        EXPECT_ERROR(k.b, "claims 1000 metadata entries");
    }
    EXPECT_ERROR(build(1, arch, {{"a", {32}, 0, 0}, {"a", {32}, 0, 128}}, 256),
                 "duplicate tensor name 'a'");
    EXPECT_ERROR(build(1, arch, {{"a", {2, 2, 2, 2, 2}, 0, 0}}, 128), "'a' has 5 dimensions");
    EXPECT_ERROR(build(1, arch, {{"a", {}, 0, 0}}, 128), "'a' has 0 dimensions");
    EXPECT_ERROR(build(1, arch, {{"a", {4, 0}, 0, 0}}, 128), "'a' has dimension 1 = 0");
    EXPECT_ERROR(build(1, arch, {{"a", {1ull << 62, 8}, 0, 0}}, 128), "'a' has more elements");
    EXPECT_ERROR(build(1, arch, {{"a", {48}, 8, 0}}, 128),
                 "'a' of type Q8_0 has rows of 48 elements, not a multiple of its block size 32");
    EXPECT_ERROR(build(1, arch, {{"a", {100}, 143, 0}}, 128), "'a' of type PTQ1_0", "block size 128");
    EXPECT_ERROR(build(1, arch, {{"a", {32}, 42, 0}}, 128), "'a' of type Q2_0", "block size 64");
    EXPECT_ERROR(build(1, arch, {{"a", {8}, 0, 0}, {"b", {8}, 0, 40}}, 128),
                 "'b' has data offset 40, not a multiple of the alignment 32");
    EXPECT_ERROR(build(1, arch, {{"a", {64}, 0, 0}}, 100), "'a'", "extends past the end of the file");
    EXPECT_ERROR(build(1, arch, {{"a", {8}, 0, 4096}}, 100), "'a'", "extends past the end of the file");
    EXPECT_ERROR(build(1, arch, {{"a", {64}, 0, 0}, {"b", {8}, 0, 128}}, 256), "'a'", "overlaps tensor 'b'");
    EXPECT_ERROR(build(1, arch, {{"a", {8}, 99, 0}, {"b", {8}, 0, 0}}, 64), "'a'");
    EXPECT_ERROR(build(1, arch, {{"w", {4096}, 42, 0}}, 1000), "'w'", "extends past the end");
}

// Every proper prefix of a valid file must be refused with an error, none may crash.
void test_truncation() {
    const std::string good = valid_file();
    for (size_t cut = 0; cut < good.size(); ++cut) {
        const std::string msg = open_error(good.substr(0, cut));
        if (msg.empty()) {
            std::fprintf(stderr, "truncation at %zu of %zu bytes opened without error\n", cut,
                         good.size());
            ++g_failures;
        }
    }
    const std::string msg = open_error(good.substr(0, 200));
    if (msg.find("truncated") == std::string::npos) {
        std::fprintf(stderr, "truncation message: %s\n", msg.c_str());
        ++g_failures;
    }
}

// Random byte corruptions: open must succeed or throw bonsai::Error (never crash or hang).
void test_corruption() {
    const std::string good = valid_file();
    std::mt19937 rng(1234);
    const size_t header_end = good.size() - kValidDataBytes;
    for (int iter = 0; iter < 1500; ++iter) {
        std::string bad = good;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < flips; ++k) {
            const size_t pos = rng() % header_end;
            bad[pos] = static_cast<char>(rng() % 3 == 0 ? 0xff : rng());
        }
        TempFile tf(bad);
        try {
            auto f = GgufFile::open(tf.path, iter % 2 == 0);
            for (const auto& t : f->tensors()) {
                volatile uint8_t sink = t.data[0] ^ t.data[t.nbytes - 1];
                (void)sink;
            }
        } catch (const Error&) {
        }
    }
}

void test_missing_file() {
    try {
        GgufFile::open("/nonexistent/dir/model.gguf");
        CHECK(false);
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("cannot open '/nonexistent/dir/model.gguf'") != std::string::npos);
    }
    try {
        GgufFile::open(std::filesystem::temp_directory_path().string());
        CHECK(false);
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("is a directory") != std::string::npos);
    }
}

}  // namespace

int main() {
    test_valid_file(true);
    test_valid_file(false);
    test_id42_padding();
    test_malformed();
    test_truncation();
    test_corruption();
    test_missing_file();
    if (g_failures) {
        std::fprintf(stderr, "test_gguf: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("test_gguf: all passed\n");
    return 0;
}
