"""Facts about a loaded model's vocabulary that the Python facades (`Llama`, the server) share.

- `end_of_generation_ids`: the ids that end a generation. The engine's tokenizer (`_core.Vocab`)
  applies llama.cpp's rules (eos/eot/eom and the known end-of-turn texts); when a separate
  tokenizer overrides the file's vocabulary, the same rules are applied here from the metadata.
- `adds_bos`: whether tokenizing with special tokens prepends BOS (probed on the real tokenizer, so
  it agrees with `tokenizer.ggml.add_bos_token` and the tokenizer's defaults).
- `token_text`: the written form of a special token, as chat templates expect for bos/eos_token.
- `common_prefix_len`: how many leading tokens two sequences share (prompt-prefix reuse).
- `special_token_id`: the id of a special token from its text (tool-call grammars emit the token).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

__all__ = ["end_of_generation_ids", "adds_bos", "token_text", "special_token_id"]

_TOKEN_TYPE_CONTROL = 3  # tokenizer.ggml.token_type value of control tokens
_TOKEN_TYPE_USER_DEFINED = 4
_END_OF_TURN_NAMES = frozenset({"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                                "<end_of_turn>", "<|end_of_text|>", "</s>"})


def end_of_generation_ids(core: Any, model: Any, metadata: Mapping[str, Any], n_vocab: int,
                          tokenizer_override: bool) -> frozenset:
    """EOS, the file's end-of-turn ids, and control tokens written as a known end-of-turn marker
    (e.g. Qwen's <|endoftext|> next to its EOS <|im_end|>), as llama.cpp's vocabulary marks them."""
    ids = {int(model.eos)}
    vocab_cls = getattr(core, "Vocab", None)
    if vocab_cls is not None and not tokenizer_override:
        try:
            vocab = vocab_cls({k: v for k, v in metadata.items() if k.startswith("tokenizer.")})
            return frozenset(int(i) for i in vocab.eog_ids) | ids
        except ValueError:
            pass
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = metadata.get(key)
        if isinstance(v, (int, np.integer)):
            ids.add(int(v))
    names = metadata.get("tokenizer.ggml.tokens")
    types = metadata.get("tokenizer.ggml.token_type")
    if isinstance(names, (list, tuple)) and isinstance(types, (list, tuple)) and len(names) == len(types):
        for i, (name, kind) in enumerate(zip(names, types)):
            if kind == _TOKEN_TYPE_CONTROL and name in _END_OF_TURN_NAMES:
                ids.add(i)
    return frozenset(i for i in ids if 0 <= i < n_vocab)


def adds_bos(model: Any) -> bool:
    """True when the tokenizer prepends BOS to text tokenized with special tokens."""
    bos = int(model.bos)
    with_special = model.tokenize(b"a", add_special=True, parse_special=False)
    without = model.tokenize(b"a", add_special=False, parse_special=False)
    return bos >= 0 and list(with_special[:1]) == [bos] and list(without[:1]) != [bos]


def token_text(metadata: Mapping[str, Any], token: int, piece: Callable[[int], bytes]) -> str:
    """The written form of a (special) token; "" for a negative id."""
    if token < 0:
        return ""
    names = metadata.get("tokenizer.ggml.tokens")
    if isinstance(names, (list, tuple)) and token < len(names) and isinstance(names[token], str):
        return names[token]
    return piece(token).decode("utf-8", errors="ignore")


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens two sequences share (the KV that prompt reuse can keep)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def special_token_id(metadata: Mapping[str, Any], tokenize: Callable[[bytes], Sequence[int]],
                     text: str) -> Optional[int]:
    """The id of the one control or user-defined token spelled `text` (e.g. <tool_call>), or None;
    `tokenize(bytes)` must parse special-token text."""
    ids = list(tokenize(text.encode("utf-8")))
    types = metadata.get("tokenizer.ggml.token_type") or []
    if len(ids) == 1 and 0 <= ids[0] < len(types) and types[ids[0]] in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED):
        return int(ids[0])
    return None
