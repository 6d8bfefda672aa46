// GGUF metadata values: type names, rendering for inspect, and the typed getters of GgufFile.
//
// Getters are strict about kind (a string is never read as a number) but lenient about width:
// converters disagree on whether e.g. `{arch}.block_count` is UINT32 or INT32, so any integer type
// is accepted when the value fits the requested one, and a value that does not fit is an error
// naming the key rather than a silent wrap-around.
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "bonsai/error.h"
#include "bonsai/gguf.h"

namespace bonsai {

namespace {

bool is_unsigned(GgufValueType t) {
    return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
           t == GgufValueType::UINT64;
}

bool is_signed(GgufValueType t) {
    return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
           t == GgufValueType::INT64;
}

bool is_float(GgufValueType t) {
    return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

std::string render_string(const std::string& s, size_t max_chars) {
    std::string out = "\"";
    size_t shown = 0;
    for (char c : s) {
        if (shown == max_chars) break;
        ++shown;
        switch (c) {
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            default:
                if (static_cast<unsigned char>(c) < 32) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
                    out += buf;
                } else {
                    out += c;
                }
        }
    }
    out += "\"";
    if (shown < s.size()) out += "... (" + std::to_string(s.size()) + " chars)";
    return out;
}

// Shortest decimal that reads back as the same value (float32 values as float32).
std::string render_float(double x, bool single) {
    char buf[40];
    for (int prec = single ? 6 : 15; prec <= 17; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, x);
        const double back = std::strtod(buf, nullptr);
        if (single ? static_cast<float>(back) == static_cast<float>(x) : back == x) break;
    }
    return buf;
}

// Element k of v as text.
std::string render_element(const GgufValue& v, size_t k, size_t max_chars) {
    switch (v.elem_type) {
        case GgufValueType::STRING: return render_string(v.s[k], max_chars);
        case GgufValueType::BOOL: return v.u[k] ? "true" : "false";
        case GgufValueType::FLOAT32: return render_float(v.f[k], true);
        case GgufValueType::FLOAT64: return render_float(v.f[k], false);
        default: break;
    }
    if (is_signed(v.elem_type)) return std::to_string(v.i[k]);
    return std::to_string(v.u[k]);
}

}  // namespace

std::string gguf_value_type_name(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8: return "UINT8";
        case GgufValueType::INT8: return "INT8";
        case GgufValueType::UINT16: return "UINT16";
        case GgufValueType::INT16: return "INT16";
        case GgufValueType::UINT32: return "UINT32";
        case GgufValueType::INT32: return "INT32";
        case GgufValueType::FLOAT32: return "FLOAT32";
        case GgufValueType::BOOL: return "BOOL";
        case GgufValueType::STRING: return "STRING";
        case GgufValueType::ARRAY: return "ARRAY";
        case GgufValueType::UINT64: return "UINT64";
        case GgufValueType::INT64: return "INT64";
        case GgufValueType::FLOAT64: return "FLOAT64";
    }
    return "unknown value type " + std::to_string(static_cast<uint32_t>(t));
}

size_t GgufValue::size() const {
    if (elem_type == GgufValueType::STRING) return s.size();
    if (is_float(elem_type)) return f.size();
    if (is_signed(elem_type)) return i.size();
    return u.size();
}

std::string GgufValue::type_name() const {
    if (is_array()) return "ARRAY[" + gguf_value_type_name(elem_type) + "]";
    return gguf_value_type_name(type);
}

std::string GgufValue::to_string(size_t max_items) const {
    if (!is_array()) return size() ? render_element(*this, 0, 60) : "";
    const size_t n = size();
    std::string out = "[" + gguf_value_type_name(elem_type) + " x " + std::to_string(n) + "]";
    const size_t shown = n < max_items ? n : max_items;
    for (size_t k = 0; k < shown; ++k) out += (k ? ", " : " ") + render_element(*this, k, 24);
    if (shown < n) out += ", ...";
    return out;
}

