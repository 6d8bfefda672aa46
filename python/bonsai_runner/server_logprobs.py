"""The logprobs of the server's responses, built from the scheduler's TokenLogprobs.

/v1/completions answers in the legacy completions shape, `{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`: `top_logprobs` is one dict per token, token text -> logprob, of the
asked number of most likely tokens plus the sampled one (so up to N + 1 entries; tokens whose text
is the same keep the likelier value), and `text_offset` is the character offset of each token's
text, counted from the start of the prompt text (as bonsai_runner.Llama counts it). A streamed
response carries the same values spread over its chunks: one LogprobFormatter per request keeps
the offset across them. /v1/chat/completions answers with `{"content": [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}], "refusal": None}`, top_logprobs exactly the asked
number (fewer only when the vocabulary is smaller), most likely first.

Token text is the token's bytes decoded as UTF-8, dropping bytes of an incomplete character (as
Llama does); `bytes` holds the exact bytes. A log-probability of minus infinity (a logit of -inf)
is reported as -9999.0, the OpenAI API's value for "effectively impossible", since JSON has no
infinity.
"""

from __future__ import annotations

import codecs
import math
from typing import Callable, Optional, Sequence

from .scheduler import TokenLogprob

__all__ = ["LogprobFormatter", "chat_logprobs"]

_IMPOSSIBLE = -9999.0


def _value(lp: float) -> float:
    return lp if math.isfinite(lp) else _IMPOSSIBLE


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="ignore")


class LogprobFormatter:
    """Legacy completion logprobs of one request's tokens, in order, over one or several calls;
    `text_offset` is where the completion text starts (the length of the prompt text)."""

    def __init__(self, piece: Callable[[int], bytes], text_offset: int):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._offset = text_offset

    def legacy(self, entries: Optional[Sequence[TokenLogprob]]) -> Optional[dict]:
        if entries is None:
            return None
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            b = self._piece(e.token)
            text = _text(b)
            out["tokens"].append(text)
            out["text_offset"].append(self._offset)
            self._offset += len(self._decoder.decode(b))
            out["token_logprobs"].append(_value(e.logprob))
            top: dict[str, float] = {}
            for t, lp in e.top:
                top.setdefault(_text(self._piece(t)), _value(lp))
            top.setdefault(text, _value(e.logprob))
            out["top_logprobs"].append(top)
        return out


def chat_logprobs(entries: Optional[Sequence[TokenLogprob]], piece: Callable[[int], bytes]) -> Optional[dict]:
    """The chat completion `logprobs` object of `entries` (None when logprobs were not asked for)."""
    if entries is None:
        return None

    def item(token: int, lp: float) -> dict:
        b = piece(token)
        return {"token": _text(b), "logprob": _value(lp), "bytes": list(b)}

    content = [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}
