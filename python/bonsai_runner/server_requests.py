"""Validation of OpenAI-style request bodies for the server, and the error shape it answers with.

Every problem with a request becomes an `APIError` (HTTP status, message, OpenAI error `type`,
the offending `param`, a `code`), rendered as `{"error": {"message", "type", "param", "code"}}`,
the body the official clients parse into BadRequestError / AuthenticationError / RateLimitError.
Parameters are type-checked here and range-checked by `GenerationRequest`; unknown fields are
ignored (clients send vendor extensions), but fields the server cannot honour (n > 1, best_of,
logprobs, suffix, several prompts) are refused rather than silently dropped.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .scheduler import InvalidRequestError

__all__ = ["APIError", "bad_request", "from_invalid", "parse_json_body", "sampling_args", "completion_prompt",
           "stream_flags"]

# Defaults per endpoint, as bonsai_runner.Llama's create_completion / create_chat_completion.
COMPLETION_DEFAULTS = {"max_tokens": 16, "temperature": 0.8}
CHAT_DEFAULTS = {"max_tokens": None, "temperature": 0.2}


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


def parse_json_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON ({e}); send a JSON object, "
                          "e.g. {\"prompt\": \"Hello\"}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(body).__name__}",
                          code="invalid_json")
    return body


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
    max_tokens = _typed(body, "max_tokens", (int,), "an integer")
    if chat and max_tokens is None:
        max_tokens = _typed(body, "max_completion_tokens", (int,), "an integer")
    if max_tokens is None and "max_tokens" not in body:
        max_tokens = defaults["max_tokens"]
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"'max_tokens' must be at least 1, got {max_tokens}; omit it (chat) to "
                          "generate until the end of text or the slot's context", "max_tokens",
                          "invalid_value")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise bad_request(f"'stop' must be a string or a list of strings, not {type(stop).__name__}",
                          "stop", "invalid_type")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise bad_request("'stop' must contain only strings", "stop", "invalid_type")
    out = {"max_tokens": max_tokens, "stop": stop}
    numbers = {"temperature": defaults["temperature"], "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}
    for name, default in numbers.items():
        v = _typed(body, name, (int, float), "a number")
        out[name] = default if v is None else v
    for name, default in (("top_k", 40), ("repeat_last_n", 64)):
        v = _typed(body, name, (int,), "an integer")
        out[name] = default if v is None else v
    out["ignore_eos"] = bool(_typed(body, "ignore_eos", (bool,), "a boolean"))
    out["seed"] = _typed(body, "seed", (int,), "an integer")
    if out["seed"] is not None and out["seed"] < 0:
        raise bad_request(f"'seed' must be >= 0, got {out['seed']}", "seed", "invalid_value")
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


def from_invalid(e: InvalidRequestError) -> APIError:
    code = "context_length_exceeded" if e.param == "prompt" and "slot holds" in str(e) else "invalid_value"
    return bad_request(str(e), e.param, code)
