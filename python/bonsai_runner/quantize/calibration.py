"""Calibration text: the built-in set, reading, tokenizing with the model's own tokenizer, packing.

Input: JSONL (one JSON object per line with a string "text" field, and optionally a "domain"
label) or plain UTF-8 text, in which blank lines separate samples. Each sample is tokenized with
the model's tokenizer (tokenizer.json through `tokenizers`, else tokenizer.model through
`sentencepiece`, with a BOS token when tokenizer_config.json asks for one), samples are
concatenated and cut into sequences of `seq_len` tokens; at most `max_samples` sequences are used,
chosen with `seed` when there are more.

The built-in set (no --calib-file) must supply the default 128 sequences x 512 tokens, so it is
assembled at run time from three parts that need no download (`default_samples`):
  shipped  data/calibration.jsonl, written for this project: 53 labelled samples (~12,500
           characters: code, prose, math, Chinese/Japanese/Korean, chat, Spanish/French/German/
           Russian), all of them, once (not upweighted);
  pydoc    the Python language and library reference topics every CPython ships for `help()`
           (`pydoc_data.topics.topics`, ~465,000 characters of English technical prose with
           short code examples), cut into samples of ~3,000 characters at paragraph breaks,
           labelled "prose"; PROSE_CHARS of them are taken;
  stdlib   the source of a fixed list of standard-library modules (STDLIB_MODULES under
           `sysconfig.get_paths()["stdlib"]`), cut the same way, labelled "code"; CODE_CHARS of
           them are taken, so code stays near 40% of the tokens (~4.4 characters per token
           with Qwen2.5's tokenizer for both parts: ~97,000 tokens, ~190 sequences of 512).
The pools are built in a fixed order. The shipped samples lead the token stream, and the
sequences they fill are always among those used (with 12 x 256 they are all of them): on
Qwen2.5-Coder-0.5B with 12 x 256 (`bonsai demo`'s setting), sequences drawn at random from the
whole set gave a mean KLD of 4.55 on the evaluation text, the shipped sequences 2.85. `seed` chooses which chunks fill each
budget, the order of the pydoc/stdlib samples after the shipped ones and which of their sequences
are drawn, so the set is deterministic for a given seed. A part that
is missing (some distributions strip pydoc_data or the stdlib sources) is reported as a warning
and the set goes on with the others at their own budgets (nothing is upweighted). None of this
text overlaps data/eval.txt, the evaluation text (tests/test_quantize_calibration.py checks it).

The report states the number of samples, tokens and sequences, the domain mix and, for the
built-in set, each part's share of the tokens. A sample's domain is its "domain" label when the
JSONL gives one, else a heuristic: "code" when many lines look like code (indentation, braces,
keywords, `;` endings), "cjk" when a third of its letters are CJK, else "prose". Warnings: fewer
than 16 sequences or 8192 tokens ("too small"), or one domain holding more than 90% of the
tokens ("too narrow").
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


PROSE_CHARS = 240_000
CODE_CHARS = 170_000
CHUNK_CHARS = 3_000
BUILTIN_SOURCE = "built-in (data/calibration.jsonl + pydoc topics + stdlib source)"
STDLIB_MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "enum", "fractions",
    "functools", "gettext", "heapq", "inspect", "ipaddress", "json.decoder", "json.encoder",
    "logging", "operator", "optparse", "os", "pathlib", "pprint", "queue", "random", "shlex",
    "shutil", "statistics", "string", "tempfile", "textwrap", "threading", "tokenize", "typing",
    "uuid", "zipfile")


def default_calibration_file() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "calibration.jsonl"


def _pydoc_topics() -> dict[str, str] | None:
    """The pydoc reference topics, or None when this Python has no pydoc_data."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return None
    return topics if isinstance(topics, dict) and topics else None


def _stdlib_dir() -> Path | None:
    import sysconfig

    d = sysconfig.get_paths().get("stdlib")
    return Path(d) if d and Path(d).is_dir() else None


