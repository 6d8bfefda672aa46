"""Embeddings shared by `Llama.embed` / `Llama.create_embedding` and the server's /v1/embeddings.

The engine (`_core.Context.embed`) returns the final hidden state after `output_norm`, the vector
the LM head multiplies, without running the head, pooled as asked. This module holds what both
front ends do around it: the pooling names and their llama.cpp numbers, the accepted input shapes,
L2 normalization, and the OpenAI response shape.

Pooling, as llama.cpp: the file's `<arch>.pooling_type` key (0 none, 1 mean, 2 cls, 3 last,
4 rank) unless the caller overrides it; a file without the key (every generative model) gets
`none`, one vector per token. llama-server's OpenAI route refuses `none` (it cannot put several
vectors in one `embedding`), and so does ours: start the server with `--pooling last` (or mean /
cls). `rank` is a reranker's score head and is refused everywhere.

Normalization, as llama.cpp's default (`embd_normalize` 2): each vector divided by its Euclidean
norm (a zero vector stays zero); with pooling none each token's vector on its own, as
llama-cpp-python does.
"""

from __future__ import annotations

import base64
from typing import Any, Callable, Optional, Union

import numpy as np

__all__ = ["POOLING_TYPES", "resolve_pooling", "parse_input", "l2_normalize", "embedding_list", "to_base64"]

# llama.cpp's enum llama_pooling_type (LLAMA_POOLING_TYPE_UNSPECIFIED = -1: the model's own).
POOLING_TYPES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
_SUPPORTED = ("none", "mean", "cls", "last")


def resolve_pooling(value: Union[None, int, str], model_default: Callable[[], str],
                    error: Callable[[str], Exception]) -> str:
    """The pooling name for `value`: None or -1 = the model's (`model_default()`, read only then),
    else one of llama.cpp's numbers or names. `rank` and unknown values raise `error(message)`."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == -1):
        name = model_default()
        where = "the model file's pooling_type"
    elif isinstance(value, bool) or not isinstance(value, (int, str)):
        raise error(f"pooling_type must be a name ({', '.join(_SUPPORTED)}) or llama.cpp's number (-1..3), "
                    f"not {type(value).__name__}")
    elif isinstance(value, int):
        names = {v: k for k, v in POOLING_TYPES.items()}
        if value not in names:
            raise error(f"pooling_type {value} is not one of llama.cpp's pooling types "
                        "(-1 the model's, 0 none, 1 mean, 2 cls, 3 last)")
        name, where = names[value], f"pooling_type {value}"
    else:
        name, where = value.lower(), f"pooling_type {value!r}"
        if name not in POOLING_TYPES:
            raise error(f"unknown pooling_type {value!r}; use one of {', '.join(_SUPPORTED)}")
    if name == "rank":
        raise error(f"{where} is rank, a reranker's score head, which this engine does not run; "
                    f"pass pooling_type as one of {', '.join(_SUPPORTED)}")
    return name


def parse_input(value: Any, tokenize: Callable[[str], list[int]], n_vocab: int,
                error: Callable[[str], Exception]) -> tuple[list[list[int]], bool]:
    """The token lists of an embeddings input and whether it was a single input: a string or a
    list of token ids is one input; a list of strings or a list of token-id lists is several.
    Anything else, an empty input or an out-of-range token id raises `error(message)`."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, str):
        return [_text_tokens(value, 0, tokenize, error)], True
    if not isinstance(value, (list, tuple)) or not value:
        raise error("the input must be a string, a list of strings, a list of token ids or a list of token-id "
                    f"lists, and not empty; got {_describe(value)}")
    if all(_is_token(t) for t in value):
        return [_check_ids(list(value), 0, n_vocab, error)], True
    if all(isinstance(t, str) for t in value):
        return [_text_tokens(t, i, tokenize, error) for i, t in enumerate(value)], False
    if all(isinstance(t, (list, tuple, np.ndarray)) for t in value):
        out = []
        for i, ids in enumerate(value):
            ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
            if not ids:
                raise error(f"input {i} is an empty token list")
            if not all(_is_token(t) for t in ids):
                raise error(f"input {i} must be a list of integer token ids")
            out.append(_check_ids(ids, i, n_vocab, error))
        return out, False
    raise error("the input list mixes kinds: give all strings, all token ids, or all token-id lists")


def _is_token(t: Any) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, bool)


def _describe(value: Any) -> str:
    return "an empty list" if isinstance(value, (list, tuple)) else type(value).__name__


def _text_tokens(text: str, i: int, tokenize: Callable[[str], list[int]], error) -> list[int]:
    tokens = tokenize(text)
    if not tokens:
        raise error(f"input {i} is empty: it has no tokens to embed")
    return tokens


def _check_ids(ids: list, i: int, n_vocab: int, error) -> list[int]:
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise error(f"input {i} holds the token id {bad}: ids must be in [0, {n_vocab})")
    return [int(t) for t in ids]


def l2_normalize(rows: np.ndarray) -> np.ndarray:
    """Each row divided by its Euclidean norm (in float64; an all-zero row stays zero)."""
    rows = np.asarray(rows, dtype=np.float64)
    norm = np.sqrt(np.sum(rows * rows, axis=-1, keepdims=True))
    return np.divide(rows, norm, out=np.zeros_like(rows), where=norm > 0)


def embedding_list(vectors: list, model: str, n_tokens: int, encode: Optional[Callable[[Any], Any]] = None) -> dict:
    """The OpenAI response `{"object": "list", "data": [...], "model", "usage"}` of the vectors, one
    per input in input order (`encode` turns each vector into its wire form, e.g. to_base64)."""
    data = [{"object": "embedding", "embedding": encode(v) if encode else v, "index": i}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def to_base64(vector: Any) -> str:
    """OpenAI's encoding_format "base64": the little-endian float32 bytes of the vector, base64."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