const GgufValue* GgufFile::find(const std::string& key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufValue& GgufFile::require(const std::string& key) const {
    if (const GgufValue* v = find(key)) return *v;
    fail("metadata key '" + key + "' is missing; the file is incomplete or was converted for a "
         "different architecture");
}

namespace {

// Integer value of a scalar key, range-checked against [lo, hi]. `fail` is GgufFile::fail bound
// to the file (passed in so that the helper stays free of GgufFile's private state).
template <class T, class Fail>
T integer_value(const GgufValue& v, const std::string& key, Fail fail) {
    if (v.is_array() || !(is_unsigned(v.type) || is_signed(v.type)))
        fail("metadata key '" + key + "' holds " + v.type_name() + ", expected an integer");
    constexpr auto lo = std::numeric_limits<T>::min();
    constexpr auto hi = std::numeric_limits<T>::max();
    if (is_unsigned(v.type)) {
        if (v.u[0] > static_cast<uint64_t>(hi))
            fail("metadata key '" + key + "' = " + std::to_string(v.u[0]) +
                 " is out of range for this setting; the file is corrupt");
        return static_cast<T>(v.u[0]);
    }
    const int64_t x = v.i[0];
    const bool below = std::numeric_limits<T>::is_signed ? x < static_cast<int64_t>(lo) : x < 0;
    const bool above = x > 0 && static_cast<uint64_t>(x) > static_cast<uint64_t>(hi);
    if (below || above)
        fail("metadata key '" + key + "' = " + std::to_string(x) +
             " is out of range for this setting; the file is corrupt");
    return static_cast<T>(x);
}

}  // namespace

#define BONSAI_INT_GETTER(NAME, T)                                                        \
    T GgufFile::NAME(const std::string& key) const {                                      \
        return integer_value<T>(require(key), key, [this](const std::string& m) { fail(m); }); \
    }                                                                                     \
    T GgufFile::NAME(const std::string& key, T def) const {                               \
        const GgufValue* v = find(key);                                                   \
        return v ? integer_value<T>(*v, key, [this](const std::string& m) { fail(m); }) : def; \
    }
BONSAI_INT_GETTER(get_u32, uint32_t)
BONSAI_INT_GETTER(get_u64, uint64_t)
BONSAI_INT_GETTER(get_i32, int32_t)
BONSAI_INT_GETTER(get_i64, int64_t)
#undef BONSAI_INT_GETTER

std::string GgufFile::get_string(const std::string& key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufValueType::STRING)
        fail("metadata key '" + key + "' holds " + v.type_name() + ", expected STRING");
    return v.s[0];
}

std::string GgufFile::get_string(const std::string& key, const std::string& def) const {
    return has(key) ? get_string(key) : def;
}

double GgufFile::get_f64(const std::string& key) const {
    const GgufValue& v = require(key);
    if (v.is_array() || v.type == GgufValueType::STRING || v.type == GgufValueType::BOOL)
        fail("metadata key '" + key + "' holds " + v.type_name() + ", expected a number");
    if (is_float(v.type)) return v.f[0];
    if (is_signed(v.type)) return static_cast<double>(v.i[0]);
    return static_cast<double>(v.u[0]);
}

double GgufFile::get_f64(const std::string& key, double def) const {
    return has(key) ? get_f64(key) : def;
}

float GgufFile::get_f32(const std::string& key) const {
    return static_cast<float>(get_f64(key));
}

float GgufFile::get_f32(const std::string& key, float def) const {
    return has(key) ? get_f32(key) : def;
}

bool GgufFile::get_bool(const std::string& key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufValueType::BOOL)
        fail("metadata key '" + key + "' holds " + v.type_name() + ", expected BOOL");
    return v.u[0] != 0;
}

bool GgufFile::get_bool(const std::string& key, bool def) const {
    return has(key) ? get_bool(key) : def;
}

size_t GgufFile::get_array_size(const std::string& key) const {
    const GgufValue& v = require(key);
    if (!v.is_array()) fail("metadata key '" + key + "' holds " + v.type_name() + ", expected an array");
    return v.size();
}

const std::vector<std::string>& GgufFile::get_array_strings(const std::string& key) const {
    const GgufValue& v = require(key);
    if (!v.is_array() || v.elem_type != GgufValueType::STRING)
        fail("metadata key '" + key + "' holds " + v.type_name() + ", expected ARRAY[STRING]");
    return v.s;
}

std::vector<int64_t> GgufFile::get_array_i64(const std::string& key) const {
    const GgufValue& v = require(key);
    if (!v.is_array() || !(is_signed(v.elem_type) || is_unsigned(v.elem_type) || v.elem_type == GgufValueType::BOOL))
        fail("metadata key '" + key + "' holds " + v.type_name() + ", expected an integer array (booleans count as 0 / 1)");
    if (is_signed(v.elem_type)) return v.i;
    std::vector<int64_t> out;
    out.reserve(v.u.size());
    for (uint64_t x : v.u) {
        if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            fail("metadata key '" + key + "' holds a value out of range; the file is corrupt");
        out.push_back(static_cast<int64_t>(x));
    }
    return out;
}

std::vector<float> GgufFile::get_array_f32(const std::string& key) const {
    const GgufValue& v = require(key);
    if (!v.is_array() || !is_float(v.elem_type))
        fail("metadata key '" + key + "' holds " + v.type_name() + ", expected a float array");
    return std::vector<float>(v.f.begin(), v.f.end());
}

}  // namespace bonsai