def _module_file(stdlib: Path, module: str) -> Path | None:
    base = stdlib.joinpath(*module.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def split_chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """Consecutive pieces of ~`size` characters cut at blank lines; a paragraph longer than
    `size` is cut at line ends. Pieces are stripped of blank lines at their ends; empty ones drop."""
    units = []
    for para in re.split(r"\n\s*\n", text):
        if len(para) <= size:
            units.append(para)
            continue
        cur, n = [], 0
        for ln in para.split("\n"):
            if cur and n + len(ln) > size:
                units.append("\n".join(cur))
                cur, n = [], 0
            cur.append(ln)
            n += len(ln) + 1
        units.append("\n".join(cur))
    out, cur, n = [], [], 0
    for u in units:
        if cur and n + len(u) > size:
            out.append("\n\n".join(cur))
            cur, n = [], 0
        cur.append(u)
        n += len(u) + 2
    if cur:
        out.append("\n\n".join(cur))
    return [c.strip("\n") for c in out if c.strip()]


def _take(pool: list[str], budget: int, rng) -> list[str]:
    """Chunks of `pool` in the order of a seeded permutation until `budget` characters."""
    out, n = [], 0
    for i in rng.permutation(len(pool)):
        if n >= budget:
            break
        out.append(pool[i])
        n += len(pool[i])
    return out


def default_samples(seed: int) -> tuple[list[tuple[str, str, str]], dict, list[str]]:
    """The built-in calibration set (see the file header): ([(text, domain, part)], part ->
    {"samples", "chars"}, warnings about missing parts)."""
    rng = np.random.default_rng(seed)
    samples = [(t, d or classify(t), "shipped") for t, d in read_samples(default_calibration_file())]
    warnings = []
    topics = _pydoc_topics()
    if topics is None:
        warnings.append("this Python has no pydoc_data (some distributions strip it): the "
                        "built-in calibration set goes on without its English reference prose")
    else:
        pool = [c for k in sorted(topics) for c in split_chunks(str(topics[k]))]
        samples += [(c, "prose", "pydoc") for c in _take(pool, PROSE_CHARS, rng)]
    stdlib = _stdlib_dir()
    files = [] if stdlib is None else [f for m in STDLIB_MODULES
                                       if (f := _module_file(stdlib, m)) is not None]
    if not files:
        warnings.append("this Python has no standard-library sources (some distributions ship "
                        "only .pyc files): the built-in calibration set goes on without its code "
                        "part")
    else:
        pool = [c for f in files for c in split_chunks(f.read_text(encoding="utf-8",
                                                                    errors="replace"))]
        samples += [(c, "code", "stdlib") for c in _take(pool, CODE_CHARS, rng)]
    n_shipped = sum(1 for _, _, part in samples if part == "shipped")
    rest = samples[n_shipped:]
    samples = samples[:n_shipped] + [rest[i] for i in rng.permutation(len(rest))]
    parts: dict[str, dict] = {}
    for text, _, part in samples:
        p = parts.setdefault(part, {"samples": 0, "chars": 0})
        p["samples"] += 1
        p["chars"] += len(text)
    return samples, dict(sorted(parts.items())), warnings


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
        except (ValueError, RecursionError) as e:  # an int of > 4300 digits; nesting too deep
            raise BonsaiError(f"calibration file {p}: line {i} is unreadable JSON ({e}); each "
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
    parts: dict[str, dict] | None = None  # built-in set: part -> samples, chars, tokens, share

    def summary(self) -> dict:
        out = {"source": self.source, "samples": self.n_samples,
               "tokens_available": self.n_tokens_total, "sequences": int(self.tokens.shape[0]),
               "seq_len": int(self.tokens.shape[1]), "tokens_used": int(self.tokens.size),
               "domains": self.domains, "warnings": list(self.warnings)}
        if self.parts is not None:
            out["parts"] = self.parts
        return out


def load_calibration(path: str | Path | None, tokenizer: Tokenizer, seq_len: int,
                     max_samples: int, seed: int, n_vocab: int) -> CalibrationSet:
    """Tokenized, packed calibration sequences of a file, or of the built-in set when path is
    None."""
    if seq_len < 2:
        raise BonsaiError(f"--seq-len {seq_len}: must be at least 2")
    if max_samples < 1:
        raise BonsaiError(f"--max-samples {max_samples}: must be at least 1")
    warnings: list[str] = []
    parts = None
    if path is None:
        samples, parts, warnings = default_samples(seed)
        source = BUILTIN_SOURCE
    else:
        samples = [(t, d, None) for t, d in read_samples(path)]
        source = str(path)
    stream: list[int] = []
    per_domain: dict[str, int] = {}
    for s, label, part in samples:
        ids = tokenizer.encode(s)
        stream.extend(ids)
        dom = label or classify(s)
        per_domain[dom] = per_domain.get(dom, 0) + len(ids)
        if parts is not None:
            parts[part]["tokens"] = parts[part].get("tokens", 0) + len(ids)
    total = len(stream)
    if total < seq_len:
        raise BonsaiError(f"calibration file {source}: {total} tokens, fewer than one sequence of "
                          f"--seq-len {seq_len}; give more text or lower --seq-len")
    arr = np.asarray(stream, dtype=np.int64)
    if arr.max(initial=0) >= n_vocab:
        raise BonsaiError(f"the tokenizer produced id {int(arr.max())} but the model has only "
                          f"{n_vocab} embeddings: tokenizer and model do not match")
    n_seq = total // seq_len
    seqs = arr[: n_seq * seq_len].reshape(n_seq, seq_len)
    if n_seq > max_samples:
        # The built-in set's shipped samples lead the stream and their sequences are always kept
        # (the rest is drawn with the seed): they carry its languages, math and chat.
        lead = 0 if parts is None else min(max_samples, -(-parts.get("shipped", {}).get("tokens", 0) // seq_len))
        rest = np.random.default_rng(seed).choice(n_seq - lead, size=max_samples - lead,
                                                  replace=False) + lead
        seqs = seqs[np.concatenate([np.arange(lead), np.sort(rest)])]
    domains = {k: round(v / total, 4) for k, v in sorted(per_domain.items())}
    if parts is not None:
        for p in parts.values():
            p["share"] = round(p.get("tokens", 0) / total, 4)
    if seqs.shape[0] < MIN_SEQUENCES or seqs.size < MIN_TOKENS:
        warnings.append(f"calibration set is small ({seqs.shape[0]} sequences, {seqs.size} "
                        f"tokens; at least {MIN_SEQUENCES} sequences and {MIN_TOKENS} tokens are "
                        "advised): scales and the fallback table may not generalize")
    top = max(domains.items(), key=lambda kv: kv[1])
    if top[1] > NARROW_SHARE:
        warnings.append(f"calibration set is narrow: {top[1]:.0%} of its tokens are {top[0]}; mix "
                        "in code, prose and other languages the model will see")
    return CalibrationSet(seqs, len(samples), total, domains, source, warnings, parts)
