// Reading a Vocab from metadata keys (llama.cpp's names, tokenizer.ggml.*), through the
// MetadataView interface that a GGUF file (here) or a Python dict (the binding) implements.
#include <limits>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/vocab.h"

namespace bonsai {

namespace {

int32_t read_id(const MetadataView& md, const std::string& key) {
    if (!md.has(key)) return -1;
    const int64_t v = md.get_int(key);
    if (v < -1 || v > std::numeric_limits<int32_t>::max()) {
        throw Error(key + " = " + std::to_string(v) + " is not a valid token id. Fix the GGUF metadata.");
    }
    return static_cast<int32_t>(v);
}

std::optional<bool> read_flag(const MetadataView& md, const std::string& key) {
    if (!md.has(key)) return std::nullopt;
    return md.get_bool(key);
}

// GgufFile's typed getters already throw naming the key and the type it holds.
class GgufMetadata : public MetadataView {
public:
    explicit GgufMetadata(const GgufFile& f) : f_(f) {}
    bool has(const std::string& key) const override { return f_.has(key); }
    std::string get_string(const std::string& key) const override { return f_.get_string(key); }
    int64_t get_int(const std::string& key) const override { return f_.get_i64(key); }
    bool get_bool(const std::string& key) const override { return f_.get_bool(key); }
    std::vector<std::string> get_strings(const std::string& key) const override {
        return f_.get_array_strings(key);
    }
    std::vector<float> get_floats(const std::string& key) const override { return f_.get_array_f32(key); }
    std::vector<int64_t> get_ints(const std::string& key) const override { return f_.get_array_i64(key); }

private:
    const GgufFile& f_;
};

}  // namespace

VocabData Vocab::read_metadata(const MetadataView& md) {
    VocabData d;
    if (!md.has("tokenizer.ggml.model")) {
        throw Error("tokenizer.ggml.model is missing: the file has no tokenizer. Re-convert it with its "
                    "tokenizer or pass one with --tokenizer.");
    }
    d.model = md.get_string("tokenizer.ggml.model");
    if (!md.has("tokenizer.ggml.tokens")) {
        throw Error("tokenizer.ggml.tokens is missing: the file has no vocabulary. Re-convert it with its "
                    "tokenizer or pass one with --tokenizer.");
    }
    d.tokens = md.get_strings("tokenizer.ggml.tokens");
    if (md.has("tokenizer.ggml.pre")) d.pre = md.get_string("tokenizer.ggml.pre");
    if (md.has("tokenizer.ggml.scores")) d.scores = md.get_floats("tokenizer.ggml.scores");
    if (md.has("tokenizer.ggml.token_type")) {
        const std::vector<int64_t> types = md.get_ints("tokenizer.ggml.token_type");
        for (size_t i = 0; i < types.size(); ++i) {
            if (types[i] < TOKEN_TYPE_UNDEFINED || types[i] > TOKEN_TYPE_BYTE) {
                throw Error("tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(types[i]) +
                            " is not a token type (0..6).");
            }
            d.types.push_back(static_cast<int32_t>(types[i]));
        }
    }
    if (md.has("tokenizer.ggml.merges")) d.merges = md.get_strings("tokenizer.ggml.merges");
    d.bos_id = read_id(md, "tokenizer.ggml.bos_token_id");
    d.eos_id = read_id(md, "tokenizer.ggml.eos_token_id");
    d.unk_id = read_id(md, "tokenizer.ggml.unknown_token_id");
    d.pad_id = read_id(md, "tokenizer.ggml.padding_token_id");
    d.eot_id = read_id(md, "tokenizer.ggml.eot_token_id");
    d.eom_id = read_id(md, "tokenizer.ggml.eom_token_id");
    d.add_bos = read_flag(md, "tokenizer.ggml.add_bos_token");
    d.add_eos = read_flag(md, "tokenizer.ggml.add_eos_token");
    d.add_space_prefix = read_flag(md, "tokenizer.ggml.add_space_prefix");
    return d;
}

Vocab Vocab::from_metadata(const MetadataView& md) { return Vocab(read_metadata(md)); }

Vocab Vocab::from_gguf(const GgufFile& file) { return from_metadata(GgufMetadata(file)); }

}  // namespace bonsai
