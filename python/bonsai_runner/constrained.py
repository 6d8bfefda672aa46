"""Constrained decoding: JSON mode, JSON schemas and GBNF grammars as a per-sequence token mask.

Three request shapes compile into a `Constraint` (vocabulary-independent, checked at once):
- `{"type": "json_object"}` (any JSON object; with llama-server's / llama-cpp-python's extra
  `"schema"` key, that schema),
- OpenAI's `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` or a bare schema
  (llama-server's `json_schema` field),
- a GBNF grammar string (llama.cpp's format; a Lark grammar is taken too), or an object carrying
  one in a `_grammar` / `grammar` text attribute (what llama-cpp-python's LlamaGrammar holds).
A schema or grammar that does not compile is one `ConstraintError` (a BonsaiError, so a
ValueError) naming the parameter and the compiler's message.

The token masks come from llguidance (chosen by measurement, see the README): a
`ConstraintVocabulary` hands it every token's bytes (control tokens prefixed with 0xFF, so no
text can produce them) and the end-of-generation ids, once per model (about 1 s for a 152k-token
vocabulary). `Constraint.matcher(vocab)` gives a `Matcher` per sequence:
`allowed_mask(row)` (a copy of the logits row with every token the grammar forbids at -inf),
`advance(token)` after a token is sampled, `is_done()` once the grammar admits no further token.
`compute_masks(matchers)` computes the next masks of several sequences at once, on llguidance's
thread pool (the scheduler calls it once per step for its constrained sequences).
End-of-generation tokens are allowed exactly where the grammar may end. JSON is generated without
whitespace between tokens of the structure (`{"a":1,"b":[2]}`), which keeps outputs short.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .errors import BonsaiError

__all__ = ["Constraint", "ConstraintError", "ConstraintVocabulary", "Matcher", "checked_lark", "from_response_format",
           "from_json_schema", "from_grammar", "request_constraint", "compute_masks"]

_TOKEN_TYPE_CONTROL = 3  # tokenizer.ggml.token_type of control tokens
_TOKEN_TYPE_USER_DEFINED = 4
_JSON_OPTIONS = {"whitespace_flexible": False}
_KIND_NAMES = {"json_object": "JSON object schema", "json_schema": "JSON schema", "grammar": "grammar",
               "tool_choice": "tool-call grammar"}


class ConstraintError(BonsaiError):
    """A response_format / json_schema / grammar that cannot be used; `param` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ImportError("constrained decoding (response_format, json_schema, grammar) needs the llguidance "
                          "package: pip install llguidance") from None
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """A compiled constraint: `kind` ("json_object", "json_schema" or "grammar"), `param` (the
    request field it came from) and `grammar` (llguidance's grammar text)."""

    kind: str
    param: str
    grammar: str

    def matcher(self, vocab: "ConstraintVocabulary") -> "Matcher":
        return Matcher(self, vocab)

    def check(self, vocab: "ConstraintVocabulary") -> None:
        """ConstraintError when the grammar cannot be used with this vocabulary (checked on a matcher)."""
        Matcher(self, vocab)


def _checked(kind: str, param: str, grammar: str) -> Constraint:
    llg = _llguidance()
    message = llg.LLMatcher.validate_grammar(grammar)
    if message and not message.startswith("WARNING"):
        raise ConstraintError(f"{param}: the {_KIND_NAMES[kind]} does not compile: {message}", param)
    return Constraint(kind, param, grammar)


def checked_lark(grammar: str, param: str, kind: str = "grammar") -> Constraint:
    """A grammar in llguidance's Lark syntax (e.g. tool_calls.py's forced calls) as a Constraint."""
    return _checked(kind, param, grammar)


