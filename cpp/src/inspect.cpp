// Text report of a GGUF file for `bonsai_run --inspect` (see bonsai/inspect.h).
//
// Bits per weight are honest: stored bytes (block scales included) * 8 over element counts, for
// the linear layers of the blocks and, over the whole file, file size * 8 over all elements.
#include "bonsai/inspect.h"

#include <cstdarg>
#include <cstdio>
#include <map>
#include <regex>
#include <vector>

namespace bonsai {

namespace {

std::string format(const char* fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    const int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
    std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
    va_end(ap2);
    return out;
}

std::string human_bytes(uint64_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = static_cast<double>(n);
    int u = 0;
    while (x >= 1024 && u < 4) {
        x /= 1024;
        ++u;
    }
    return u == 0 ? format("%llu B", static_cast<unsigned long long>(n)) : format("%.2f %s", x, units[u]);
}

std::string shape_text(const GgufTensor& t) {  // numpy order: rows first
    std::string s;
    for (size_t k = t.ne.size(); k-- > 0;) s += (s.empty() ? "" : " x ") + std::to_string(t.ne[k]);
    return s;
}

std::string tensor_type_name(const GgufTensor& t) {
    return t.supported ? type_traits(t.type)->name : ggml_type_name(t.file_id);
}

std::string arch_summary(const GgufFile& f) {
    const std::string arch = f.get_string("general.architecture", "");
    if (arch.empty()) return "architecture: (general.architecture missing)\n";
    std::string s = "architecture: " + arch;
    std::vector<std::string> parts;
    auto num = [&](const std::string& key, const char* label) {
        const GgufValue* v = f.find(key);
        if (v && !v->is_array() && v->type != GgufValueType::STRING)
            parts.push_back(std::string(label) + " " + v->to_string());
    };
    num(arch + ".block_count", "blocks");
    if (const GgufValue* tok = f.find("tokenizer.ggml.tokens"); tok && tok->is_array())
        parts.push_back("vocab " + std::to_string(tok->size()));
    num(arch + ".embedding_length", "embedding");
    num(arch + ".feed_forward_length", "ffn");
    num(arch + ".attention.head_count", "heads");
    num(arch + ".attention.head_count_kv", "kv heads");
    num(arch + ".context_length", "context");
    for (size_t k = 0; k < parts.size(); ++k) s += (k ? ", " : " (") + parts[k];
    s += parts.empty() ? "\n" : ")\n";
    const GgufValue* name = f.find("general.name");
    if (name && name->type == GgufValueType::STRING) s += "name: " + name->s[0] + "\n";
    return s;
}

}  // namespace

bool is_linear_weight(const std::string& name) {
    static const std::regex re(
        R"(blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight)");
    return std::regex_match(name, re);
}

BpwSummary compute_bpw(const GgufFile& f) {
    BpwSummary b;
    for (const GgufTensor& t : f.tensors()) {
        b.total_elements += t.n_elements();
        if (t.ne.size() == 2 && is_linear_weight(t.name)) {
            b.linear_elements += t.n_elements();
            b.linear_bytes += t.nbytes;
            ++b.linear_tensors;
        }
    }
    if (b.linear_elements) b.linear_bpw = 8.0 * static_cast<double>(b.linear_bytes) / b.linear_elements;
    if (b.total_elements) b.file_bpw = 8.0 * static_cast<double>(f.file_size()) / b.total_elements;
    return b;
}

std::string format_inspect(const GgufFile& f, bool with_tensors) {
    std::string out = format("file: %s (%s, GGUF v%u, alignment %u, %zu tensors, %zu metadata keys)\n",
                             f.path().c_str(), human_bytes(f.file_size()).c_str(), f.version(),
                             f.alignment(), f.tensors().size(), f.metadata().size());
    out += arch_summary(f);

    out += "\nmetadata:\n";
    for (const GgufKv& kv : f.metadata())
        out += format("  %-44s %-15s ", kv.key.c_str(), kv.value.type_name().c_str()) +
               kv.value.to_string(6) + "\n";

    if (with_tensors) {
        out += "\ntensors:\n" + format("  %-44s %-10s %-22s %14s\n", "name", "type", "shape", "bytes");
        for (const GgufTensor& t : f.tensors())
            out += format("  %-44s %-10s %-22s %14llu\n", t.name.c_str(), tensor_type_name(t).c_str(),
                          shape_text(t).c_str(), static_cast<unsigned long long>(t.nbytes));
    }

    struct Totals {
        int count = 0;
        int64_t elements = 0;
        uint64_t bytes = 0;
        bool supported = true;
    };
    std::map<std::string, Totals> by_type;
    Totals all;
    for (const GgufTensor& t : f.tensors()) {
        Totals& x = by_type[tensor_type_name(t)];
        ++x.count;
        x.elements += t.n_elements();
        x.bytes += t.nbytes;
        x.supported = t.supported;
        ++all.count;
        all.elements += t.n_elements();
        all.bytes += t.nbytes;
    }
    out += "\ntotals per type:\n" +
           format("  %-10s %8s %16s %16s %8s\n", "type", "tensors", "elements", "bytes", "bpw");
    auto row = [&](const std::string& name, const Totals& x) {
        const double bpw = x.elements ? 8.0 * static_cast<double>(x.bytes) / x.elements : 0.0;
        out += format("  %-10s %8d %16lld %16llu %8.4f\n", name.c_str(), x.count,
                      static_cast<long long>(x.elements), static_cast<unsigned long long>(x.bytes), bpw);
    };
    for (const auto& [name, x] : by_type) row(name, x);
    row("total", all);

    const BpwSummary b = compute_bpw(f);
    out += "\nbits per weight (stored bytes incl. scales):\n";
    if (b.linear_tensors)
        out += format("  linear layers: %.4f bpw over %d tensors (%lld weights, %s)\n", b.linear_bpw,
                      b.linear_tensors, static_cast<long long>(b.linear_elements),
                      human_bytes(b.linear_bytes).c_str());
    else
        out += "  linear layers: none found (no blk.N.attn_*/ffn_* weights)\n";
    out += format("  whole file:    %.4f bpw (%s over %lld weights)\n", b.file_bpw,
                  human_bytes(f.file_size()).c_str(), static_cast<long long>(b.total_elements));

    std::string unsupported;
    int n_unsupported = 0;
    for (const auto& [name, x] : by_type) {
        if (x.supported) continue;
        n_unsupported += x.count;
        unsupported += (unsupported.empty() ? "" : ", ") + name + " (" + std::to_string(x.count) + ")";
    }
    if (n_unsupported)
        out += format("\nwarning: %d tensors have types the engine cannot run: ", n_unsupported) +
               unsupported + "; re-convert the model with bonsai-convert to run it\n";
    return out;
}

}  // namespace bonsai
