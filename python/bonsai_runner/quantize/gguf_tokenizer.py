"""Tokenizer files rebuilt from a GGUF file's `tokenizer.*` metadata (quantizing a GGUF input).

The quantizer tokenizes its calibration text with the model's own tokenizer, and the PTQ1_0
directory it writes must carry that tokenizer so `bonsai convert` puts the same `tokenizer.*`
metadata back into the output GGUF. From a GGUF input both come from its metadata:

- byte-level BPE (`tokenizer.ggml.model` = "gpt2"): tokenizer.json + tokenizer_config.json, as
  export_hf writes them (tokens, merges, the split regex of `tokenizer.ggml.pre`, special tokens,
  chat template);
- SentencePiece (`tokenizer.ggml.model` = "llama"): a tokenizer.model written here as the
  SentencePiece ModelProto (protobuf wire format, encoded by hand: the `protobuf` package is not a
  dependency) plus tokenizer_config.json. Fields written (field numbers of sentencepiece_model.proto):
      ModelProto      1 pieces (repeated SentencePiece), 2 trainer_spec, 3 normalizer_spec
      SentencePiece   1 piece (string), 2 score (float), 3 type (enum, the same numbers as
                      tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined,
                      5 unused, 6 byte)
      TrainerSpec     3 model_type (2 = BPE: llama.cpp's SPM tokenizer merges by score, as
                      SentencePiece BPE does), 4 vocab_size, 35 byte_fallback, 40 unk_id,
                      41 bos_id, 42 eos_id, 43 pad_id
      NormalizerSpec  1 name ("identity": no NFKC table, as llama.cpp applies none),
                      3 add_dummy_prefix (tokenizer.ggml.add_space_prefix, default true),
                      4 remove_extra_whitespaces (false), 5 escape_whitespaces (true)
  Pieces, scores and types round-trip exactly through convert/tokenizer_meta.py.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ..errors import BonsaiError

TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 2, 3, 6
SPM_MODEL_BPE = 2


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1                       # negative int32/int64: two's complement, 10 bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, v: int) -> bytes:
    return _key(field, 0) + _varint(int(v))


def _bytes(field: int, b: bytes) -> bytes:
    return _key(field, 2) + _varint(len(b)) + b


def _float(field: int, v: float) -> bytes:
    return _key(field, 5) + struct.pack("<f", float(v))


def spm_model_proto(md: dict) -> bytes:
    """The SentencePiece ModelProto bytes for a "llama" (SPM) tokenizer's GGUF metadata."""
    tokens = md.get("tokenizer.ggml.tokens")
    if not tokens:
        raise BonsaiError("the GGUF file has no tokenizer.ggml.tokens; it cannot be quantized "
                          "(the calibration text is tokenized with the model's own tokenizer)")
    scores = md.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(scores) != len(tokens) or len(types) != len(tokens):
        raise BonsaiError("tokenizer.ggml.scores / token_type do not have one entry per token; "
                          "the file's tokenizer metadata is corrupt")

    def special(name: str, fallback: int) -> int:
        v = md.get(f"tokenizer.ggml.{name}_token_id")
        return int(v) if isinstance(v, int) and 0 <= v < len(tokens) else fallback

    unk = special("unknown", next((i for i, t in enumerate(types) if t == TOKEN_UNKNOWN), -1))
    if unk < 0:
        raise BonsaiError("the GGUF SentencePiece vocabulary has no unknown token "
                          "(tokenizer.ggml.unknown_token_id); SentencePiece needs one")
    pieces = b"".join(
        _bytes(1, _bytes(1, str(t).encode("utf-8")) + _float(2, s) + _int(3, ty))
        for t, s, ty in zip(tokens, scores, types))
    trainer = (_int(3, SPM_MODEL_BPE) + _int(4, len(tokens))
               + _int(35, any(t == TOKEN_BYTE for t in types))
               + _int(40, unk) + _int(41, special("bos", -1)) + _int(42, special("eos", -1))
               + _int(43, special("padding", -1)))
    normalizer = (_bytes(1, b"identity")
                  + _int(3, bool(md.get("tokenizer.ggml.add_space_prefix", True)))
                  + _int(4, 0) + _int(5, 1))
    return pieces + _bytes(2, trainer) + _bytes(3, normalizer)


def _spm_tokenizer_config(md: dict) -> dict:
    tokens = md["tokenizer.ggml.tokens"]

    def tok(key):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    cfg = {"add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", True)),
           "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
           "bos_token": tok("bos"), "eos_token": tok("eos"), "unk_token": tok("unknown"),
           "pad_token": tok("padding"), "tokenizer_class": "LlamaTokenizer"}
    if isinstance(md.get("tokenizer.chat_template"), str):
        cfg["chat_template"] = md["tokenizer.chat_template"]
    return cfg


def write_tokenizer_files(md: dict, out_dir: str | Path) -> list[str]:
    """Writes the tokenizer files for metadata `md` into `out_dir`; returns their names."""
    out = Path(out_dir)
    kind = md.get("tokenizer.ggml.model")
    if kind == "gpt2":
        from ..export_hf import _tokenizer_files

        tj, cfg = _tokenizer_files(md)
        (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
        names = ["tokenizer.json", "tokenizer_config.json"]
    elif kind == "llama":
        (out / "tokenizer.model").write_bytes(spm_model_proto(md))
        cfg = _spm_tokenizer_config(md)
        names = ["tokenizer.model", "tokenizer_config.json"]
    else:
        raise BonsaiError(f"tokenizer.ggml.model {kind!r}: quantizing a GGUF input needs a "
                          "SentencePiece (\"llama\") or byte-level BPE (\"gpt2\") tokenizer in its "
                          "metadata")
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False),
                                               encoding="utf-8")
    return names