def from_json_schema(schema: Any, param: str = "json_schema", kind: str = "json_schema") -> Constraint:
    """A JSON schema (a dict, or its JSON text) as a Constraint."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ConstraintError(f"{param}: the schema is not valid JSON: {e}", param) from None
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError(f"{param}: a JSON schema must be an object (or true / false), not "
                              f"{type(schema).__name__}", param)
    try:
        grammar = _llguidance().LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"{param}: the JSON schema does not compile: {e}", param) from None
    return _checked(kind, param, grammar)


def from_response_format(fmt: Any, param: str = "response_format") -> Optional[Constraint]:
    """OpenAI's response_format: None for absent or {"type": "text"}; json_object (with an optional
    "schema", as llama-server and llama-cpp-python take it) or json_schema as a Constraint."""
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise ConstraintError(f"{param} must be an object such as {{\"type\": \"json_object\"}}, not "
                              f"{type(fmt).__name__}", param)
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema")
        return from_json_schema({"type": "object"} if schema is None else schema, param, "json_object")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise ConstraintError(f"{param}: type json_schema needs \"json_schema\": {{\"name\": ..., "
                                  f"\"schema\": {{...}}}}", param)
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise ConstraintError(f"{param}: json_schema.name must be a string, not {type(name).__name__}", param)
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ConstraintError(f"{param}: json_schema.strict must be a boolean", param)
        return from_json_schema(spec["schema"], param)
    raise ConstraintError(f"{param}: unknown type {kind!r}; use \"text\", \"json_object\" or \"json_schema\"", param)


def from_grammar(grammar: Any, param: str = "grammar") -> Optional[Constraint]:
    """A GBNF (or Lark) grammar string, or an object with a `_grammar` / `grammar` text attribute
    (llama-cpp-python's LlamaGrammar keeps its GBNF text there); None or "" for no grammar."""
    if grammar is None:
        return None
    if not isinstance(grammar, str):
        text = next((getattr(grammar, a) for a in ("_grammar", "grammar")
                     if isinstance(getattr(grammar, a, None), str)), None)
        if text is None:
            raise ConstraintError(f"{param} must be a GBNF grammar string (or an object with its text in a "
                                  f"'_grammar' or 'grammar' attribute), not {type(grammar).__name__}", param)
        grammar = text
    if not grammar.strip():
        return None
    try:
        lark = _llguidance().grammar_from("gbnf", grammar)
    except ValueError as e:
        raise ConstraintError(f"{param}: the grammar does not compile: {e}", param) from None
    return _checked("grammar", param, lark)


def request_constraint(response_format: Any = None, grammar: Any = None,
                       json_schema: Any = None) -> Optional[Constraint]:
    """The one constraint of a request from its response_format, grammar and json_schema fields
    (llama-server's names); giving more than one is refused."""
    found = [(name, c) for name, c in (("response_format", from_response_format(response_format)),
                                       ("grammar", from_grammar(grammar)),
                                       ("json_schema", None if json_schema is None else
                                        from_json_schema(json_schema, "json_schema"))) if c is not None]
    if len(found) > 1:
        names = " and ".join(n for n, _ in found)
        raise ConstraintError(f"{names} both constrain the output; give only one of them", found[1][0])
    return found[0][1] if found else None


class ConstraintVocabulary:
    """Every token's bytes and the end-of-generation ids of one model, as llguidance needs them.
    `model` is a _core.Model (token_to_piece, tokenize); `metadata` its GGUF metadata (token types
    and names mark the control tokens); `n_vocab` the logits row length."""

    def __init__(self, model: Any, metadata: Mapping[str, Any], n_vocab: int, eog_ids: Sequence[int]):
        llg = _llguidance()
        names = metadata.get("tokenizer.ggml.tokens") or []
        types = metadata.get("tokenizer.ggml.token_type") or []
        tokens: list[bytes] = []
        for i in range(n_vocab):
            kind = types[i] if i < len(types) else 0
            name = names[i] if i < len(names) else None
            if isinstance(name, str) and (kind == _TOKEN_TYPE_CONTROL or (
                    kind == _TOKEN_TYPE_USER_DEFINED and name.startswith("<") and name.endswith(">"))):
                tokens.append(b"\xff" + name.encode("utf-8"))  # llguidance's mark of a special token
            else:
                tokens.append(_piece(model, i))
        eog = sorted(int(t) for t in eog_ids)
        if not eog:
            raise BonsaiError("constrained decoding needs the model's end-of-generation token, and it has none")

        class _Tokenizer:  # the shape llguidance.TokenizerWrapper reads
            eos_token_id = eog[0]
            bos_token_id = None
            special_token_ids: list[int] = []

            def __init__(self):
                self.tokens = tokens

            def __call__(self, text):
                data = text if isinstance(text, bytes) else text.encode("utf-8")
                if greedy is not None:
                    return greedy(data)
                return list(model.tokenize(data, add_special=False, parse_special=False))

        # A SentencePiece vocabulary that adds a space prefix puts U+2581 before any text it is
        # given, so its tokens of a forced grammar string would not spell that string: there the
        # string is split greedily into the longest token pieces instead (exact bytes, which is
        # what llguidance needs; bonsai_run's grammar.cpp lets llguidance do the same).
        greedy = (_greedy_tokenizer(tokens) if metadata.get("tokenizer.ggml.model") == "llama"
                  and metadata.get("tokenizer.ggml.add_space_prefix", True) else None)

        self.n_vocab = n_vocab
        self.eog_ids = eog
        self.tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(_Tokenizer()), n_vocab=n_vocab, eos_token=eog)


