// Vocab::from_spm_model_file: reads a SentencePiece `tokenizer.model` (a serialized ModelProto)
// with a minimal protobuf wire-format reader. Fields used (sentencepiece_model.proto):
//   ModelProto      1: repeated SentencePiece pieces   2: TrainerSpec   3: NormalizerSpec
//   SentencePiece   1: piece (string)   2: score (float)   3: type (enum, default NORMAL = 1)
//   TrainerSpec     3: model_type (UNIGRAM 1, BPE 2, WORD 3, CHAR 4)   35: byte_fallback
//                   40: unk_id (default 0)   41: bos_id (1)   42: eos_id (2)   43: pad_id (-1)
//   NormalizerSpec  3: add_dummy_prefix (default true)
// Wire format: each field is a varint key (field number << 3 | wire type) followed by a varint
// (type 0), 8 bytes (1), a varint length and that many bytes (2) or 4 bytes (5). Unknown fields
// are skipped. Normalization rules (NFKC, whitespace collapsing) are not applied, as in llama.cpp's
// GGUF conversion of the same file.
#include <cstring>

#include "bonsai/error.h"
#include "bonsai/input_file.h"
#include "bonsai/vocab.h"

namespace bonsai {

namespace {

class ProtoReader {
public:
    ProtoReader(const uint8_t* p, size_t n, const std::string& where) : p_(p), n_(n), where_(where) {}

    bool done() const { return pos_ >= n_; }

    // Reads the next key; returns the field number and sets the wire type.
    uint32_t next_field(uint32_t& wire) {
        const uint64_t key = varint();
        wire = static_cast<uint32_t>(key & 7);
        return static_cast<uint32_t>(key >> 3);
    }

    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (pos_ >= n_) fail("truncated varint");
            const uint8_t b = p_[pos_++];
            v |= static_cast<uint64_t>(b & 0x7F) << shift;
            if (!(b & 0x80)) return v;
        }
        fail("varint longer than 10 bytes");
    }

    std::pair<const uint8_t*, size_t> bytes() {
        const uint64_t len = varint();
        if (len > n_ - pos_) fail("length-delimited field runs past the end");
        const uint8_t* start = p_ + pos_;
        pos_ += static_cast<size_t>(len);
        return {start, static_cast<size_t>(len)};
    }

    float fixed32_float() {
        if (n_ - pos_ < 4) fail("truncated 32-bit field");
        float f;
        std::memcpy(&f, p_ + pos_, 4);  // little-endian on every supported target
        pos_ += 4;
        return f;
    }

    void skip(uint32_t wire) {
        switch (wire) {
            case 0: varint(); break;
            case 1:
                if (n_ - pos_ < 8) fail("truncated 64-bit field");
                pos_ += 8;
                break;
            case 2: bytes(); break;
            case 5: fixed32_float(); break;
            default: fail("unsupported wire type " + std::to_string(wire));
        }
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw Error(where_ + " is not a valid SentencePiece model (" + what + " at byte " +
                    std::to_string(pos_) + "); pass the tokenizer.model the model was trained with.");
    }

private:
    const uint8_t* p_;
    size_t n_;
    size_t pos_ = 0;
    std::string where_;
};

void expect_wire(ProtoReader& r, uint32_t wire, uint32_t want, const char* field) {
    if (wire != want) r.fail(std::string("field ") + field + " has the wrong wire type");
}

}  // namespace

Vocab Vocab::from_spm_model_file(const std::string& path) {
    const std::string buf = read_input_file(path, "the tokenizer file", "--tokenizer", size_t{1} << 30);
    const std::string where = "'" + path + "'";

    VocabData d;
    d.model = "llama";
    int64_t model_type = 1, unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
    bool add_dummy_prefix = true;

    ProtoReader top(reinterpret_cast<const uint8_t*>(buf.data()), buf.size(), where);
    while (!top.done()) {
        uint32_t wire;
        const uint32_t field = top.next_field(wire);
        if (field == 1) {
            expect_wire(top, wire, 2, "pieces");
            auto [p, n] = top.bytes();
            ProtoReader r(p, n, where);
            std::string piece;
            float score = 0.0f;
            int64_t type = 1;
            while (!r.done()) {
                uint32_t w;
                const uint32_t fld = r.next_field(w);
                if (fld == 1) {
                    expect_wire(r, w, 2, "piece");
                    auto [s, len] = r.bytes();
                    piece.assign(reinterpret_cast<const char*>(s), len);
                } else if (fld == 2) {
                    expect_wire(r, w, 5, "score");
                    score = r.fixed32_float();
                } else if (fld == 3) {
                    expect_wire(r, w, 0, "type");
                    type = static_cast<int64_t>(r.varint());
                } else {
                    r.skip(w);
                }
            }
            if (type < 1 || type > 6) r.fail("piece " + std::to_string(d.tokens.size()) + " has unknown type " + std::to_string(type));
            d.tokens.push_back(std::move(piece));
            d.scores.push_back(score);
            d.types.push_back(static_cast<int32_t>(type));
        } else if (field == 2 || field == 3) {
            expect_wire(top, wire, 2, field == 2 ? "trainer_spec" : "normalizer_spec");
            auto [p, n] = top.bytes();
            ProtoReader r(p, n, where);
            while (!r.done()) {
                uint32_t w;
                const uint32_t fld = r.next_field(w);
                // int32 fields: negative values are 10-byte varints of the sign-extended value.
                auto int_value = [&](int64_t& dst) {
                    expect_wire(r, w, 0, "id");
                    dst = static_cast<int32_t>(static_cast<uint32_t>(r.varint()));
                };
                if (field == 2 && fld == 3) int_value(model_type);
                else if (field == 2 && fld == 40) int_value(unk_id);
                else if (field == 2 && fld == 41) int_value(bos_id);
                else if (field == 2 && fld == 42) int_value(eos_id);
                else if (field == 2 && fld == 43) int_value(pad_id);
                else if (field == 3 && fld == 3) {
                    expect_wire(r, w, 0, "add_dummy_prefix");
                    add_dummy_prefix = r.varint() != 0;
                } else {
                    r.skip(w);
                }
            }
        } else {
            top.skip(wire);
        }
    }
    if (d.tokens.empty()) {
        throw Error(where + " holds no pieces: it is not a SentencePiece tokenizer.model.");
    }
    if (model_type != 1 && model_type != 2) {
        throw Error(where + " is a SentencePiece " + std::string(model_type == 3 ? "WORD" : "CHAR") +
                    " model; only BPE and unigram tokenizer.model files are supported.");
    }
    const int64_t n = static_cast<int64_t>(d.tokens.size());
    auto id_or_none = [&](int64_t id) { return id >= 0 && id < n ? static_cast<int32_t>(id) : -1; };
    d.unk_id = id_or_none(unk_id);
    d.bos_id = id_or_none(bos_id);
    d.eos_id = id_or_none(eos_id);
    d.pad_id = id_or_none(pad_id);
    d.add_bos = d.bos_id >= 0;
    d.add_space_prefix = add_dummy_prefix;
    return Vocab(std::move(d));
}

}  // namespace bonsai
