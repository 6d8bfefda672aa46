"""The C++ tokenizers (_core.Vocab) against independent oracles.

- SentencePiece: a BPE model with byte fallback is trained here by `sentencepiece`; its pieces,
  scores and types go into GGUF-style metadata (the mapping llama.cpp's converter uses) and our ids
  must equal `sentencepiece`'s on a mixed corpus. The same model read from its tokenizer.model file
  by our protobuf reader must give the same ids.
- byte-level BPE: one `tokenizers` vocabulary per pre-tokenizer (default, gpt-2, llama-bpe, qwen2),
  trained here with special and added tokens; our ids must equal `tokenizers`' ids and, with
  vocab-only GGUF files written here, llama-cpp-python's.
- The real Qwen2.5 vocabulary (real_model): `tokenizers` rebuilt from the GGUF's tokens and merges,
  and llama-cpp-python's own tokenizer on the same file.
- Bad input: every validation error is a BonsaiError that names the key.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from bonsai_runner import _core
from bonsai_runner.errors import BonsaiError

CORPUS = [
    "Hello world! It's a test, isn't it? I'LL BE THERE, we'd've done it.",
    "中文测试，你好世界。今天天气很好，我们去公园散步吧。",
    "日本語のテキストと한국어 텍스트도 섞어 봅니다.",
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n    return fib(n - 1) + fib(n - 2)  # recursion\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }\r\n",
    "emoji 😀🎉👍🏽 and a family 👨‍👩‍👧 ✨",
    "   leading spaces, trailing spaces   ",
    "\t\ttabs\tand\n\nnewlines \n \n  \n",
    "café naïve résumé Ångström façade Übergrößenträger",
    "numbers 1234567890 3.14159 -42 1e10 ١٢٣ ½",
    "a'b 's 'S 'Re x'll O'Neil's",
    "    x",
    " ",
    "",
    "mixed\u00a0nbsp\u3000ideographic space\u2028line separator",
    "Привет, мир! Ελληνικά γράμματα.",
]

TRAIN_PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog. It's a sunny day and we'll go outside.",
    "Machine learning models are trained on large datasets; they learn patterns from data.",
    "def hello(name):\n    print(f\"Hello, {name}!\")\n    return len(name)\n",
    "for i in range(100):\n\tif i % 3 == 0:\n\t\tcontinue\n\ttotal += i * 2\n",
    "中文是一种很美丽的语言。我们今天学习自然语言处理和机器学习。你好，世界！",
    "量化模型可以在消费级显卡上运行，内存占用更小，速度更快。",
    "Emoji are fun 😀😀 🎉🎉 👍 and so are symbols like © ® ™ → ← ✓.",
    "Numbers: 1, 22, 333, 4444, 55555, 3.14159, 2.71828, 1000000.",
    "Café, naïve, résumé, jalapeño, Zürich, São Paulo, Ærø.",
    "<html><body><div class=\"main\">Content &amp; more</div></body></html>",
]


def train_text() -> list[str]:
    lines = []
    for rep in range(12):
        for i, p in enumerate(TRAIN_PARAGRAPHS):
            lines.append(p if rep % 2 == 0 else p.replace(" ", "  ", 1 + (i + rep) % 3))
    return lines


FUZZ_ALPHABET = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + [
    " ", " ", " ", "\t", "\n", "\r", "'", "'s", "'LL", "\"", ".", ",", "!", "?", "(", ")", "{", "}", "#",
    "_", "-", "+", "=", "<", ">", "/", "\\", "中", "文", "测", "试", "你", "好", "😀", "🎉", "👍🏽",
    "\u200d", "é", "e\u0301", "ñ", "ß", "Ω", "٣", "½", "\u00a0", "\u3000", "\u2028", "\x0b", "𝄞",
    "<|im_start|>", "<s>", "the", " the", "  ", "def ", "1234"]


def fuzz_texts(n: int = 300, seed: int = 1234) -> list[str]:
    """Random strings over the characters where tokenizers usually disagree."""
    rng = random.Random(seed)
    return ["".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(0, 30))) for _ in range(n)]


# --------------------------------------------------------------------------------------------
# SentencePiece
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    spmlib = pytest.importorskip("sentencepiece")
    path = tmp_path_factory.mktemp("spm") / "tokenizer"
    spmlib.SentencePieceTrainer.train(
        sentence_iterator=iter(train_text()), model_prefix=str(path), model_type="bpe",
        vocab_size=500, byte_fallback=True, character_coverage=0.995,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, minloglevel=2, num_threads=1)
    model_file = str(path) + ".model"
    return spmlib.SentencePieceProcessor(model_file=model_file), model_file


def spm_metadata(sp) -> dict:
    # llama.cpp's converter: sentencepiece piece types map one to one onto GGUF token types.
    types = []
    for i in range(sp.get_piece_size()):
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(1)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(sp.get_piece_size())],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(sp.get_piece_size())],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }


def test_spm_matches_sentencepiece(spm):
    sp, _ = spm
    v = _core.Vocab(spm_metadata(sp))
    assert v.n_vocab == sp.get_piece_size() and v.model == "llama"
    assert v.bos == sp.bos_id() and v.eos == sp.eos_id() and v.add_bos and not v.add_eos
    used_bytes = False
    for text in CORPUS:
        expect = sp.encode(text)
        assert v.tokenize(text, add_special=False) == expect, text
        assert v.tokenize(text) == [sp.bos_id()] + expect
        assert v.tokenize(text.encode()) == [sp.bos_id()] + expect
        assert v.detokenize(v.tokenize(text)) == text.encode(), text
        assert v.detokenize(expect) == sp.decode(expect).encode()
        used_bytes |= any(v.token_type(i) == 6 for i in expect)
    assert used_bytes, "the corpus should exercise byte fallback"
    assert v.token_to_piece(sp.piece_to_id("<0x41>")) == b"A"
    assert v.token_to_piece(sp.bos_id()) == b"" and v.token_to_piece(sp.bos_id(), True) == b"<s>"
    # parse_special: control texts become their ids; the text after one gets the space prefix
    ids = v.tokenize("<s>hi</s>", add_special=False, parse_special=True)
    assert ids == [sp.bos_id()] + sp.encode("hi") + [sp.eos_id()]
    assert v.detokenize(ids, render_special=True) == b"<s>hi</s>"
    assert v.tokenize("<s>", add_special=False) == sp.encode("<s>")


def test_spm_model_file(spm):
    sp, model_file = spm
    embedded = _core.Vocab(spm_metadata(sp))
    v = _core.Vocab.from_spm_model_file(model_file)
    assert v.n_vocab == embedded.n_vocab and v.bos == embedded.bos and v.eos == embedded.eos
    assert v.add_bos and v.add_space_prefix
    for i in range(v.n_vocab):
        assert v.token_text(i) == embedded.token_text(i) and v.token_type(i) == embedded.token_type(i)
        assert v.token_score(i) == pytest.approx(embedded.token_score(i))
    for text in CORPUS:
        assert v.tokenize(text, add_special=False) == sp.encode(text)
    v.check_replaces(embedded, embedded.n_vocab)
    with pytest.raises(BonsaiError, match="embedding has"):
        v.check_replaces(embedded, embedded.n_vocab + 8)
    other = spm_metadata(sp)
    other["tokenizer.ggml.bos_token_id"] = 5
    with pytest.raises(BonsaiError, match="BOS id"):
        v.check_replaces(_core.Vocab(other), embedded.n_vocab)


def test_spm_random_text_matches_sentencepiece(spm):
    sp, _ = spm
    v = _core.Vocab(spm_metadata(sp))
    for text in fuzz_texts():
        assert v.tokenize(text, add_special=False) == sp.encode(text), repr(text)
        assert v.detokenize(v.tokenize(text)) == text.encode(), repr(text)


def write_vocab_gguf(md: dict, path) -> None:
    """A vocab-only llama GGUF (hyperparameters, no tensors) for llama.cpp's tokenizer."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in md:
        w.add_tokenizer_pre(md["tokenizer.ggml.pre"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.scores" in md:
        w.add_token_scores(md["tokenizer.ggml.scores"])
    w.add_token_types(md["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in md:
        w.add_token_merges(md["tokenizer.ggml.merges"])
    w.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    if "tokenizer.ggml.unknown_token_id" in md:
        w.add_unk_token_id(md["tokenizer.ggml.unknown_token_id"])
    w.add_add_bos_token(md["tokenizer.ggml.add_bos_token"])
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.slow
def test_spm_matches_llama_cpp(spm, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    sp, _ = spm
    path = tmp_path / "spm-vocab.gguf"
    write_vocab_gguf(spm_metadata(sp), path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    v = _core.Vocab.from_gguf(str(path))
    for text in CORPUS + ["hi</s> x<s>", "<unk> <s>"] + fuzz_texts(100, seed=7):
        for special in (False, True):
            expect = llm.tokenize(text.encode(), add_bos=True, special=special)
            assert v.tokenize(text, add_special=True, parse_special=special) == expect, (text, special)
        ids = v.tokenize(text)
        assert v.detokenize(ids) == llm.detokenize(ids), repr(text)


def test_stream_decoder_holds_back_partial_utf8(spm):
    sp, _ = spm
    v = _core.Vocab(spm_metadata(sp))
    text = "clef 𝄞 and ꙮ, emoji 😀 中文 ok"  # 𝄞 and ꙮ are not in the training text: byte tokens
    ids = v.tokenize(text, add_special=False)
    dec = _core.TokenStreamDecoder(v)
    chunks = [dec.push(i) for i in ids] + [dec.flush()]
    for c in chunks:
        c.decode("utf-8")  # every chunk is complete UTF-8
    assert b"".join(chunks) == b" " + text.encode()
    assert any(c == b"" for c in chunks[:-1]), "a multi-byte character should span byte tokens"


# --------------------------------------------------------------------------------------------
# byte-level BPE
# --------------------------------------------------------------------------------------------

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# tokenizer.ggml.pre -> the regular expressions of its pre-tokenizer, applied in sequence
PRE_PATTERNS = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2_PATTERN, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gpt-2": [GPT2_PATTERN],
    "llama-bpe": [r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""],
    "qwen2": [r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""],
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def hf_byte_level(pre: str, bpe_model):
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(bpe_model)
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Split(tk.Regex(p), behavior="isolated") for p in PRE_PATTERNS[pre]]
        + [tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    return tok


def bpe_metadata(tok, pre: str) -> dict:
    model = json.loads(tok.to_str())["model"]
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    assert None not in tokens
    added = {t.content: t.special for t in tok.get_added_tokens_decoder().values()}
    types = [(3 if added[t] else 4) if t in added else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": vocab["<|endoftext|>"],
        "tokenizer.ggml.bos_token_id": vocab["<|endoftext|>"],
        "tokenizer.ggml.add_bos_token": False,
    }


@pytest.fixture(scope="module", params=sorted(PRE_PATTERNS))
def bpe(request):
    tk = pytest.importorskip("tokenizers")
    pre = request.param
    tok = hf_byte_level(pre, tk.models.BPE(ignore_merges=(pre == "llama-bpe")))
    trainer = tk.trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_text(), trainer=trainer)
    tok.add_tokens(["<tool>"])
    return pre, tok, _core.Vocab(bpe_metadata(tok, pre))


def test_bpe_matches_tokenizers(bpe):
    pre, tok, v = bpe
    assert v.model == "gpt2" and v.pre == pre and v.n_vocab == tok.get_vocab_size()
    extra = ["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
             "a<tool>b <tool> c<|endoftext|>", "x" * 300, "1" * 50 + " " + "中" * 40]
    for text in CORPUS + extra:
        expect = tok.encode(text, add_special_tokens=False).ids
        got = v.tokenize(text, add_special=True, parse_special=True)
        assert got == expect, (pre, text)
        assert v.detokenize(got, render_special=True) == text.encode()
        assert v.detokenize(v.tokenize(text)) == text.encode()
    assert v.tokenize("<|im_start|>", parse_special=True) == [tok.token_to_id("<|im_start|>")]
    assert len(v.tokenize("<|im_start|>", parse_special=False)) > 1
    # user-defined (added, not special) tokens are matched either way, as in tokenizers
    assert tok.token_to_id("<tool>") in v.tokenize("a<tool>b", parse_special=False)
    assert v.token_type(tok.token_to_id("<|im_end|>")) == 3
    assert v.token_to_piece(tok.token_to_id("<|im_end|>")) == b""
    assert v.token_to_piece(tok.token_to_id("<|im_end|>"), render_special=True) == b"<|im_end|>"


def test_bpe_random_text_matches_tokenizers(bpe):
    pre, tok, v = bpe
    for text in fuzz_texts():
        assert v.tokenize(text, parse_special=True) == tok.encode(text, add_special_tokens=False).ids, \
            (pre, text)
        assert v.detokenize(v.tokenize(text)) == text.encode()


@pytest.mark.slow
def test_bpe_matches_llama_cpp(bpe, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    pre, tok, v = bpe
    path = tmp_path / f"bpe-{pre}.gguf"
    write_vocab_gguf(bpe_metadata(tok, pre), path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    v = _core.Vocab.from_gguf(str(path))
    for text in CORPUS + ["<|im_start|>user\nhi<|im_end|>", "a<tool>b"] + fuzz_texts(100, seed=9):
        for special in (False, True):
            expect = llm.tokenize(text.encode(), add_bos=False, special=special)
            assert v.tokenize(text, add_special=False, parse_special=special) == expect, (pre, text, special)


def test_bpe_bytes_input_and_invalid_utf8(bpe):
    _, _, v = bpe
    raw = b"ok \xff\xfe broken \xe4\xb8 utf8"
    assert v.detokenize(v.tokenize(raw)) == raw


# --------------------------------------------------------------------------------------------
# the real Qwen2.5 vocabulary
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen():
    path = os.environ.get("BONSAI_REAL_MODEL_GGUF")
    if not path or not os.path.exists(path):
        pytest.skip("set BONSAI_REAL_MODEL_GGUF to the Qwen2.5-Coder-0.5B-Instruct GGUF")
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(path)
    md = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.")}
    return path, md


@pytest.mark.real_model
def test_qwen_matches_tokenizers(qwen):
    tk = pytest.importorskip("tokenizers")
    _, md = qwen
    v = _core.Vocab(md)
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    assert v.n_vocab == len(tokens) == 151936 and v.pre == "qwen2"
    vocab = {t: i for i, t in enumerate(tokens)}  # added tokens then keep these ids
    merges = [tuple(m.split(" ")) for m in md["tokenizer.ggml.merges"]]
    tok = hf_byte_level("qwen2", tk.models.BPE(vocab=vocab, merges=merges))
    tok.add_special_tokens([tk.AddedToken(t, special=True) for i, t in enumerate(tokens) if types[i] == 3])
    tok.add_tokens([tk.AddedToken(t, special=False) for i, t in enumerate(tokens) if types[i] == 4])
    assert tok.token_to_id("<|im_start|>") == tokens.index("<|im_start|>")
    chat = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n写一个快速排序<|im_end|>\n"
    for text in CORPUS + [chat, "<tool_call>{\"name\": \"f\"}</tool_call>"]:
        got = v.tokenize(text, add_special=True, parse_special=True)
        assert got == tok.encode(text, add_special_tokens=False).ids, text
        assert v.detokenize(got, render_special=True) == text.encode()


@pytest.mark.real_model
def test_qwen_matches_llama_cpp(qwen):
    llama_cpp = pytest.importorskip("llama_cpp")
    path, md = qwen
    v = _core.Vocab.from_gguf(path)
    from_dict = _core.Vocab(md)
    assert (v.n_vocab, v.bos, v.eos, v.pad, v.eog_ids) == \
        (from_dict.n_vocab, from_dict.bos, from_dict.eos, from_dict.pad, from_dict.eog_ids)
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    chat = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    for text in CORPUS + [chat, "<tool_call>x</tool_call> <|fim_prefix|>"]:
        for special in (False, True):
            expect = llm.tokenize(text.encode(), add_bos=True, special=special)
            assert v.tokenize(text, add_special=True, parse_special=special) == expect, (text, special)
    lib_vocab = llama_cpp.llama_model_get_vocab(llm.model)
    for i in range(v.n_vocab):
        if v.token_type(i) != 1:
            assert v.is_eog(i) == bool(llama_cpp.llama_vocab_is_eog(lib_vocab, i)), i
    assert {151643, 151645} <= set(v.eog_ids)
    for ids in ([151644, 872, 198, 6023], list(range(0, 151936, 997))):
        assert v.detokenize(ids, render_special=True) == llm.detokenize(ids, special=True)
        assert v.detokenize(ids) == llm.detokenize(ids)
    long_text = "\n".join(CORPUS) * 200
    t0 = time.perf_counter()
    ids = v.tokenize(long_text, add_special=False)
    dt = time.perf_counter() - t0
    assert ids == llm.tokenize(long_text.encode(), add_bos=False, special=False)
    assert v.detokenize(ids) == long_text.encode()
    print(f"qwen2 tokenizer: {len(ids)} tokens in {dt * 1e3:.1f} ms ({len(ids) / dt / 1e6:.2f} M tokens/s)")


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------

def tiny_bpe() -> dict:
    letters = ["a", "b", "c", "ab", "abc", "Ġ", "Ġa"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": letters,
        "tokenizer.ggml.token_type": [1] * len(letters),
        "tokenizer.ggml.merges": ["a b", "ab c", "Ġ a"],
    }


def tiny_spm() -> dict:
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁", "a", "▁a"],
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -0.5],
        "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def test_tiny_vocabularies_work():
    b = _core.Vocab(tiny_bpe())
    assert b.tokenize("abc a") == [4, 6] and not b.add_bos
    assert b.eog_ids == [] and not b.is_eog(0)
    s = _core.Vocab(tiny_spm())
    assert s.tokenize("a a") == [1, 5, 5] and s.detokenize([1, 5, 5]) == b"a a"
    assert s.eog_ids == [2] and s.is_eog(2)
    # stray bytes in token texts and input, as a reader that decodes with "surrogateescape" gives them
    md = _with(tiny_bpe(), tokens=tiny_bpe()["tokenizer.ggml.tokens"] + ["x\udcff"],
               token_type=[1] * 7 + [4])
    odd = _core.Vocab(md)
    assert odd.token_text(7) == b"x\xff"
    assert odd.tokenize(b"ax\xffb") == odd.tokenize("ax\udcffb") == [0, 7, 1]
    assert s.tokenize("b", add_special=False) == [3, 0]  # "▁" then unk: no byte tokens


def _with(base: dict, **changes) -> dict:
    md = dict(base)
    for k, val in changes.items():
        key = "tokenizer.ggml." + k
        if val is None:
            md.pop(key, None)
        else:
            md[key] = val
    return md


@pytest.mark.parametrize("md, message", [
    (_with(tiny_bpe(), model=None), "tokenizer.ggml.model is missing"),
    (_with(tiny_bpe(), tokens=None), "tokenizer.ggml.tokens is missing"),
    (_with(tiny_bpe(), model="wordpiece"), "not a supported tokenizer"),
    (_with(tiny_bpe(), pre="falcon"), r"supported: .*default.*gpt-2.*llama-bpe.*qwen2"),
    (_with(tiny_bpe(), merges=None), "tokenizer.ggml.merges is missing"),
    (_with(tiny_bpe(), merges=["a b", "abc"]), r"merges\[1\] = \"abc\" is malformed"),
    (_with(tiny_bpe(), merges=["a z"]), "\"z\", which is not in tokenizer.ggml.tokens"),
    (_with(tiny_bpe(), token_type=[1, 1]), "token_type has 2 entries"),
    (_with(tiny_bpe(), token_type=[1, 1, 1, 1, 1, 1, 42]), r"token_type\[6\] = 42"),
    (_with(tiny_bpe(), eos_token_id=7), "eos_token_id = 7 is out of range"),
    (_with(tiny_bpe(), bos_token_id=-5), "bos_token_id = -5 is not a valid token id"),
    (_with(tiny_bpe(), add_bos_token=True), "bos_token_id is missing"),
    (_with(tiny_bpe(), tokens="abc"), "must be an array"),
    (_with(tiny_bpe(), tokens=[1, 2]), "must hold strings"),
    (_with(tiny_bpe(), tokens=[]), "tokenizer.ggml.tokens is empty"),
    (_with(tiny_spm(), scores=None), "tokenizer.ggml.scores is missing"),
    (_with(tiny_spm(), scores=[0.0]), "scores has 1 entries but tokenizer.ggml.tokens has 6"),
    (_with(tiny_spm(), bos_token_id="1"), "must be an integer"),
])
def test_bad_metadata(md, message):
    with pytest.raises(BonsaiError, match=message):
        _core.Vocab(md)


def test_bad_ids_and_files(tmp_path):
    v = _core.Vocab(tiny_spm())
    with pytest.raises(BonsaiError, match="token id 6 is out of range"):
        v.token_to_piece(6)
    with pytest.raises(BonsaiError, match="out of range"):
        v.detokenize([1, -3])
    with pytest.raises(BonsaiError, match="out of range"):
        v.token_type(99)
    with pytest.raises(BonsaiError, match="tokenizer has 6 tokens but the model's token embedding has 8"):
        v.check_compatible(8)
    v.check_compatible(6)
    with pytest.raises(BonsaiError, match="cannot open"):
        _core.Vocab.from_spm_model_file(str(tmp_path / "missing.model"))
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"\x0a\xff\xff\xff\x0fshort")
    with pytest.raises(BonsaiError, match="not a valid SentencePiece model"):
        _core.Vocab.from_spm_model_file(str(junk))
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    with pytest.raises(BonsaiError, match="holds no pieces"):
        _core.Vocab.from_spm_model_file(str(empty))
    with pytest.raises(BonsaiError, match="str or bytes"):
        v.tokenize(123)


def test_bad_gguf_tokenizer_keys(tmp_path):
    gguf = pytest.importorskip("gguf")

    def write(path, tokens_as_ints: bool) -> str:
        w = gguf.GGUFWriter(str(path), "llama")
        if tokens_as_ints:
            w.add_tokenizer_model("llama")
            w.add_array("tokenizer.ggml.tokens", [1, 2, 3])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return str(path)

    with pytest.raises(BonsaiError, match="tokenizer.ggml.model is missing"):
        _core.Vocab.from_gguf(write(tmp_path / "none.gguf", False))
    with pytest.raises(BonsaiError, match="tokenizer.ggml.tokens.*expected ARRAY.STRING"):
        _core.Vocab.from_gguf(tmp_path / write(tmp_path / "ints.gguf", True))


def test_vocab_from_gguf_file_metadata(spm, tmp_path):
    sp, _ = spm
    path = tmp_path / "spm.gguf"
    write_vocab_gguf(spm_metadata(sp), path)
    with _core.GgufFile(str(path)) as f:
        v = _core.Vocab(f.metadata)
    assert v.tokenize(CORPUS[0], add_special=False) == sp.encode(CORPUS[0])
    assert _core.Vocab.from_gguf(str(path)).tokenize(CORPUS[1]) == v.tokenize(CORPUS[1])
