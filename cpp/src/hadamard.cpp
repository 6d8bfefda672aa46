// Reading and validating the prism.hadamard contract (see bonsai/hadamard.h). Names are checked
// against the model's linear weights in model.cpp (bind_hadamard), where the tensors are known.
#include "bonsai/hadamard.h"

#include <cmath>
#include <set>

#include "bonsai/error.h"
#include "bonsai/gguf.h"

namespace bonsai {

namespace {

const char* const kPrefix = "prism.hadamard.";
const char* const kTransform = "normalized-sylvester-walsh-hadamard";
const char* const kAxis = "input-last-dimension";

// Integer values of an integer (or integral float) array: writers differ (int32, uint32, floats).
std::vector<int64_t> int_array(const GgufFile& f, const std::string& key, const std::string& path) {
    const GgufValue* v = f.find(key);
    if (!v->is_array()) throw Error(path + ": " + key + " must be an array, the file has " + v->type_name());
    if (!v->f.empty() || v->elem_type == GgufValueType::FLOAT32 || v->elem_type == GgufValueType::FLOAT64) {
        std::vector<int64_t> out;
        for (double d : v->f) {
            if (d != std::floor(d) || std::fabs(d) > 1e15)
                throw Error(path + ": " + key + " holds the non-integer value " + std::to_string(d) +
                            "; re-convert the model");
            out.push_back(static_cast<int64_t>(d));
        }
        return out;
    }
    return f.get_array_i64(key);
}

std::vector<std::string> string_array(const GgufFile& f, const std::string& key, const std::string& path) {
    const GgufValue* v = f.find(key);
    if (!v->is_array() || v->elem_type != GgufValueType::STRING)
        throw Error(path + ": " + key + " must be an array of strings (tensor names), the file has " + v->type_name());
    return v->s;
}

std::string string_key(const GgufFile& f, const std::string& key, const std::string& path) {
    const GgufValue* v = f.find(key);
    if (!v) throw Error(path + ": " + key + " is missing (a version 1 rotation must state it); re-convert the model");
    if (v->is_array() || v->type != GgufValueType::STRING)
        throw Error(path + ": " + key + " must be a string, the file has " + v->type_name());
    return v->s[0];
}

}  // namespace

HadamardContract HadamardContract::read(const GgufFile& f) {
    HadamardContract c;
    const std::string& path = f.path();
    static const std::set<std::string> known = {"version", "block_size", "transform", "axis", "sign_mode",
                                                "weight_names", "sign_widths", "sign_values",
                                                "inverse_weight_names", "gdn_v_grouped"};
    bool any = false;
    for (const GgufKv& kv : f.metadata()) {
        if (kv.key.rfind(kPrefix, 0) != 0) continue;
        any = true;
        if (!known.count(kv.key.substr(std::string(kPrefix).size())))
            throw Error(path + " carries '" + kv.key + "', which is not part of the prism.hadamard version 1 "
                        "contract this engine implements; running it could give wrong output (update the "
                        "engine, or re-convert the model)");
    }
    if (!any) return c;
    const std::string p = kPrefix;
    if (!f.has(p + "version"))
        throw Error(path + " carries prism.hadamard.* keys but no prism.hadamard.version, so its rotation "
                    "cannot be interpreted; re-convert the model (bonsai convert --hadamard B writes every key)");
    const uint64_t version = f.get_u64(p + "version");
    if (version != 1)
        throw Error(path + ": prism.hadamard.version " + std::to_string(version) + " is not supported (this "
                    "engine implements version 1); update the engine or re-convert the model");
    c.present = true;
    if (!f.has(p + "block_size"))
        throw Error(path + ": prism.hadamard.block_size is missing; re-convert the model");
    const uint64_t block = f.get_u64(p + "block_size");
    if (block < 2 || (block & (block - 1)) != 0 || block > (1u << 20))
        throw Error(path + ": prism.hadamard.block_size " + std::to_string(block) + " is not a power of two "
                    "(the Walsh-Hadamard transform is defined for B = 2^k); re-convert the model");
    c.block = static_cast<int64_t>(block);

    const std::string transform = string_key(f, p + "transform", path);
    if (transform != kTransform)
        throw Error(path + ": prism.hadamard.transform '" + transform + "' is not supported (this engine "
                    "implements '" + kTransform + "')");
    const std::string axis = string_key(f, p + "axis", path);
    if (axis != kAxis)
        throw Error(path + ": prism.hadamard.axis '" + axis + "' is not supported (this engine implements '" +
                    kAxis + "')");
    const std::string mode = f.has(p + "sign_mode") ? string_key(f, p + "sign_mode", path) : "identity";
    if (mode != "identity" && mode != "explicit")
        throw Error(path + ": prism.hadamard.sign_mode '" + mode + "' is not supported (identity or explicit)");
    c.explicit_signs = mode == "explicit";

    const bool has_widths = f.has(p + "sign_widths"), has_values = f.has(p + "sign_values");
    if (!c.explicit_signs && (has_widths || has_values))
        throw Error(path + ": prism.hadamard.sign_mode is identity but the file carries sign_widths/sign_values; "
                    "the signs would be ignored, so the file is inconsistent (re-convert the model)");
    if (c.explicit_signs) {
        if (!has_widths || !has_values)
            throw Error(path + ": prism.hadamard.sign_mode is explicit but prism.hadamard." +
                        (has_widths ? "sign_values" : "sign_widths") + " is missing; re-convert the model");
        const std::vector<int64_t> widths = int_array(f, p + "sign_widths", path);
        const std::vector<int64_t> values = int_array(f, p + "sign_values", path);
        int64_t total = 0;
        for (int64_t w : widths) {
            if (w <= 0 || w % c.block != 0)
                throw Error(path + ": prism.hadamard.sign_widths has the width " + std::to_string(w) +
                            ", not a positive multiple of block_size " + std::to_string(c.block) +
                            "; re-convert the model");
            if (c.signs.count(w))
                throw Error(path + ": prism.hadamard.sign_widths lists the width " + std::to_string(w) +
                            " twice; re-convert the model");
            c.signs[w];
            total += w;
        }
        if (total != static_cast<int64_t>(values.size()))
            throw Error(path + ": prism.hadamard.sign_values has " + std::to_string(values.size()) +
                        " values but sign_widths add up to " + std::to_string(total) +
                        " (one value per width element); the lengths are inconsistent, re-convert the model");
        size_t at = 0;
        for (int64_t w : widths) {
            std::vector<float>& s = c.signs[w];
            s.resize(static_cast<size_t>(w));
            for (int64_t i = 0; i < w; ++i, ++at) {
                if (values[at] != 1 && values[at] != -1)
                    throw Error(path + ": prism.hadamard.sign_values[" + std::to_string(at) + "] is " +
                                std::to_string(values[at]) + "; every sign must be +1 or -1 (re-convert the model)");
                s[static_cast<size_t>(i)] = static_cast<float>(values[at]);
            }
        }
    }

    if (!f.has(p + "weight_names"))
        throw Error(path + ": prism.hadamard.weight_names is missing (which weights are folded?); "
                    "re-convert the model");
    c.weight_names = string_array(f, p + "weight_names", path);
    std::set<std::string> seen;
    for (const std::string& n : c.weight_names)
        if (!seen.insert(n).second)
            throw Error(path + ": prism.hadamard.weight_names lists '" + n + "' twice; re-convert the model");
    if (f.has(p + "inverse_weight_names")) {
        for (const std::string& n : string_array(f, p + "inverse_weight_names", path)) {
            if (n != "token_embd.weight")
                throw Error(path + ": prism.hadamard.inverse_weight_names lists '" + n + "'; only "
                            "token_embd.weight can be folded inverse (the embedding lookup)");
            if (seen.count(n))
                throw Error(path + ": '" + n + "' is in both prism.hadamard.weight_names and "
                            "inverse_weight_names; a tensor is folded one way only (re-convert the model)");
            c.inverse_token_embd = true;
        }
    }
    if (f.has(p + "gdn_v_grouped")) c.gdn_v_grouped = f.get_bool(p + "gdn_v_grouped");
    return c;
}

Rotation HadamardContract::rotation_for(const std::string& name, int64_t width) const {
    if (width % block != 0)
        throw Error("'" + name + "' is folded by the Hadamard rotation but its input width " + std::to_string(width) +
                    " is not a multiple of prism.hadamard.block_size " + std::to_string(block) +
                    "; re-convert the model with a block that divides every folded width");
    Rotation r;
    r.block = block;
    if (explicit_signs) {
        const auto it = signs.find(width);
        if (it == signs.end())
            throw Error("'" + name + "' is folded by the Hadamard rotation but prism.hadamard.sign_widths has no "
                        "sign vector for its input width " + std::to_string(width) + "; re-convert the model");
        r.signs = it->second.data();
    }
    return r;
}

int64_t HadamardContract::sign_floats() const {
    int64_t n = 0;
    for (const auto& kv : signs) n += static_cast<int64_t>(kv.second.size());
    return n;
}

}  // namespace bonsai
