"""The ranges the native engine accepts for its integer and float parameters, checked in Python.

The binding takes C `int` (32-bit) for counts such as top_k, repeat_last_n and n_ctx, and a
`uint64` seed; a Python int outside that range would surface as a raw pybind11 TypeError (or, on
the server's scheduler thread, kill the thread). Every front end (Llama, the scheduler, the server)
checks its parameters here first, so an out-of-range value is one clear error that names the
parameter and its range. `check_int` / `check_float` raise `error(message, name)`; the default
raises BonsaiError(message), the scheduler passes its InvalidRequestError (which keeps the name).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from .errors import BonsaiError

__all__ = ["INT32_MAX", "UINT32_MAX", "UINT64_MAX", "check_int", "check_float"]

INT32_MAX = 2**31 - 1   # the binding's C int (top_k, repeat_last_n, n_ctx, n_batch, n_threads, ...)
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1  # the sampler's seed


def _bonsai_error(message: str, name: str) -> Exception:
    return BonsaiError(message)


def _raise(error: Callable[[str, str], Exception], message: str, name: str) -> None:
    raise error(message, name)


def check_int(name: str, value: Any, lo: int = 0, hi: int = INT32_MAX, *,
              error: Callable[[str, str], Exception] = _bonsai_error) -> int:
    """`value` as an int in [lo, hi]; anything else (bool, float, str, out of range) raises
    `error` naming `name` and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        _raise(error, f"{name} must be an integer, not {type(value).__name__} ({value!r})", name)
    v = int(value)
    if not lo <= v <= hi:
        _raise(error, f"{name} must be an integer in [{lo}, {hi}], got {v}", name)
    return v


def check_float(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False,
                error: Callable[[str, str], Exception] = _bonsai_error, what: Optional[str] = None) -> float:
    """`value` as a finite float in [lo, hi] (or (lo, hi] with lo_open); `what` is an optional
    hint appended to the message (e.g. "1 = off")."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        _raise(error, f"{name} must be a number, not {type(value).__name__} ({value!r})", name)
    try:
        v = float(value)
    except OverflowError:  # an int too large for a double
        v = math.inf
    if not math.isfinite(v) or not (lo < v if lo_open else lo <= v) or not v <= hi:
        hint = f"; {what}" if what else ""
        _raise(error, f"{name} must be a number in {'(' if lo_open else '['}{lo}, {hi}], got {value}{hint}", name)
    return v