def _greedy_tokenizer(tokens: Sequence[bytes]):
    """bytes -> token ids: longest piece first at each position (special tokens never match)."""
    ids: dict[bytes, int] = {}
    for i, t in enumerate(tokens):
        if t and not t.startswith(b"\xff"):
            ids.setdefault(t, i)
    longest = max((len(t) for t in ids), default=1)

    def split(data: bytes) -> list[int]:
        out, at = [], 0
        while at < len(data):
            for n in range(min(longest, len(data) - at), 0, -1):
                tok = ids.get(data[at:at + n])
                if tok is not None:
                    out.append(tok)
                    at += n
                    break
            else:
                raise ConstraintError(f"the vocabulary has no token for byte 0x{data[at]:02x} of a grammar "
                                      "string", "grammar")
        return out
    return split


def _piece(model: Any, token: int) -> bytes:
    try:
        return bytes(model.token_to_piece(token))
    except (ValueError, IndexError):  # rows of the output head past the tokenizer's vocabulary
        return b""


class LazyVocabulary:
    """A ConstraintVocabulary built on first use (thread-safe), so models never constrained pay nothing."""

    def __init__(self, model: Any, n_vocab: int, eog_ids: Sequence[int]):
        self._model = model
        self._n_vocab = n_vocab
        self._eog_ids = tuple(eog_ids)
        self._vocab: Optional[ConstraintVocabulary] = None
        self._lock = threading.Lock()

    def get(self) -> ConstraintVocabulary:
        with self._lock:
            if self._vocab is None:
                self._vocab = ConstraintVocabulary(self._model, self._model.metadata, self._n_vocab, self._eog_ids)
            return self._vocab


class Matcher:
    """One sequence's position in a Constraint's grammar (see the module docstring)."""

    def __init__(self, constraint: Constraint, vocab: ConstraintVocabulary):
        llg = _llguidance()
        self.constraint = constraint
        self._n_vocab = vocab.n_vocab
        self._m = llg.LLMatcher(vocab.tokenizer, constraint.grammar, log_level=0)
        self._check()
        self._bits = np.zeros((vocab.n_vocab + 31) // 32, dtype=np.int32)
        self._ready = False  # _bits already holds the next mask (compute_masks)

    def _check(self) -> None:
        if self._m.is_error():
            raise ConstraintError(f"{self.constraint.param}: {self._m.get_error()}", self.constraint.param)

    def allowed(self) -> np.ndarray:
        """A bool array over the vocabulary: the tokens the grammar allows next."""
        if not self._ready:
            self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            self._ready = True
        self._check()
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._n_vocab].view(bool)

    def allowed_mask(self, row: np.ndarray) -> np.ndarray:
        """`row` (logits over the vocabulary) with every token the grammar forbids set to -inf (a copy)."""
        allowed = self.allowed()
        row = np.asarray(row, dtype=np.float32)
        if np.count_nonzero(allowed) * 2 < allowed.size:  # few allowed: copy those into -inf
            out = np.full(row.shape, -np.inf, dtype=np.float32)
            np.copyto(out, row, where=allowed)
        else:  # most allowed: copy all, clear the rest
            out = row.copy()
            out[~allowed] = -np.inf
        return out

    def advance(self, token: int) -> None:
        """Feeds the sampled `token`; a token the grammar forbids is a ConstraintError."""
        self._ready = False
        if not self._m.consume_token(int(token)):
            raise ConstraintError(f"{self.constraint.param}: token {token} does not fit the "
                                  f"{_KIND_NAMES[self.constraint.kind]}: {self._m.get_error()}",
                                  self.constraint.param)

    def is_done(self) -> bool:
        """True when the grammar admits no further token (the output is complete)."""
        return bool(self._m.is_stopped())


_executor = None
_executor_lock = threading.Lock()


def compute_masks(matchers: Sequence[Matcher]) -> None:
    """Computes the next mask of every matcher in one call on llguidance's thread pool; each
    matcher's allowed() / allowed_mask() then reads it without recomputing (until it advances)."""
    global _executor
    todo = [m for m in matchers if not m._ready]
    if len(todo) < 2:
        return  # one matcher computes its own mask when asked
    with _executor_lock:
        if _executor is None:
            _executor = _llguidance().LLExecutor()
    words = todo[0]._bits.size
    if any(m._bits.size != words for m in todo):
        raise ValueError("compute_masks: the matchers belong to different vocabularies")
    bits = np.zeros((len(todo), words), dtype=np.int32)
    _executor.unsafe_compute_mask_ptr([(m._m, i) for i, m in enumerate(todo)], bits.ctypes.data, words * 4,
                                      len(todo))
    for i, m in enumerate(todo):
        m._bits = bits[i]
        m._ready = True
