"""Validation of OpenAI-style request bodies for the server, and the error shape it answers with.

Every problem with a request becomes an `APIError` (HTTP status, message, OpenAI error `type`,
the offending `param`, a `code`), rendered as `{"error": {"message", "type", "param", "code"}}`,
the body the official clients parse into BadRequestError / AuthenticationError / RateLimitError.
Parameters are type-checked and range-checked here, against the ranges the engine takes
(engine_limits: C int counts, uint64 seed), so an out-of-range value is a 400 that names the field
and its range (GenerationRequest checks them again). Unknown fields are ignored (clients send vendor
extensions), but fields the server cannot honour (n > 1, best_of, logprobs, suffix, several prompts)
are refused rather than silently dropped. A body must be a JSON object nested at most
MAX_JSON_DEPTH deep, without the NaN / Infinity extensions.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from .engine_limits import INT32_MAX, UINT64_MAX, check_float, check_int
from .scheduler import InvalidRequestError

__all__ = ["APIError", "bad_request", "from_invalid", "parse_json_body", "sampling_args", "completion_prompt",
           "stream_flags", "embeddings_args"]

# Defaults per endpoint, as bonsai_runner.Llama's create_completion / create_chat_completion.
COMPLETION_DEFAULTS = {"max_tokens": 16, "temperature": 0.8}
CHAT_DEFAULTS = {"max_tokens": None, "temperature": 0.2}

MAX_JSON_DEPTH = 64  # nesting levels a request body may use (real requests use fewer than 10)

# The ranges of the numeric fields (all inclusive but top_p's and repeat_penalty's lower bound).
INT_RANGES = {"max_tokens": (1, INT32_MAX), "max_completion_tokens": (1, INT32_MAX), "top_k": (0, INT32_MAX),
              "repeat_last_n": (0, INT32_MAX), "seed": (0, UINT64_MAX)}
FLOAT_RANGES = {"temperature": (0.0, 100.0, False), "top_p": (0.0, 1.0, True), "min_p": (0.0, 1.0, False),
                "repeat_penalty": (0.0, 100.0, True)}


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _too_deep() -> APIError:
    return bad_request(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep; send a flat "
                       "JSON object (an OpenAI request needs only a few levels)", code="invalid_json")


def _check_depth(value: Any) -> None:
    """Iterative, so that it cannot itself run out of stack."""
    todo = [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(v, dict):
            todo.extend((x, depth + 1) for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            todo.extend((x, depth + 1) for x in v if isinstance(x, (dict, list)))


def parse_json_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON ({e}); send a JSON object, "
                          "e.g. {\"prompt\": \"Hello\"}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(body).__name__}",
                          code="invalid_json")
    _check_depth(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"'model' must be a string, not {type(model).__name__}", "model", "invalid_type")
    return body


def _out_of_range(message: str, name: str) -> APIError:
    return bad_request(f"'{name}'{message[len(name):]}", name, "invalid_value")


def _int_field(body: dict, name: str) -> Optional[int]:
    v = _typed(body, name, (int,), "an integer")
    if v is None:
        return None
    lo, hi = INT_RANGES[name]
    return check_int(name, v, lo, hi, error=_out_of_range)


def _float_field(body: dict, name: str) -> Optional[float]:
    v = _typed(body, name, (int, float), "a number")
    if v is None:
        return None
    lo, hi, lo_open = FLOAT_RANGES[name]
    f = check_float(name, v, lo, hi, lo_open=lo_open, error=_out_of_range)
    if lo_open and not np.float32(f) > lo:  # the sampler takes a C float: 5e-324 would arrive as 0
        raise bad_request(f"'{name}' must be > {lo} also as a 32-bit float (at least "
                          f"{float(np.finfo(np.float32).smallest_subnormal):.3g}), got {v}", name, "invalid_value")
    return f


def _typed(body: dict, name: str, kinds: tuple, what: str) -> Any:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) and bool not in kinds:
        raise bad_request(f"'{name}' must be {what}, not a boolean", name, "invalid_type")
    if not isinstance(v, kinds):
        raise bad_request(f"'{name}' must be {what}, not {type(v).__name__} ({v!r})", name, "invalid_type")
    return v


def stream_flags(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = bool(_typed(body, "stream", (bool,), "a boolean"))
    opts = _typed(body, "stream_options", (dict,), "an object")
    include_usage = False
    if opts is not None:
        v = opts.get("include_usage")
        if v is not None and not isinstance(v, bool):
            raise bad_request("'stream_options.include_usage' must be a boolean", "stream_options", "invalid_type")
        include_usage = bool(v)
    return stream, include_usage


def sampling_args(body: dict, chat: bool) -> dict:
    """Keyword arguments of GenerationRequest from the body (stop, limits, sampling, seed)."""
    n = _typed(body, "n", (int,), "an integer")
    if n is not None and n != 1:
        raise bad_request(f"n={n} is not supported: this server returns one choice per request; "
                          "send n=1 (or several requests)", "n", "unsupported_value")
    best_of = _typed(body, "best_of", (int,), "an integer")
    if best_of is not None and best_of != 1:
        raise bad_request("best_of is not supported; send best_of=1", "best_of", "unsupported_value")
    if chat:
        if body.get("logprobs") or body.get("top_logprobs"):
            raise bad_request("logprobs are not supported by this server; omit logprobs/top_logprobs",
                              "logprobs", "unsupported_value")
    elif body.get("logprobs") is not None:
        raise bad_request("logprobs are not supported by this server; omit logprobs", "logprobs",
                          "unsupported_value")
    defaults = CHAT_DEFAULTS if chat else COMPLETION_DEFAULTS
    if _typed(body, "max_tokens", (int,), "an integer") is not None and body["max_tokens"] < 1:
        raise bad_request(f"'max_tokens' must be at least 1, got {body['max_tokens']}; omit it (chat) to "
                          "generate until the end of text or the slot's context", "max_tokens",
                          "invalid_value")
    max_tokens = _int_field(body, "max_tokens")
    if chat and max_tokens is None:
        max_tokens = _int_field(body, "max_completion_tokens")
    if max_tokens is None and "max_tokens" not in body:
        max_tokens = defaults["max_tokens"]
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise bad_request(f"'stop' must be a string or a list of strings, not {type(stop).__name__}",
                          "stop", "invalid_type")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise bad_request("'stop' must contain only strings", "stop", "invalid_type")
    out = {"max_tokens": max_tokens, "stop": stop}
    numbers = {"temperature": defaults["temperature"], "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}
    for name, default in numbers.items():
        v = _float_field(body, name)
        out[name] = default if v is None else v
    for name, default in (("top_k", 40), ("repeat_last_n", 64)):
        v = _int_field(body, name)
        out[name] = default if v is None else v
    out["ignore_eos"] = bool(_typed(body, "ignore_eos", (bool,), "a boolean"))
    out["seed"] = _int_field(body, "seed")
    if body.get("logit_bias"):
        raise bad_request("logit_bias is not supported by this server; omit it", "logit_bias", "unsupported_value")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type", "text") == "text"):
        raise bad_request("only response_format {\"type\": \"text\"} is supported (no JSON mode or schemas)",
                          "response_format", "unsupported_value")
    for name in ("frequency_penalty", "presence_penalty"):
        v = _typed(body, name, (int, float), "a number")
        if v:
            raise bad_request(f"{name} is not supported; use repeat_penalty (1 = off)", name, "unsupported_value")
    return out


def completion_prompt(body: dict) -> Any:
    """The one prompt of a /v1/completions body: a string or a list of token ids."""
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("'prompt' is required (a string or a list of token ids)", "prompt", "missing")
    p = body["prompt"]
    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        if len(p) != 1:
            raise bad_request(f"{len(p)} prompts in one request are not supported; send one prompt per request",
                              "prompt", "unsupported_value")
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise bad_request("the prompt is empty; give some text", "prompt", "invalid_value")
        return p
    if isinstance(p, list):
        if not p:
            raise bad_request("the prompt is empty; give some text or token ids", "prompt", "invalid_value")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            raise bad_request("a token-id prompt must be a list of integers", "prompt", "invalid_type")
        return p
    raise bad_request(f"'prompt' must be a string or a list of token ids, not {type(p).__name__}",
                      "prompt", "invalid_type")


ENCODING_FORMATS = ("float", "base64")  # /v1/embeddings' encoding_format


def embeddings_args(body: dict, n_embd: int) -> tuple[Any, str]:
    """(input, encoding_format) of a /v1/embeddings body; the input's shape is checked when it is
    tokenized (embeddings.parse_input). `dimensions` is accepted only as the model's width: the
    vectors cannot be shortened."""
    if body.get("input") is None:
        raise bad_request("'input' is required: a string, a list of strings, a list of token ids or a list of "
                          "token-id lists", "input", "missing")
    encoding = body.get("encoding_format")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODING_FORMATS:
        raise bad_request(f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}, got {encoding!r}",
                          "encoding_format", "invalid_value")
    dimensions = _typed(body, "dimensions", (int,), "an integer")
    if dimensions is not None and dimensions != n_embd:
        raise bad_request(f"'dimensions' is {dimensions} but this model's embeddings have {n_embd} dimensions, "
                          f"which cannot be changed; omit it or send {n_embd}", "dimensions", "unsupported_value")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request(f"'user' must be a string, not {type(user).__name__}", "user", "invalid_type")
    return body["input"], encoding


def from_invalid(e: InvalidRequestError) -> APIError:
    code = "context_length_exceeded" if e.param == "prompt" and "slot holds" in str(e) else "invalid_value"
    return bad_request(str(e), e.param, code)
