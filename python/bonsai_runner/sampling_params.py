"""Checks of the sampler fields shared by `Llama`, the server's request validation and the scheduler:
frequency / presence penalties and logit_bias (the arithmetic is the C++ sampler's, sampling.h).

- frequency_penalty / presence_penalty: numbers in [-2, 2], as OpenAI's API. They apply over the
  same window as repeat_penalty: the last repeat_last_n tokens of prompt and generated text (as
  llama.cpp's penalty_last_n); repeat_last_n = 0 turns all penalties off.
- logit_bias: a dict token id -> bias, ids as int or as the decimal string JSON requires, each a
  valid token id of the model; biases in [-100, 100] (OpenAI's range) or -inf; -100 and -inf ban
  the token.

Each function raises `error(message, name)` (BonsaiError by default), as engine_limits.py does.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional

import numpy as np

from .engine_limits import _bonsai_error, check_float

__all__ = ["PENALTY_RANGE", "BIAS_RANGE", "check_penalty", "normalize_logit_bias"]

PENALTY_RANGE = (-2.0, 2.0)
BIAS_RANGE = (-100.0, 100.0)


def check_penalty(name: str, value: Any, *,
                  error: Callable[[str, str], Exception] = _bonsai_error) -> float:
    """frequency_penalty / presence_penalty as a float in [-2, 2] (0 = off)."""
    return check_float(name, value, PENALTY_RANGE[0], PENALTY_RANGE[1], error=error, what="0 = off")


def normalize_logit_bias(value: Any, n_vocab: Optional[int], *,
                         error: Callable[[str, str], Exception] = _bonsai_error) -> Optional[dict[int, float]]:
    """logit_bias as {token id: float bias}, or None when absent or empty. n_vocab None checks only
    that the ids are non-negative (the scheduler checks them against the model when it is known)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise error(f"logit_bias must be an object mapping token ids to biases, e.g. {{\"15043\": -100}}, "
                    f"not {type(value).__name__}", "logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            token = int(key)
        elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            token = int(key)
        else:
            raise error(f"logit_bias key {key!r} is not a token id (an integer or its decimal string)", "logit_bias")
        if token < 0 or (n_vocab is not None and token >= n_vocab):
            ids = f"[0, {n_vocab})" if n_vocab is not None else "non-negative"
            raise error(f"logit_bias key {key!r} is not a token id of this model: ids are {ids}", "logit_bias")
        if isinstance(bias, (float, np.floating)) and math.isinf(bias) and bias < 0:
            out[token] = -math.inf
            continue
        out[token] = check_float(f"logit_bias[{key!r}]", bias, BIAS_RANGE[0], BIAS_RANGE[1],
                                 error=lambda m, _: error(m, "logit_bias"), what="-100 (or -inf) bans the token")
    return out or None
