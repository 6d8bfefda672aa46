// GGUF v3 parsing and validation (layout: see bonsai/gguf.h).
//
// The parser walks the mapped bytes with a bounds-checked cursor: every read first checks the
// bytes that remain, and every count or length read from the file is compared with what the rest
// of the file could possibly hold before anything is allocated for it, so a corrupt or truncated
// file ends in one clear error instead of a huge allocation or a read past the mapping.
//
// Tensor placement is checked once all infos are read: offsets are sorted, each tensor's byte size
// (from its type geometry, or for id 42 and ids of unknown geometry from the span to the next
// offset) must end before the next tensor starts and before the end of the file.
#include "bonsai/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "bonsai/error.h"
#include "bonsai/quant_blocks.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

namespace bonsai {

namespace {

constexpr int kMaxDims = 4;
// Smallest encodings, used to reject absurd counts before allocating for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;          // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims = 0, type, offset

// Block geometry of ggml types the engine does not run, so their byte sizes can still be checked
// and reported (values from ggml's type table).
struct ForeignGeometry {
    uint32_t id;
    int block_size;
    int type_size;
};
constexpr ForeignGeometry kForeign[] = {
    {3, 32, 20},    {6, 32, 22},    {7, 32, 24},    {9, 32, 36},    {10, 256, 84},
    {11, 256, 110}, {12, 256, 144}, {13, 256, 176}, {14, 256, 210}, {15, 256, 292},
    {16, 256, 66},  {17, 256, 74},  {18, 256, 98},  {19, 256, 50},  {20, 32, 18},
    {21, 256, 110}, {22, 256, 82},  {23, 256, 136}, {24, 1, 1},     {25, 1, 2},
    {26, 1, 4},     {27, 1, 8},     {28, 1, 8},     {29, 256, 56},  {39, 32, 17},
    {40, 64, 36},   {41, 128, 18},
};

const ForeignGeometry* foreign_geometry(uint32_t id) {
    for (const auto& g : kForeign)
        if (g.id == id) return &g;
    return nullptr;
}

size_t value_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL: return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16: return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32: return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64: return 8;
        case GgufValueType::STRING: return 8;  // the length prefix, at least
        case GgufValueType::ARRAY: return 12;  // element type + count, at least
    }
    return 0;
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::FLOAT64); }

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Per-tensor facts gathered while reading the infos and needed to place the tensor.
struct TensorGeometry {
    int block_size = 0;  // 0: unknown (size taken from the span to the next tensor)
    int type_size = 0;
};

}  // namespace

// Reads and validates one file into a GgufFile. Separate from GgufFile so that the cursor state
// does not outlive parsing.
class GgufParser {
public:
    explicit GgufParser(GgufFile& f) : f_(f), p_(f.file_->data()), size_(f.file_->size()) {}

    void run() {
        read_header();
        read_kvs();
        read_alignment();
        read_tensor_infos();
        place_tensors();
    }

private:
    [[noreturn]] void fail(const std::string& msg) const { f_.fail(msg); }

    // Ensures n more bytes exist; `what` is only evaluated to build the error message.
    template <class What>
    void need(uint64_t n, What what) const {
        if (n <= size_ - pos_) return;
        fail("file is truncated: " + what() + " needs " + std::to_string(n) + " bytes at offset " +
             std::to_string(pos_) + " but the file ends at " + std::to_string(size_) +
             " bytes; the download or conversion was incomplete, fetch or convert the file again");
    }

