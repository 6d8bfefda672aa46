"""Incremental text assembly for streamed generation: UTF-8 completion and stop-string holdback.

Tokens arrive one at a time as raw byte pieces. Two things must stay true for every chunk a stream
hands out, so that the concatenation of all chunks equals the non-streamed text exactly:

1. No partial UTF-8 character is ever emitted. A multi-byte character split across tokens (common
   with byte-level BPE vocabularies) is held in the incremental decoder until its last byte arrives.
2. No text that could turn out to be part of a stop string is emitted. After decoding, the longest
   suffix of the pending text that is a prefix of some stop string is held back; it is released as
   soon as the next piece shows it is not a stop, and dropped (with everything after it) when a
   stop string completes. The text before the earliest stop occurrence is the final output.

Stop strings are matched on decoded text, so a stop string and the generated text compare as
Unicode, not as raw bytes.
"""

from __future__ import annotations

import codecs
from typing import Iterable

from .errors import BonsaiError

__all__ = ["TextStream", "normalize_stop"]


def normalize_stop(stop: str | Iterable[str] | None) -> list[str]:
    """Turns the `stop` argument of the completion API (None, a string or a list) into a list.

    Empty strings are dropped (they would match everywhere); anything that is not a string is an error.
    """
    if stop is None:
        return []
    if isinstance(stop, str):
        items = [stop]
    elif isinstance(stop, (list, tuple)):
        items = list(stop)
    else:
        raise BonsaiError(f"stop must be None, a string or a list of strings, not {type(stop).__name__}")
    for s in items:
        if not isinstance(s, str):
            raise BonsaiError(f"stop must contain only strings; got {type(s).__name__} ({s!r})")
    return [s for s in items if s]


class TextStream:
    """Turns a sequence of byte pieces into safe text chunks (see the module docstring).

    `push(piece)` returns the text that may be emitted now (possibly ""); once a stop string has been
    seen, `stopped` is True, `stop_hit` names it and further pushes return "". `finish()` releases
    whatever is still held back at the end of generation (an incomplete UTF-8 tail is dropped, as
    llama-cpp-python does). `text` is everything emitted so far.
    """

    def __init__(self, stop: str | Iterable[str] | None = None):
        self.stops = normalize_stop(stop)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""          # decoded text held back because it may start a stop string
        self._parts: list[str] = []  # emitted chunks
        self.stopped = False
        self.stop_hit: str | None = None

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def push(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        if not isinstance(piece, (bytes, bytearray)):
            raise BonsaiError(f"TextStream.push expects bytes, got {type(piece).__name__}")
        return self._release(self._held + self._decoder.decode(bytes(piece), final=False))

    def finish(self) -> str:
        """Ends the stream: emits the held-back text (it cannot become a stop string any more)."""
        if self.stopped:
            return ""
        tail = self._decoder.decode(b"", final=False)  # an incomplete character stays unreleased
        pending = self._held + tail
        self._held = ""
        out = self._cut_at_stop(pending)
        if out is None:
            out = pending
        self._decoder.reset()
        if out:
            self._parts.append(out)
        return out

    def _cut_at_stop(self, pending: str) -> str | None:
        """If a stop string occurs in `pending`, marks the stream stopped and returns the text before
        the earliest occurrence; otherwise None."""
        best = -1
        for s in self.stops:
            i = pending.find(s)
            if i >= 0 and (best < 0 or i < best):
                best, self.stop_hit = i, s
        if best < 0:
            return None
        self.stopped = True
        return pending[:best]

    def _release(self, pending: str) -> str:
        out = self._cut_at_stop(pending)
        if out is None:
            keep = self._holdback_length(pending)
            out, self._held = pending[: len(pending) - keep], pending[len(pending) - keep:]
        else:
            self._held = ""
        if out:
            self._parts.append(out)
        return out

    def _holdback_length(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of a stop string."""
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(pending)), keep, -1):
                if pending.endswith(s[:n]):
                    keep = n
                    break
        return keep
