// Byte-level BPE (tokenizer.ggml.model = "gpt2").
//
// Each pre-token's bytes are mapped through GPT-2's byte alphabet (bytes 0x21-0x7E, 0xA1-0xAC and
// 0xAE-0xFF stand for themselves; the other 68 bytes, in order, for U+0100, U+0101, ...), so every
// byte is one printable character that has a token of its own. The symbols are then merged pairwise:
// always the adjacent pair whose merge has the lowest rank (its index in tokenizer.ggml.merges),
// leftmost first on ties, until no adjacent pair has a merge. A min-heap of candidate pairs keyed
// by (rank, position) gives O(n log n) per pre-token; stale entries (a side already merged away)
// are recognised by the symbol ids they recorded and skipped.
#include <queue>

#include "bonsai/error.h"
#include "bonsai/unicode.h"
#include "vocab_state.h"

namespace bonsai {

namespace {

struct ByteAlphabet {
    uint32_t to_cp[256];
    int16_t from_cp[324];  // code points < 0x144 cover the whole alphabet
};

const ByteAlphabet& byte_alphabet() {
    static const ByteAlphabet a = [] {
        ByteAlphabet t{};
        for (auto& v : t.from_cp) v = -1;
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            t.to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
            t.from_cp[t.to_cp[b]] = static_cast<int16_t>(b);
        }
        return t;
    }();
    return a;
}

uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Decodes a token text of the byte alphabet to bytes; characters outside the alphabet are kept
// as their UTF-8 (a vocabulary may hold such tokens; they can only come from user-defined text).
std::string decode_byte_level(const std::string& text) {
    std::string out;
    for (const auto& ch : unicode::decode_utf8(text)) {
        const int b = codepoint_to_byte(ch.cp);
        if (b >= 0) out += static_cast<char>(b);
        else out.append(text, ch.offset, ch.len);
    }
    return out;
}

struct Candidate {
    int32_t rank;
    int32_t left;         // symbol index
    int32_t left_id;      // token ids when queued: a mismatch later means the entry is stale
    int32_t right_id;
    int32_t result;
    bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
    }
};

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return byte_alphabet().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) {
    return cp < 324 ? byte_alphabet().from_cp[cp] : -1;
}

void build_bpe_tables(VocabState& st, const std::vector<std::string>& merges) {
    for (int b = 0; b < 256; ++b) {
        std::string ch;
        unicode::append_utf8(ch, byte_to_codepoint(static_cast<uint8_t>(b)));
        st.byte_char_tokens[b] = st.find(ch);
    }
    st.merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
        const std::string& m = merges[r];
        const size_t sp = m.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 >= m.size() ||
            m.find(' ', sp + 1) != std::string::npos) {
            throw Error("tokenizer.ggml.merges[" + std::to_string(r) + "] = \"" + m +
                        "\" is malformed: a merge is two token texts separated by one space. "
                        "Re-convert the model's tokenizer.");
        }
        const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
        const int32_t l = st.find(left), rt = st.find(right), res = st.find(left + right);
        if (l < 0 || rt < 0 || res < 0) {
            const std::string& missing = l < 0 ? left : rt < 0 ? right : left + right;
            throw Error("tokenizer.ggml.merges[" + std::to_string(r) + "] = \"" + m +
                        "\" refers to \"" + missing + "\", which is not in tokenizer.ggml.tokens; "
                        "the merges do not belong to this vocabulary. Re-convert the tokenizer.");
        }
        st.merges.emplace(pair_key(l, rt), BpeMerge{static_cast<int32_t>(r), res});
    }
    for (size_t id = 0; id < st.tokens.size(); ++id) {
        if (st.types[id] == TOKEN_TYPE_NORMAL) st.pieces[id] = decode_byte_level(st.tokens[id]);
    }
}

void tokenize_bpe(const VocabState& st, std::string_view text, std::vector<int32_t>& out) {
    std::vector<int32_t> ids, prev, next;
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    std::string encoded;

    auto push_pair = [&](int32_t left) {
        const int32_t right = next[left];
        if (right < 0 || ids[left] < 0 || ids[right] < 0) return;
        auto it = st.merges.find(pair_key(ids[left], ids[right]));
        if (it != st.merges.end()) {
            heap.push({it->second.rank, left, ids[left], ids[right], it->second.result});
        }
    };

    for (const TextSpan& span : pretokenize(st.pre, text)) {
        const std::string_view word = text.substr(span.offset, span.len);
        if (st.ignore_merges) {
            encoded.clear();
            for (unsigned char c : word) unicode::append_utf8(encoded, byte_to_codepoint(c));
            const int32_t id = st.find(encoded);
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
        }
        const int32_t n = static_cast<int32_t>(word.size());
        ids.resize(n);
        prev.resize(n);
        next.resize(n);
        for (int32_t i = 0; i < n; ++i) {
            ids[i] = st.byte_char_tokens[static_cast<unsigned char>(word[i])];
            prev[i] = i - 1;
            next[i] = i + 1 < n ? i + 1 : -1;
        }
        for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
        while (!heap.empty()) {
            const Candidate c = heap.top();
            heap.pop();
            const int32_t right = next[c.left];
            if (ids[c.left] != c.left_id || right < 0 || ids[right] != c.right_id) continue;
            ids[c.left] = c.result;
            ids[right] = -2;  // merged away
            next[c.left] = next[right];
            if (next[right] >= 0) prev[next[right]] = c.left;
            if (prev[c.left] >= 0) push_pair(prev[c.left]);
            push_pair(c.left);
        }
        for (int32_t i = 0; i >= 0 && i < n; i = next[i]) {
            if (ids[i] >= 0) out.push_back(ids[i]);
            else if (st.unk >= 0) out.push_back(st.unk);  // byte without a token of its own
        }
    }
}

}  // namespace bonsai
