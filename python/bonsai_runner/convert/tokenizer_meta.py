"""Tokenizer metadata for GGUF (llama.cpp key names) from a Hugging Face model directory.

Two tokenizer kinds, chosen as llama.cpp's converter does (tokenizer.model first):
- SentencePiece (`tokenizer.model`, read with the `sentencepiece` package): tokenizer.ggml.model
  "llama", pre "default", tokens = pieces in id order, scores, token_type (1 normal, 2 unknown,
  3 control, 4 user-defined, 5 unused, 6 byte). Added tokens from tokenizer_config.json's
  added_tokens_decoder override their ids (special -> control, else user-defined, score -1000).
- Byte-level BPE (`tokenizer.json` with model.type "BPE"): model "gpt2", tokens in id order with
  the added tokens included, merges as "left right" strings (tokenizer.json stores either strings
  or [left, right] pairs; spaces inside a pair part become U+0120 as in llama.cpp), token_type
  (added special -> 3 control, added non-special -> 4 user-defined, else 1 normal), and
  tokenizer.ggml.pre detected from the pre-tokenizer's split regex (PRE_TOKENIZER_REGEXES).

The token list must have exactly as many entries as the embedding has rows. When config.json's
vocab_size equals the embedding rows and exceeds the tokenizer (Qwen2.5 pads 151665 tokens to
151936), the gap is filled with "[PAD<id>]" tokens of type unused, as llama.cpp does; any other
mismatch is an error. Special token ids come from tokenizer_config.json (token strings looked up in
the vocabulary), then config.json's *_token_id, then (SentencePiece) the model's own ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BonsaiError
from .arch.base import BOOL, F32, I32, STR, U32, MetaKV
from .hf_reader import read_json

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = \
    1, 2, 3, 4, 5, 6
PAD_SCORE = -10000.0
ADDED_SCORE = -1000.0

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5: Qwen2's regex with combining marks (\p{M}) kept inside words; llama.cpp's "qwen35".
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Split regex of tokenizer.json -> tokenizer.ggml.pre (llama.cpp's names, which the engine's vocab
# implements; "default" is llama.cpp's fallback splitter, not the GPT-2 regex, so GPT-2 is "gpt-2").
PRE_TOKENIZER_REGEXES = {QWEN2_REGEX: "qwen2", QWEN35_REGEX: "qwen35", LLAMA3_REGEX: "llama-bpe",
                         GPT2_REGEX: "gpt-2"}
SPECIAL_TYPES = ("bos", "eos", "unk", "pad")
_GGUF_SPECIAL_KEY = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                     "pad": "padding_token_id"}


@dataclass
class TokenizerMeta:
    model: str                               # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    pre: str                                 # tokenizer.ggml.pre
    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None = None        # SentencePiece only
    merges: list[str] | None = None          # BPE only
    special_ids: dict[str, int] = field(default_factory=dict)
    add_bos: bool | None = None
    add_eos: bool | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None
    extra_templates: dict[str, str] = field(default_factory=dict)
    n_padded: int = 0                        # [PAD] tokens appended to reach the embedding rows

    def metadata(self) -> list[MetaKV]:
        kv = [MetaKV("tokenizer.ggml.model", self.model, STR),
              MetaKV("tokenizer.ggml.pre", self.pre, STR),
              MetaKV("tokenizer.ggml.tokens", self.tokens, STR)]
        if self.scores is not None:
            kv.append(MetaKV("tokenizer.ggml.scores", self.scores, F32))
        kv.append(MetaKV("tokenizer.ggml.token_type", self.token_types, I32))
        if self.merges is not None:
            kv.append(MetaKV("tokenizer.ggml.merges", self.merges, STR))
        for typ in SPECIAL_TYPES:
            if typ in self.special_ids:
                kv.append(MetaKV(f"tokenizer.ggml.{_GGUF_SPECIAL_KEY[typ]}", self.special_ids[typ],
                                 U32))
        if self.add_bos is not None:
            kv.append(MetaKV("tokenizer.ggml.add_bos_token", self.add_bos, BOOL))
        if self.add_eos is not None:
            kv.append(MetaKV("tokenizer.ggml.add_eos_token", self.add_eos, BOOL))
        if self.add_space_prefix is not None:
            kv.append(MetaKV("tokenizer.ggml.add_space_prefix", self.add_space_prefix, BOOL))
        if self.chat_template is not None:
            kv.append(MetaKV("tokenizer.chat_template", self.chat_template, STR))
        for name, tmpl in self.extra_templates.items():
            kv.append(MetaKV(f"tokenizer.chat_template.{name}", tmpl, STR))
        return kv


def read_tokenizer(model_dir: str | Path, config: dict, n_rows: int,
                   pre_tokenizer: str | None = None) -> TokenizerMeta:
    """Builds the GGUF tokenizer metadata for a model whose token embedding has `n_rows` rows."""
    d = Path(model_dir)
    tok_cfg = _optional_object(d / "tokenizer_config.json")
    if (d / "tokenizer.model").is_file():
        meta, vocab = _read_sentencepiece(d, tok_cfg)
    elif (d / "tokenizer.json").is_file():
        meta, vocab = _read_bpe(d, tok_cfg, pre_tokenizer)
    else:
        raise BonsaiError(f"{d}: no tokenizer (expected tokenizer.model for SentencePiece or "
                          "tokenizer.json for byte-level BPE)")
    _fit_vocab(meta, d, config, n_rows)
    _read_specials(meta, vocab, tok_cfg, config, d)
    _read_chat_template(meta, tok_cfg, d)
    return meta


def _optional_object(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = read_json(path)
    if not isinstance(data, dict):
        raise BonsaiError(f"{path}: expected a JSON object")
    return data


# ----- SentencePiece -----

def _read_sentencepiece(d: Path, tok_cfg: dict) -> tuple[TokenizerMeta, dict[str, int]]:
    import sentencepiece

    path = d / "tokenizer.model"
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(path.read_bytes())
    except (RuntimeError, OSError) as e:
        raise BonsaiError(f"{path}: not a readable SentencePiece model ({e}); re-download it") \
            from None
    n = sp.GetPieceSize()
    tokens, scores, types = [], [], []
    for i in range(n):
        tokens.append(sp.IdToPiece(i))
        scores.append(float(sp.GetScore(i)))
        if sp.IsUnknown(i):
            types.append(TOKEN_UNKNOWN)
        elif sp.IsControl(i):
            types.append(TOKEN_CONTROL)
        elif sp.IsUnused(i):
            types.append(TOKEN_UNUSED)
        elif sp.IsByte(i):
            types.append(TOKEN_BYTE)
        elif _is_user_defined(sp, i):
            types.append(TOKEN_USER_DEFINED)
        else:
            types.append(TOKEN_NORMAL)
    meta = TokenizerMeta("llama", "default", tokens, types, scores=scores)
    for text, tid in _optional_object(d / "added_tokens.json").items():
        _set_added(meta, tid, text, TOKEN_USER_DEFINED, d / "added_tokens.json")
    for sid, info in (tok_cfg.get("added_tokens_decoder") or {}).items():
        if not (isinstance(info, dict) and isinstance(info.get("content"), str)):
            continue
        special = bool(info.get("special"))
        text = info["content"] if special else info["content"].replace("\u2581", " ")
        _set_added(meta, int(sid) if str(sid).isdigit() else -1, text,
                   TOKEN_CONTROL if special else TOKEN_USER_DEFINED, d / "tokenizer_config.json")
    if isinstance(tok_cfg.get("add_prefix_space"), bool):
        meta.add_space_prefix = tok_cfg["add_prefix_space"]
    meta.add_bos, meta.add_eos = True, False
    for typ, tid in (("bos", sp.bos_id()), ("eos", sp.eos_id()), ("unk", sp.unk_id()),
                     ("pad", sp.pad_id())):
        if tid >= 0:
            meta.special_ids[typ] = tid
    vocab = {t: i for i, t in enumerate(meta.tokens)}
    return meta, vocab


def _is_user_defined(sp, i: int) -> bool:
    f = getattr(sp, "IsUserDefined", None) or getattr(sp, "is_user_defined", None)
    return bool(f(i)) if f is not None else False


def _set_added(meta: TokenizerMeta, tid, text: str, ttype: int, where: Path) -> None:
    """An added token overrides (or extends) the SentencePiece vocabulary at its id."""
    if not isinstance(tid, int) or tid < 0:
        raise BonsaiError(f"{where}: added token {text!r} has an invalid id {tid!r}")
    _extend(meta, tid + 1)
    meta.tokens[tid], meta.scores[tid], meta.token_types[tid] = text, ADDED_SCORE, ttype


def _extend(meta: TokenizerMeta, n: int) -> None:
    while len(meta.tokens) < n:
        meta.tokens.append(f"[PAD{len(meta.tokens)}]")
        meta.token_types.append(TOKEN_UNUSED)
        if meta.scores is not None:
            meta.scores.append(PAD_SCORE)


# ----- byte-level BPE -----

def _read_bpe(d: Path, tok_cfg: dict, pre_tokenizer: str | None
              ) -> tuple[TokenizerMeta, dict[str, int]]:
    path = d / "tokenizer.json"
    tj = read_json(path)
    model = tj.get("model") if isinstance(tj, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise BonsaiError(f"{path}: tokenizer model {kind!r} is not supported; only byte-level "
                          "BPE (model.type \"BPE\") or a SentencePiece tokenizer.model")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise BonsaiError(f"{path}: model.vocab is not an object")
    by_id: dict[int, str] = {}
    for tok, tid in vocab.items():
        by_id[int(tid)] = tok
    types: dict[int, int] = {}
    for at in tj.get("added_tokens") or []:
        tid, content = at.get("id"), at.get("content")
        if not isinstance(tid, int) or not isinstance(content, str):
            raise BonsaiError(f"{path}: malformed added_tokens entry {at!r}")
        by_id[tid] = content
        types[tid] = TOKEN_CONTROL if at.get("special") else TOKEN_USER_DEFINED
    n = max(by_id) + 1 if by_id else 0
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    ttypes = [types.get(i, TOKEN_NORMAL if i in by_id else TOKEN_UNUSED) for i in range(n)]
    pre = pre_tokenizer or detect_pre_tokenizer(tj.get("pre_tokenizer"), path)
    meta = TokenizerMeta("gpt2", pre, tokens, ttypes, merges=_merges(model.get("merges"), path))
    meta.add_bos, meta.add_eos = _bpe_add_special(tj, tok_cfg)
    return meta, {t: i for i, t in enumerate(tokens) if i in by_id}


def _merges(merges, path: Path) -> list[str]:
    if merges is None:
        return []
    if not isinstance(merges, list):
        raise BonsaiError(f"{path}: model.merges is not a list")
    out = []
    for m in merges:
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m):
            out.append(" ".join(p.replace(" ", "\u0120") for p in m))
        else:
            raise BonsaiError(f"{path}: unknown merges entry {m!r} (expected \"a b\" or [a, b])")
    return out


def _split_regex(step: dict) -> str | None:
    pat = step.get("pattern")
    if isinstance(pat, dict):
        return pat.get("Regex") or pat.get("String")
    return None


def detect_pre_tokenizer(pre: dict | None, where: Path | str = "tokenizer.json") -> str:
    """tokenizer.ggml.pre for a tokenizer.json pre_tokenizer; unknown patterns are an error."""
    steps = []
    if isinstance(pre, dict):
        steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    steps = [s for s in steps or [] if isinstance(s, dict)]
    splits = [_split_regex(s) for s in steps if s.get("type") == "Split"]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if not byte_level:
        kinds = ", ".join(str(s.get("type")) for s in steps) or "none"
        raise BonsaiError(f"{where}: pre-tokenizer ({kinds}) is not byte-level; only byte-level "
                          "BPE tokenizers are supported")
    if not splits and byte_level[0].get("use_regex", True):
        return PRE_TOKENIZER_REGEXES[GPT2_REGEX]
    if len(splits) == 1 and splits[0] in PRE_TOKENIZER_REGEXES:
        return PRE_TOKENIZER_REGEXES[splits[0]]
    pattern = " + ".join(repr(s) for s in splits) or "(none)"
    raise BonsaiError(f"{where}: unknown pre-tokenizer split pattern {pattern}; known: "
                      f"{', '.join(sorted(set(PRE_TOKENIZER_REGEXES.values())))}. If the model uses "
                      "one of these, pass --pre-tokenizer NAME")


def _bpe_add_special(tj: dict, tok_cfg: dict) -> tuple[bool, bool]:
    add_bos = add_eos = False
    post = tj.get("post_processor") or {}
    procs = post.get("processors", [post]) if isinstance(post, dict) else []
    for p in procs:
        if isinstance(p, dict) and p.get("type") == "TemplateProcessing":
            single = p.get("single") or []
            add_bos = bool(single) and "SpecialToken" in single[0]
            add_eos = len(single) > 1 and "SpecialToken" in single[-1]
    if isinstance(tok_cfg.get("add_bos_token"), bool):
        add_bos = tok_cfg["add_bos_token"]
    if isinstance(tok_cfg.get("add_eos_token"), bool):
        add_eos = tok_cfg["add_eos_token"]
    return add_bos, add_eos


# ----- shared -----

def _fit_vocab(meta: TokenizerMeta, d: Path, config: dict, n_rows: int) -> None:
    n = len(meta.tokens)
    if n == n_rows:
        return
    cfg_vocab = config.get("vocab_size")
    if n < n_rows and cfg_vocab == n_rows:
        before = n
        _extend(meta, n_rows)
        meta.n_padded = n_rows - before
        return
    raise BonsaiError(f"{d}: the tokenizer has {n} tokens but the token embedding has {n_rows} rows "
                      f"(config.json vocab_size {cfg_vocab}); the tokenizer files belong to another "
                      "model, or the checkpoint is incomplete")


def _read_specials(meta: TokenizerMeta, vocab: dict[str, int], tok_cfg: dict, config: dict,
                   d: Path) -> None:
    found: dict[str, int] = {}
    for typ in SPECIAL_TYPES:
        entry = tok_cfg.get(f"{typ}_token")
        text = entry.get("content") if isinstance(entry, dict) else entry
        if isinstance(text, str) and text in vocab:
            found[typ] = vocab[text]
    for typ in SPECIAL_TYPES:
        tid = config.get(f"{typ}_token_id")
        if typ not in found and isinstance(tid, int) and not isinstance(tid, bool):
            found[typ] = tid
    for typ, tid in found.items():
        meta.special_ids[typ] = tid
    for typ, tid in meta.special_ids.items():
        if not 0 <= tid < len(meta.tokens):
            raise BonsaiError(f"{d}: {typ} token id {tid} is outside the vocabulary of "
                              f"{len(meta.tokens)} tokens; fix config.json/tokenizer_config.json")
    if isinstance(tok_cfg.get("add_bos_token"), bool):
        meta.add_bos = tok_cfg["add_bos_token"]
    if isinstance(tok_cfg.get("add_eos_token"), bool):
        meta.add_eos = tok_cfg["add_eos_token"]


def _read_chat_template(meta: TokenizerMeta, tok_cfg: dict, d: Path) -> None:
    tmpl = tok_cfg.get("chat_template")
    if tmpl is None and (d / "chat_template.jinja").is_file():
        tmpl = (d / "chat_template.jinja").read_text(encoding="utf-8")
    if tmpl is None and (d / "chat_template.json").is_file():
        tmpl = _optional_object(d / "chat_template.json").get("chat_template")
    if isinstance(tmpl, list):
        for item in tmpl:
            if not (isinstance(item, dict) and isinstance(item.get("template"), str)):
                continue
            if item.get("name") == "default":
                meta.chat_template = item["template"]
            else:
                meta.extra_templates[str(item.get("name"))] = item["template"]
    elif isinstance(tmpl, str):
        meta.chat_template = tmpl
    elif tmpl is not None:
        raise BonsaiError(f"{d / 'tokenizer_config.json'}: chat_template must be a string or a "
                          "list of {name, template}")
