"""Calibration text: reading, tokenizing with the model's own tokenizer, packing into sequences.

Input: JSONL (one JSON object per line with a string "text" field, and optionally a "domain"
label) or plain UTF-8 text, in which blank lines separate samples. Each sample is tokenized with the model's tokenizer (tokenizer.json
through `tokenizers`, else tokenizer.model through `sentencepiece`, with a BOS token when
tokenizer_config.json asks for one), samples are concatenated and cut into sequences of `seq_len`
tokens; at most `max_samples` sequences are used, chosen with `seed` when there are more.

The report states the number of samples, tokens and sequences and the domain mix. A sample's
domain is its "domain" label when the JSONL gives one, else a heuristic: "code" when many lines look like code (indentation, braces, keywords,
`;` endings), "cjk" when a third of its letters are CJK, else "prose". Warnings: fewer than 16
sequences or 8192 tokens ("too small"), or one domain holding more than 90% of the tokens ("too
narrow").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import BonsaiError

MIN_SEQUENCES = 16
MIN_TOKENS = 8192
NARROW_SHARE = 0.9
_CODE_LINE = re.compile(r"^(\s{2,}\S|\s*(def |class |import |from |return |for |if |while |#include|"
                        r"fn |let |const |var |function |public |private |}|{)|.*[;{}]\s*$)")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_LETTER = re.compile(r"\w")


def default_calibration_file() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "calibration.jsonl"


def read_samples(path: str | Path) -> list[tuple[str, str | None]]:
    """(text, domain label or None) samples of a JSONL or plain-text calibration file."""
    p = Path(path)
    if not p.is_file():
        raise BonsaiError(f"calibration file {p}: not found; pass --calib-file with a JSONL "
                          "({\"text\": ...} per line) or plain-text file")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BonsaiError(f"calibration file {p}: not UTF-8 text (invalid byte at offset "
                          f"{e.start}); convert it to UTF-8") from None
    if not text.strip():
        raise BonsaiError(f"calibration file {p}: empty; give it text to calibrate on")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if p.suffix.lower() in (".jsonl", ".json") or lines[0].lstrip().startswith("{"):
        return _jsonl_samples(p, lines)
    return [(s.strip("\n"), None) for s in re.split(r"\n\s*\n", text) if s.strip()]


def _jsonl_samples(p: Path, lines: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for i, ln in enumerate(lines, 1):
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError as e:
            raise BonsaiError(f"calibration file {p}: line {i} is not valid JSON ({e.msg}); each "
                              "line must be an object like {\"text\": \"...\"}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise BonsaiError(f"calibration file {p}: line {i} has no string \"text\" field")
        if obj["text"].strip():
            dom = obj.get("domain")
            out.append((obj["text"], dom if isinstance(dom, str) and dom else None))
    if not out:
        raise BonsaiError(f"calibration file {p}: no non-empty \"text\" values")
    return out


def classify(text: str) -> str:
    letters = len(_LETTER.findall(text)) or 1
    if len(_CJK.findall(text)) >= letters / 3:
        return "cjk"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and sum(bool(_CODE_LINE.match(ln)) for ln in lines) >= 0.4 * len(lines):
        return "code"
    return "prose"


class Tokenizer:
    """The model directory's tokenizer: tokenizer.json (tokenizers) or tokenizer.model (SentencePiece)."""

    def __init__(self, model_dir: str | Path):
        d = Path(model_dir)
        cfg = {}
        if (d / "tokenizer_config.json").is_file():
            try:
                cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise BonsaiError(f"{d / 'tokenizer_config.json'}: malformed JSON") from None
        if (d / "tokenizer.json").is_file():
            from tokenizers import Tokenizer as HfTokenizer

            try:
                self._tok = HfTokenizer.from_file(str(d / "tokenizer.json"))
            except Exception as e:
                raise BonsaiError(f"{d / 'tokenizer.json'}: cannot load ({e})") from None
            self._kind = "tokenizers"
        elif (d / "tokenizer.model").is_file():
            import sentencepiece as spm

            try:
                self._tok = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
            except Exception as e:
                raise BonsaiError(f"{d / 'tokenizer.model'}: cannot load ({e})") from None
            self._kind = "sentencepiece"
            self._bos = self._tok.bos_id() if cfg.get("add_bos_token", True) else -1
        else:
            raise BonsaiError(f"{d}: no tokenizer (tokenizer.json or tokenizer.model); the "
                              "quantizer tokenizes the calibration text with the model's own "
                              "tokenizer: copy its tokenizer files into the model directory")

    def encode(self, text: str) -> list[int]:
        if self._kind == "tokenizers":
            return self._tok.encode(text).ids
        ids = self._tok.encode(text)
        return ([self._bos] if self._bos >= 0 else []) + list(ids)


@dataclass
class CalibrationSet:
    tokens: np.ndarray                    # [n_seq, seq_len] int64
    n_samples: int
    n_tokens_total: int
    domains: dict[str, float]             # share of tokens per domain
    source: str
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"source": self.source, "samples": self.n_samples,
                "tokens_available": self.n_tokens_total, "sequences": int(self.tokens.shape[0]),
                "seq_len": int(self.tokens.shape[1]), "tokens_used": int(self.tokens.size),
                "domains": self.domains, "warnings": list(self.warnings)}


def load_calibration(path: str | Path, tokenizer: Tokenizer, seq_len: int, max_samples: int,
                     seed: int, n_vocab: int) -> CalibrationSet:
    if seq_len < 2:
        raise BonsaiError(f"--seq-len {seq_len}: must be at least 2")
    if max_samples < 1:
        raise BonsaiError(f"--max-samples {max_samples}: must be at least 1")
    samples = read_samples(path)
    stream: list[int] = []
    per_domain: dict[str, int] = {}
    for s, label in samples:
        ids = tokenizer.encode(s)
        stream.extend(ids)
        dom = label or classify(s)
        per_domain[dom] = per_domain.get(dom, 0) + len(ids)
    total = len(stream)
    if total < seq_len:
        raise BonsaiError(f"calibration file {path}: {total} tokens, fewer than one sequence of "
                          f"--seq-len {seq_len}; give more text or lower --seq-len")
    arr = np.asarray(stream, dtype=np.int64)
    if arr.max(initial=0) >= n_vocab:
        raise BonsaiError(f"the tokenizer produced id {int(arr.max())} but the model has only "
                          f"{n_vocab} embeddings: tokenizer and model do not match")
    n_seq = total // seq_len
    seqs = arr[: n_seq * seq_len].reshape(n_seq, seq_len)
    if n_seq > max_samples:
        pick = np.sort(np.random.default_rng(seed).choice(n_seq, size=max_samples, replace=False))
        seqs = seqs[pick]
    domains = {k: round(v / total, 4) for k, v in sorted(per_domain.items())}
    warnings = []
    if seqs.shape[0] < MIN_SEQUENCES or seqs.size < MIN_TOKENS:
        warnings.append(f"calibration set is small ({seqs.shape[0]} sequences, {seqs.size} "
                        f"tokens; at least {MIN_SEQUENCES} sequences and {MIN_TOKENS} tokens are "
                        "advised): scales and the fallback table may not generalize")
    top = max(domains.items(), key=lambda kv: kv[1])
    if top[1] > NARROW_SHARE:
        warnings.append(f"calibration set is narrow: {top[1]:.0%} of its tokens are {top[0]}; mix "
                        "in code, prose and other languages the model will see")
    return CalibrationSet(seqs, len(samples), total, domains, str(path), warnings)
