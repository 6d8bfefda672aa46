"""`UseGuard`: one `Llama` used by one call at a time, however many threads share it.

A `Llama` has one KV cache; two calls interleaved on it compute from each other's tokens and return
wrong text without any error. The guard serialises them:

- A plain call (`__call__`, `create_completion`, `tokenize`, `eval`, `close`, ...) holds the guard
  from its first line to its return. Another thread entering meanwhile waits: the call in progress
  ends in bounded time, so this wait has no limit.
- A stream (the iterator of `stream=True`, `generate`) holds the guard from its first `next()` until
  it is exhausted, closed or garbage-collected, suspended steps included, so that a second thread
  cannot rewrite the cache between its chunks. While only suspended streams hold the guard, a
  waiting thread gives up after `stream_wait_s` seconds without progress (no stream step and no
  call ended) with a BonsaiError naming the cause: a stream left open and never read would
  otherwise block every other thread forever (or deadlock a thread that waits on the waiter).
- Re-entry from the holding thread is allowed (the guard is reentrant per thread): a thread that
  calls the Llama again while its own stream is suspended proceeds, and the interrupted stream then
  raises a BonsaiError on its next step (see `Llama.generate`), as before the guard existed.
- A suspended stream may be resumed from another thread when no call is running (ownership moves
  with the stream), so a stream created in one thread can be consumed in another.

Release never depends on which thread releases: a stream finalized by the garbage collector in any
thread frees the guard (a `threading.RLock` would raise there).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from .errors import BonsaiError

__all__ = ["UseGuard", "GuardedStream", "DEFAULT_STREAM_WAIT_S"]

DEFAULT_STREAM_WAIT_S = 30.0


class UseGuard:
    """Per-thread reentrant exclusion with a bounded wait on suspended streams (module docstring)."""

    def __init__(self, stream_wait_s: float = DEFAULT_STREAM_WAIT_S):
        self.stream_wait_s = stream_wait_s
        self._cond = threading.Condition(threading.Lock())
        self._owner: Optional[int] = None  # ident of the thread holding the guard
        self._running = 0                  # calls and stream steps in progress (owner thread)
        self._open = 0                     # streams started and not finished
        self._progress = time.monotonic()  # when a call or a stream step last ended

    def _wait_turn(self, me: int, resuming: bool) -> None:
        while not (self._owner is None or self._owner == me or (resuming and self._running == 0)):
            if self._running:
                self._cond.wait()
                continue
            left = self._progress + self.stream_wait_s - time.monotonic()
            if left <= 0:
                raise BonsaiError(
                    f"this Llama is held by a stream that another thread opened and has not read for "
                    f"{self.stream_wait_s:g} s: read that stream to the end or close() it before "
                    "using the Llama from this thread (one call at a time per Llama; create one "
                    "Llama per thread, or use `bonsai serve`, to run requests in parallel)")
            self._cond.wait(left)

    def enter(self, resuming: bool = False) -> None:
        me = threading.get_ident()
        with self._cond:
            self._wait_turn(me, resuming)
            self._owner = me
            self._running += 1

    def leave(self) -> None:
        with self._cond:
            self._running -= 1
            self._progress = time.monotonic()
            if self._running == 0 and self._open == 0:
                self._owner = None
            self._cond.notify_all()

    def open_stream(self) -> None:
        with self._cond:
            self._open += 1

    def close_stream(self) -> None:
        with self._cond:
            self._open -= 1
            self._progress = time.monotonic()
            if self._running == 0 and self._open == 0:
                self._owner = None
            self._cond.notify_all()

    @contextmanager
    def call(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()


class GuardedStream:
    """An iterator over `make()`'s generator that holds `guard` from its first step to its end."""

    def __init__(self, guard: UseGuard, make: Callable[[], Iterator]):
        self._guard = guard
        self._make = make
        self._gen: Optional[Iterator] = None
        self._started = False  # the first step ran: this stream counts as open in the guard
        self._done = False

    def __iter__(self) -> "GuardedStream":
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        first = not self._started
        self._guard.enter(resuming=not first)
        try:
            if first:
                self._started = True
                self._guard.open_stream()
                self._gen = self._make()
            return next(self._gen)
        except BaseException:
            self._finish()
            raise
        finally:
            self._guard.leave()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        if not self._started:
            return  # never started: the guard was never taken
        gen, self._gen = self._gen, None
        try:
            close = getattr(gen, "close", None)
            if close is not None:
                close()
        finally:
            self._guard.close_stream()

    def close(self) -> None:
        """Ends the stream and frees the Llama for other threads."""
        if self._done:
            return
        if not self._started:
            self._done = True
            return
        self._guard.enter(resuming=True)
        try:
            self._finish()
        finally:
            self._guard.leave()

    def __del__(self) -> None:
        # Nobody else can be stepping a stream that is being collected: no need to wait.
        try:
            self._finish()
        except Exception:
            pass