    template <class T, class What>
    T read(What what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, p_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    template <class What>
    std::string read_string(What what) {
        const uint64_t len = read<uint64_t>(what);
        if (len > size_ - pos_)
            fail(what() + ": string length " + std::to_string(len) +
                 " runs past the end of the file (" + std::to_string(size_ - pos_) +
                 " bytes left); the file is truncated or corrupt");
        std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
        pos_ += len;
        return s;
    }

    void read_header() {
        if (size_ < 4) fail("file is too small to be a GGUF file (" + std::to_string(size_) +
                            " bytes); it is truncated or not a model file");
        if (std::memcmp(p_, "GGUF", 4) != 0) {
            std::string got;
            for (int k = 0; k < 4; ++k) {
                const unsigned char c = p_[k];
                if (c >= 32 && c < 127) {
                    got += static_cast<char>(c);
                } else {
                    static const char* hex = "0123456789abcdef";
                    got += "\\x";
                    got += hex[c >> 4];
                    got += hex[c & 15];
                }
            }
            fail("not a GGUF file (it starts with '" + got +
                 "', a GGUF file starts with 'GGUF'); pass a .gguf model file, or convert the "
                 "checkpoint with bonsai-convert");
        }
        pos_ = 4;
        const auto hdr = [] { return std::string("the GGUF header"); };
        const uint32_t version = read<uint32_t>(hdr);
        if (version != 3) {
            if (version == 0x03000000u)
                fail("big-endian GGUF files are not supported; convert the model on a "
                     "little-endian machine");
            fail("unsupported GGUF version " + std::to_string(version) +
                 " (this reader needs version 3); re-convert the model with a current converter");
        }
        f_.version_ = version;
        n_tensors_ = read<uint64_t>(hdr);
        n_kv_ = read<uint64_t>(hdr);
        if (n_kv_ > (size_ - pos_) / kMinKvBytes)
            fail("the header claims " + std::to_string(n_kv_) +
                 " metadata entries, more than the file can hold (" + std::to_string(size_) +
                 " bytes); the file is truncated or corrupt");
        if (n_tensors_ > (size_ - pos_) / kMinTensorInfoBytes)
            fail("the header claims " + std::to_string(n_tensors_) +
                 " tensors, more than the file can hold (" + std::to_string(size_) +
                 " bytes); the file is truncated or corrupt");
    }

    void read_kvs() {
        f_.kvs_.reserve(static_cast<size_t>(n_kv_));
        for (uint64_t k = 0; k < n_kv_; ++k) {
            std::string key = read_string([&] { return "the key of metadata entry " + std::to_string(k); });
            const auto ctx = [&] { return "metadata key " + quoted(key); };
            if (f_.kv_index_.count(key)) fail("duplicate metadata key " + quoted(key) +
                                              "; the file is corrupt");
            const uint32_t t = read<uint32_t>(ctx);
            if (!known_value_type(t))
                fail("metadata key " + quoted(key) + " has unknown value type " +
                     std::to_string(t) + "; the file is corrupt or from a newer GGUF version");
            GgufValue v;
            v.type = static_cast<GgufValueType>(t);
            if (v.type == GgufValueType::ARRAY) {
                const uint32_t et = read<uint32_t>(ctx);
                if (!known_value_type(et))
                    fail("metadata key " + quoted(key) + " is an array of unknown value type " +
                         std::to_string(et) + "; the file is corrupt or from a newer GGUF version");
                v.elem_type = static_cast<GgufValueType>(et);
                if (v.elem_type == GgufValueType::ARRAY)
                    fail("metadata key " + quoted(key) +
                         " is an array of arrays, which this reader does not support");
                const uint64_t n = read<uint64_t>(ctx);
                if (n > (size_ - pos_) / value_size(v.elem_type))
                    fail("metadata key " + quoted(key) + " claims an array of " +
                         std::to_string(n) + " " + gguf_value_type_name(v.elem_type) +
                         " elements, more than the rest of the file holds (" +
                         std::to_string(size_ - pos_) + " bytes); the file is truncated or corrupt");
                read_elements(v, n, ctx);
            } else {
                v.elem_type = v.type;
                read_elements(v, 1, ctx);
            }
            f_.kv_index_.emplace(key, f_.kvs_.size());
            f_.kvs_.push_back(GgufKv{std::move(key), std::move(v)});
        }
    }

    // Reads n elements of v.elem_type into the vector of their kind.
    template <class What>
    void read_elements(GgufValue& v, uint64_t n, What ctx) {
        const size_t count = static_cast<size_t>(n);
        switch (v.elem_type) {
            case GgufValueType::STRING:
                v.s.reserve(count);
                for (size_t k = 0; k < count; ++k) v.s.push_back(read_string(ctx));
                return;
            case GgufValueType::UINT8: return read_numbers<uint8_t>(v.u, count, ctx);
            case GgufValueType::BOOL: {
                read_numbers<uint8_t>(v.u, count, ctx);
                for (uint64_t b : v.u)
                    if (b > 1) fail(ctx() + ": bool value " + std::to_string(b) +
                                    " is neither 0 nor 1; the file is corrupt");
                return;
            }
            case GgufValueType::UINT16: return read_numbers<uint16_t>(v.u, count, ctx);
            case GgufValueType::UINT32: return read_numbers<uint32_t>(v.u, count, ctx);
            case GgufValueType::UINT64: return read_numbers<uint64_t>(v.u, count, ctx);
            case GgufValueType::INT8: return read_numbers<int8_t>(v.i, count, ctx);
            case GgufValueType::INT16: return read_numbers<int16_t>(v.i, count, ctx);
            case GgufValueType::INT32: return read_numbers<int32_t>(v.i, count, ctx);
            case GgufValueType::INT64: return read_numbers<int64_t>(v.i, count, ctx);
            case GgufValueType::FLOAT32: return read_numbers<float>(v.f, count, ctx);
            case GgufValueType::FLOAT64: return read_numbers<double>(v.f, count, ctx);
            case GgufValueType::ARRAY: break;
        }
        fail(ctx() + ": unexpected nested array");
    }

    template <class T, class Out, class What>
    void read_numbers(std::vector<Out>& out, size_t count, What ctx) {
        need(static_cast<uint64_t>(count) * sizeof(T), ctx);
        out.resize(count);
        for (size_t k = 0; k < count; ++k) {
            T x;
            std::memcpy(&x, p_ + pos_ + k * sizeof(T), sizeof(T));
            out[k] = static_cast<Out>(x);
        }
        pos_ += static_cast<uint64_t>(count) * sizeof(T);
    }

    void read_alignment() {
        const GgufValue* a = f_.find("general.alignment");
        if (!a) return;
        if (a->is_array() || a->u.empty())
            fail("metadata key 'general.alignment' holds " + a->type_name() +
                 ", expected UINT32; the file is corrupt");
        const uint64_t v = a->u[0];
        if (v == 0 || (v & (v - 1)) != 0 || v > (1u << 30))
            fail("general.alignment is " + std::to_string(v) +
                 ", which is not a power of two; the file is corrupt");
        f_.alignment_ = static_cast<uint32_t>(v);
    }

    void read_tensor_infos() {
        f_.tensors_.reserve(static_cast<size_t>(n_tensors_));
        geometry_.reserve(static_cast<size_t>(n_tensors_));
        for (uint64_t k = 0; k < n_tensors_; ++k) {
            GgufTensor t;
            t.name = read_string([&] { return "the name of tensor " + std::to_string(k); });
            const auto ctx = [&] { return "tensor info of " + quoted(t.name); };
            if (f_.tensor_index_.count(t.name))
                fail("duplicate tensor name " + quoted(t.name) + "; the file is corrupt");
            const uint32_t n_dims = read<uint32_t>(ctx);
            if (n_dims < 1 || n_dims > kMaxDims)
                fail("tensor " + quoted(t.name) + " has " + std::to_string(n_dims) +
                     " dimensions; GGUF tensors have 1 to 4; the file is corrupt");
            int64_t n = 1;
            for (uint32_t d = 0; d < n_dims; ++d) {
                const int64_t v = read<int64_t>(ctx);
                if (v <= 0)
                    fail("tensor " + quoted(t.name) + " has dimension " + std::to_string(d) +
                         " = " + std::to_string(v) + "; dimensions must be positive; the file is "
                         "corrupt");
                if (n > std::numeric_limits<int64_t>::max() / v)
                    fail("tensor " + quoted(t.name) +
                         " has more elements than fit in 64 bits; the file is corrupt");
                n *= v;
                t.ne.push_back(v);
            }
            t.file_id = read<uint32_t>(ctx);
            t.offset = read<uint64_t>(ctx);
            geometry_.push_back(classify(t));
            if (t.offset % f_.alignment_ != 0)
                fail("tensor " + quoted(t.name) + " has data offset " + std::to_string(t.offset) +
                     ", not a multiple of the alignment " + std::to_string(f_.alignment_) +
                     "; the file is corrupt or was written by a broken converter");
            f_.tensor_index_.emplace(t.name, f_.tensors_.size());
            f_.tensors_.push_back(std::move(t));
        }
    }

    // Sets type/supported/nbytes from the file id where the geometry is known, and checks that
    // rows hold whole blocks. Id 42 and unknown ids get their size in place_tensors().
    TensorGeometry classify(GgufTensor& t) {
        TensorGeometry g;
        const TypeTraits* tr = type_traits_from_file_id(t.file_id);
        if (t.file_id == TYPE_Q2_0) {
            g.block_size = QK2_0;  // the smaller of the two id-42 blocks; see resolve_42
        } else if (tr) {
            t.type = tr->type;
            t.supported = true;
            g.block_size = tr->block_size;
            g.type_size = tr->type_size;
        } else if (const ForeignGeometry* fg = foreign_geometry(t.file_id)) {
            g.block_size = fg->block_size;
            g.type_size = fg->type_size;
        }
        if (g.block_size > 0 && t.ne[0] % g.block_size != 0)
            fail("tensor " + quoted(t.name) + " of type " + ggml_type_label(t.file_id) +
                 " has rows of " + std::to_string(t.ne[0]) +
                 " elements, not a multiple of its block size " + std::to_string(g.block_size) +
                 "; the file is corrupt");
        if (g.type_size > 0) {
            const uint64_t blocks = static_cast<uint64_t>(t.n_elements() / g.block_size);
            if (blocks > std::numeric_limits<uint64_t>::max() / g.type_size)
                fail("tensor " + quoted(t.name) + " is too large; the file is corrupt");
            t.nbytes = blocks * static_cast<uint64_t>(g.type_size);
        }
        return g;
    }

    void place_tensors() {
        auto& ts = f_.tensors_;
        f_.data_offset_ = align_up(pos_, f_.alignment_);
        if (ts.empty()) return;
        if (f_.data_offset_ > size_)
            fail("file is truncated: the data section starts at byte " +
                 std::to_string(f_.data_offset_) + " but the file ends at " +
                 std::to_string(size_) + " bytes; fetch or convert the file again");
        const uint64_t data_size = size_ - f_.data_offset_;
        std::vector<size_t> order(ts.size());
        for (size_t k = 0; k < order.size(); ++k) order[k] = k;
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return ts[a].offset < ts[b].offset; });
        for (size_t k = 0; k < order.size(); ++k) {
            GgufTensor& t = ts[order[k]];
            const GgufTensor* next = k + 1 < order.size() ? &ts[order[k + 1]] : nullptr;
            if (t.offset >= data_size) past_end(t, data_size);
            const uint64_t span = (next ? std::min(next->offset, data_size) : data_size) - t.offset;
            if (t.file_id == TYPE_Q2_0) {
                resolve_42(t, span, next == nullptr, data_size);
            } else if (geometry_[order[k]].type_size == 0) {
                t.nbytes = span;  // unknown geometry: all bytes up to the next tensor
            }
            if (t.nbytes > data_size - t.offset) past_end(t, data_size);
            if (next && t.offset + t.nbytes > next->offset)
                fail("tensor " + quoted(t.name) + " (bytes " + std::to_string(t.offset) + ".." +
                     std::to_string(t.offset + t.nbytes) + " of the data section) overlaps tensor " +
                     quoted(next->name) + " at " + std::to_string(next->offset) +
                     "; the file is corrupt");
            if (t.nbytes == 0)
                fail("tensor " + quoted(t.name) + " has no data (another tensor starts at the same "
                     "offset); the file is corrupt");
            t.data = p_ + f_.data_offset_ + t.offset;
        }
    }

    [[noreturn]] void past_end(const GgufTensor& t, uint64_t data_size) const {
        fail("tensor " + quoted(t.name) + " (" + std::to_string(t.nbytes) + " bytes at offset " +
             std::to_string(t.offset) + " of the data section) extends past the end of the file (" +
             std::to_string(data_size) + " data bytes); the file is truncated, fetch or convert "
             "it again");
    }

    // Id 42 is mainline Q2_0 (64-element blocks of 18 bytes) or legacy PrismML Q2_0 with 128-element
    // blocks of 34 bytes. The tensor's size is not stored, so the span to the next tensor decides:
    // an exact fit wins; otherwise exactly one layout must fit with less than one alignment unit of
    // padding after it.
    void resolve_42(GgufTensor& t, uint64_t span, bool last, uint64_t data_size) {
        const int64_t n = t.n_elements();
        GgmlType exact;
        if (resolve_type_42(n, span, &exact) && t.ne[0] % type_traits(exact)->block_size == 0) {
            set_42(t, exact);
            return;
        }
        const GgmlType layouts[2] = {TYPE_Q2_0, TYPE_Q2_0_G128};
        uint64_t sizes[2] = {0, 0};
        int fits = 0;
        GgmlType fit = TYPE_Q2_0;
        for (int k = 0; k < 2; ++k) {
            const TypeTraits* tr = type_traits(layouts[k]);
            if (t.ne[0] % tr->block_size != 0) continue;
            sizes[k] = type_row_bytes(layouts[k], n);
            if (sizes[k] <= span && span <= align_up(sizes[k], f_.alignment_)) {
                ++fits;
                fit = layouts[k];
            }
        }
        if (fits == 1) {
            set_42(t, fit);
            return;
        }
        const std::string g64 = "mainline Q2_0 (64-element blocks, " + std::to_string(sizes[0]) + " bytes)";
        const std::string g128 = "legacy Q2_0 g128 (128-element blocks, " +
                                 (sizes[1] ? std::to_string(sizes[1]) + " bytes)" : "rows too short)");
        if (fits == 2)
            fail("tensor " + quoted(t.name) + " has ggml type id 42 and occupies " +
                 std::to_string(span) + " bytes, which fits both " + g64 + " and " + g128 +
                 "; it cannot be read unambiguously, re-convert it as PQ2_0 or PTQ1_0");
        const uint64_t smallest = sizes[1] && sizes[1] < sizes[0] ? sizes[1] : sizes[0];
        if (last && span < smallest) {
            t.nbytes = smallest;
            past_end(t, data_size);
        }
        fail("tensor " + quoted(t.name) + " has ggml type id 42 with " + std::to_string(n) +
             " elements but occupies " + std::to_string(span) + " bytes, the size of neither " +
             g64 + " nor " + g128 +
             "; the file is corrupt or uses an unknown Q2_0 variant");
    }

    void set_42(GgufTensor& t, GgmlType type) {
        t.type = type;
        t.supported = true;
        t.nbytes = type_row_bytes(type, t.n_elements());
    }

    GgufFile& f_;
    const uint8_t* p_;
    uint64_t size_;
    uint64_t pos_ = 0;
    uint64_t n_tensors_ = 0;
    uint64_t n_kv_ = 0;
    std::vector<TensorGeometry> geometry_;  // parallel to f_.tensors_
};

int64_t GgufTensor::n_elements() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path, bool use_mmap) {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = path;
    f->file_ = MappedFile::open(path, use_mmap);
    GgufParser(*f).run();
    return f;
}

void GgufFile::fail(const std::string& msg) const { throw Error(path_ + ": " + msg); }

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::get_tensor(const std::string& name) const {
    if (const GgufTensor* t = find_tensor(name)) return *t;
    fail("tensor " + quoted(name) + " is missing; the file was converted for a different "
         "architecture or is incomplete");
}

void GgufFile::check_engine_types() const {
    for (const GgufTensor& t : tensors_) {
        if (t.supported) continue;
        fail("tensor " + quoted(t.name) + " has type " + ggml_type_label(t.file_id) +
             ", which is not supported by the engine (it runs F32, F16, BF16, Q8_0, Q4_0, TQ1_0, "
             "TQ2_0, Q2_0, PQ2_0 and PTQ1_0); re-convert the model with bonsai-convert");
    }
}

}  // namespace bonsai
