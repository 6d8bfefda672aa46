// The tokenizer of a model, built from its GGUF `tokenizer.*` metadata (llama.cpp's key names):
//   - SentencePiece BPE (`tokenizer.ggml.model = "llama"`): spaces become U+2581, a U+2581 is
//     prepended (add_space_prefix), then adjacent pieces are merged by score, best first; pieces
//     left outside the vocabulary become `<0xNN>` byte tokens (byte fallback) or unk.
//   - byte-level BPE (`"gpt2"`): the text is split by the pre-tokenizer's patterns (`default`,
//     `gpt-2`, `llama-bpe` = Llama 3, `qwen2`), each piece is mapped byte by byte to GPT-2's
//     printable byte alphabet and merged by `tokenizer.ggml.merges` rank.
// Control / user-defined token texts are matched before either model runs (control ones only
// with parse_special). A Vocab is immutable after construction and cheap to copy (shared state).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai {

class GgufFile;

enum class VocabType { SPM, BPE };
enum class PreTokenizer { NONE, DEFAULT, GPT2, LLAMA3, QWEN2, QWEN35 };  // NONE for SPM

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum TokenType : int32_t {
    TOKEN_TYPE_UNDEFINED = 0,
    TOKEN_TYPE_NORMAL = 1,
    TOKEN_TYPE_UNKNOWN = 2,
    TOKEN_TYPE_CONTROL = 3,
    TOKEN_TYPE_USER_DEFINED = 4,
    TOKEN_TYPE_UNUSED = 5,
    TOKEN_TYPE_BYTE = 6,
};

// Everything a Vocab is built from: the GGUF keys, already read. Optional fields take the
// defaults of the tokenizer model when absent.
struct VocabData {
    std::string model;                 // tokenizer.ggml.model: "llama" or "gpt2"
    std::string pre;                   // tokenizer.ggml.pre: "default", "gpt-2", "llama-bpe", "qwen2"
    std::vector<std::string> tokens;   // tokenizer.ggml.tokens, by id
    std::vector<float> scores;         // tokenizer.ggml.scores (required for SPM, may be empty for BPE)
    std::vector<int32_t> types;        // tokenizer.ggml.token_type (empty: all normal)
    std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right", rank = index (BPE)
    int32_t bos_id = -1;               // tokenizer.ggml.bos_token_id (-1: none)
    int32_t eos_id = -1;               // tokenizer.ggml.eos_token_id
    int32_t unk_id = -1;               // tokenizer.ggml.unknown_token_id
    int32_t pad_id = -1;               // tokenizer.ggml.padding_token_id
    int32_t eot_id = -1;               // tokenizer.ggml.eot_token_id (end of turn)
    int32_t eom_id = -1;               // tokenizer.ggml.eom_token_id (end of message)
    std::optional<bool> add_bos;           // tokenizer.ggml.add_bos_token (SPM, llama-bpe: true)
    std::optional<bool> add_eos;           // tokenizer.ggml.add_eos_token (default false)
    std::optional<bool> add_space_prefix;  // tokenizer.ggml.add_space_prefix (SPM default true)
};

// Read access to metadata keys, implemented over a GGUF file or a Python dict. Getters throw
// bonsai::Error naming the key when it is absent or has the wrong type.
class MetadataView {
public:
    virtual ~MetadataView() = default;
    virtual bool has(const std::string& key) const = 0;
    virtual std::string get_string(const std::string& key) const = 0;
    virtual int64_t get_int(const std::string& key) const = 0;
    virtual bool get_bool(const std::string& key) const = 0;
    virtual std::vector<std::string> get_strings(const std::string& key) const = 0;
    virtual std::vector<float> get_floats(const std::string& key) const = 0;
    virtual std::vector<int64_t> get_ints(const std::string& key) const = 0;
};

struct VocabState;  // internal: lookup tables (cpp/src/vocab_state.h)

class Vocab {
public:
    // Validates and indexes the data; throws bonsai::Error naming the bad key.
    explicit Vocab(VocabData data);
    // Reads the tokenizer.* keys (see VocabData) and builds the Vocab.
    static Vocab from_metadata(const MetadataView& md);
    // Reads the tokenizer.* keys of an opened GGUF file.
    static Vocab from_gguf(const GgufFile& file);
    // Reads a SentencePiece `tokenizer.model` protobuf (ModelProto) directly.
    static Vocab from_spm_model_file(const std::string& path);
    static VocabData read_metadata(const MetadataView& md);

    // Text (UTF-8 bytes; malformed bytes are kept and tokenized as bytes) to token ids.
    // add_special: BOS/EOS as the vocabulary asks (add_bos / add_eos). parse_special: control
    // token texts such as "<|im_start|>" become their ids (user-defined ones always do).
    std::vector<int32_t> tokenize(std::string_view text, bool add_special = true,
                                  bool parse_special = false) const;
    // The bytes of one token: SPM U+2581 -> ' ', <0xNN> -> that byte; BPE byte alphabet -> bytes;
    // control/unknown tokens -> "" unless render_special (then their text).
    std::string token_to_piece(int32_t id, bool render_special = false) const;
    // Concatenated pieces. For SPM with add_space_prefix, one leading space is removed from text
    // that starts the sequence or follows a special token (where tokenize adds one), so
    // detokenize(tokenize(x)) == x. (llama.cpp removes it only at the start.)
    std::string detokenize(const std::vector<int32_t>& ids, bool render_special = false) const;

    int32_t n_vocab() const;
    VocabType type() const;
    PreTokenizer pre_tokenizer() const;
    const std::string& model_name() const;  // "llama" / "gpt2"
    const std::string& pre_name() const;    // "" for SPM
    int32_t bos() const;  // -1 when the vocabulary has none
    int32_t eos() const;
    int32_t unk() const;
    int32_t pad() const;
    bool add_bos() const;
    bool add_eos() const;
    bool add_space_prefix() const;
    TokenType token_type(int32_t id) const;          // throws for ids out of range
    const std::string& token_text(int32_t id) const;  // the stored text (e.g. "Ġhello", "▁the")
    float token_score(int32_t id) const;
    int32_t find_token(std::string_view text) const;  // id of a token text, -1 if none
    bool is_control(int32_t id) const;                // control or unknown: not rendered as text
    // End of generation: EOS, EOT, EOM, and control tokens whose text ends a turn in the common
    // chat formats ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", ...) or end a
    // fill-in-the-middle completion ("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>").
    bool is_eog(int32_t id) const;
    const std::vector<int32_t>& eog_ids() const;  // sorted

    // Throws unless the vocabulary has exactly n_vocab_model entries (the model's embedding rows).
    void check_compatible(int64_t n_vocab_model) const;
    // Throws unless this vocabulary can replace `embedded` (the file's own) for a model with
    // n_vocab_model embedding rows: same size and the same BOS/EOS/UNK ids.
    void check_replaces(const Vocab& embedded, int64_t n_vocab_model) const;

private:
    std::shared_ptr<const VocabState> state_;
};

// Token-by-token output: returns the bytes that are complete so far, holding back a trailing
// incomplete UTF-8 sequence until the next token completes it.
class TokenStreamDecoder {
public:
    explicit TokenStreamDecoder(const Vocab& vocab, bool render_special = false)
        : vocab_(vocab), render_special_(render_special) {}
    std::string push(int32_t id);
    std::string flush();  // whatever is held back (possibly malformed), then reset

private:
    Vocab vocab_;
    bool render_special_;
    std::string pending_;
};

}  // namespace bonsai
