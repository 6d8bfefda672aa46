// SentencePiece BPE encoding (tokenizer.ggml.model = "llama"), the algorithm of sentencepiece's
// bpe_model: the fragment (spaces already U+2581) starts as one symbol per UTF-8 character; the
// adjacent pair whose concatenation is a normal or user-defined piece with the highest score is
// merged (leftmost first on ties), repeatedly, until no adjacent pair forms a piece. A symbol that
// is still not a piece (only single characters can be: every merge result is one) becomes its
// UTF-8 bytes as <0xNN> byte tokens (byte fallback), or unk when the vocabulary has no byte tokens.
#include <queue>

#include "bonsai/unicode.h"
#include "vocab_state.h"

namespace bonsai {

namespace {

struct Symbol {
    int32_t prev;
    int32_t next;
    uint32_t offset;  // bytes of the fragment this symbol covers
    uint32_t len;     // 0 once merged into its left neighbour
};

struct Bigram {
    float score;
    int32_t left;
    uint32_t len;  // combined byte length when queued: a mismatch later means the entry is stale
    int32_t id;
    bool operator<(const Bigram& o) const {  // max-heap: best score, then leftmost
        return score != o.score ? score < o.score : left > o.left;
    }
};

bool mergeable(const VocabState& st, int32_t id) {
    return id >= 0 && (st.types[id] == TOKEN_TYPE_NORMAL || st.types[id] == TOKEN_TYPE_USER_DEFINED);
}

}  // namespace

void tokenize_spm(const VocabState& st, std::string_view text, std::vector<int32_t>& out) {
    const auto chars = unicode::decode_utf8(text);
    const int32_t n = static_cast<int32_t>(chars.size());
    if (n == 0) return;
    std::vector<Symbol> sym(n);
    for (int32_t i = 0; i < n; ++i) {
        sym[i] = {i - 1, i + 1 < n ? i + 1 : -1, chars[i].offset, chars[i].len};
    }
    std::priority_queue<Bigram> heap;
    auto push_pair = [&](int32_t left) {
        if (left < 0) return;
        const int32_t right = sym[left].next;
        if (right < 0) return;
        const uint32_t len = sym[left].len + sym[right].len;
        const int32_t id = st.find(text.substr(sym[left].offset, len));
        if (mergeable(st, id)) heap.push({st.scores[id], left, len, id});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

    while (!heap.empty()) {
        const Bigram b = heap.top();
        heap.pop();
        Symbol& l = sym[b.left];
        if (l.len == 0 || l.next < 0) continue;
        Symbol& r = sym[l.next];
        if (l.len + r.len != b.len) continue;  // a side changed since this pair was queued
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = b.left;
        push_pair(l.prev);
        push_pair(b.left);
    }

    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        const std::string_view piece = text.substr(sym[i].offset, sym[i].len);
        const int32_t id = st.find(piece);
        if (mergeable(st, id)) {
            out.push_back(id);
            continue;
        }
        for (unsigned char c : piece) {
            const int32_t bt = st.byte_tokens[c];
            if (bt >= 0) {
                out.push_back(bt);
            } else {
                if (st.unk >= 0) out.push_back(st.unk);
                break;  // one unk for the whole character
            }
        }
    }
}

}  // namespace bonsai
