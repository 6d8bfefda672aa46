"""Validation of OpenAI-style request bodies for the server, and the error shape it answers with.

Every problem with a request becomes an `APIError` (HTTP status, message, OpenAI error `type`,
the offending `param`, a `code`), rendered as `{"error": {"message", "type", "param", "code"}}`,
the body the official clients parse into BadRequestError / AuthenticationError / RateLimitError.
Parameters are type-checked and range-checked here, against the ranges the engine takes
(engine_limits: C int counts, uint64 seed), so an out-of-range value is a 400 that names the field
and its range (GenerationRequest checks them again). Unknown fields are ignored (clients send vendor
extensions), but fields the server cannot honour (n > 1, best_of, suffix, several prompts, echo with
logprobs, and the OpenAI / llama-server generation fields in UNSUPPORTED_FIELDS: other samplers,
audio, tool choice, ...) are refused with a 400 naming them rather than silently dropped;
each is accepted only with its "off" value (or null). A body must be a JSON object nested at most
MAX_JSON_DEPTH deep, without the NaN / Infinity extensions.

Logprobs: /v1/completions takes `logprobs: N` (the legacy API: N most likely alternatives per
token), /v1/chat/completions `logprobs: true` with `top_logprobs: N`; N is 0..MAX_LOGPROBS.

Constrained output (both endpoints): OpenAI's `response_format` (json_object, json_schema) or
llama-server's `json_schema` (a schema) / `grammar` (GBNF), one of them per request; compiled here
(constrained.py), so a schema or grammar that does not compile is a 400 naming its field.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from .constrained import ConstraintError, request_constraint
from .engine_limits import INT32_MAX, UINT64_MAX, check_float, check_int
from .sampling_params import normalize_logit_bias
from .scheduler import InvalidRequestError

__all__ = ["APIError", "bad_request", "from_invalid", "parse_json_body", "sampling_args", "completion_prompt",
           "stream_flags", "chat_template_kwargs", "tokenize_args", "detokenize_ids", "embeddings_args",
           "UNSUPPORTED_FIELDS", "MAX_LOGPROBS"]

# Defaults per endpoint, as bonsai_runner.Llama's create_completion / create_chat_completion.
COMPLETION_DEFAULTS = {"max_tokens": 16, "temperature": 0.8}
CHAT_DEFAULTS = {"max_tokens": None, "temperature": 0.2}
# The defaults of the other sampling fields, both endpoints.
SAMPLING_DEFAULTS = {"top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "top_k": 40, "repeat_last_n": 64,
                     "frequency_penalty": 0.0, "presence_penalty": 0.0}

MAX_JSON_DEPTH = 64  # nesting levels a request body may use (real requests use fewer than 10)
MAX_LOGPROBS = 20  # alternatives per token at most (OpenAI's limit for top_logprobs)

# The ranges of the numeric fields (all inclusive but top_p's and repeat_penalty's lower bound).
INT_RANGES = {"max_tokens": (1, INT32_MAX), "max_completion_tokens": (1, INT32_MAX), "top_k": (0, INT32_MAX),
              "repeat_last_n": (0, INT32_MAX), "seed": (0, UINT64_MAX), "logprobs": (0, MAX_LOGPROBS),
              "top_logprobs": (0, MAX_LOGPROBS)}
FLOAT_RANGES = {"temperature": (0.0, 100.0, False), "top_p": (0.0, 1.0, True), "min_p": (0.0, 1.0, False),
                "repeat_penalty": (0.0, 100.0, True), "frequency_penalty": (-2.0, 2.0, False),
                "presence_penalty": (-2.0, 2.0, False)}


class APIError(Exception):
    """An HTTP error answer; `headers` are sent with it (Retry-After on a 429)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, headers: Optional[dict] = None):
        super().__init__(message)
        self.headers = headers
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
    _refuse_unsupported(body, chat)
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
    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"):
        v = _float_field(body, name)
        out[name] = (defaults if name == "temperature" else SAMPLING_DEFAULTS)[name] if v is None else v
    for name in ("top_k", "repeat_last_n"):
        v = _int_field(body, name)
        out[name] = SAMPLING_DEFAULTS[name] if v is None else v
    out["ignore_eos"] = bool(_typed(body, "ignore_eos", (bool,), "a boolean"))
    out["seed"] = _int_field(body, "seed")
    out["logprobs"] = _chat_logprobs(body) if chat else _int_field(body, "logprobs")
    # ids are checked against the model's vocabulary when the scheduler admits the request
    out["logit_bias"] = normalize_logit_bias(body.get("logit_bias"), None,
                                             error=lambda m, name: bad_request(m, name, "invalid_value"))
    try:  # JSON mode / schema / grammar; compiled here so a bad one is a 400 naming its field
        out["constraint"] = request_constraint(body.get("response_format"), body.get("grammar"),
                                               body.get("json_schema"))
    except ConstraintError as e:
        raise bad_request(str(e), e.param, "invalid_value") from None
    return out


def _chat_logprobs(body: dict) -> Optional[int]:
    """The number of alternatives per token of a chat request (None: no logprobs)."""
    on = _typed(body, "logprobs", (bool,), "a boolean")
    top = _int_field(body, "top_logprobs")
    if top is not None and not on:
        raise bad_request("'top_logprobs' needs 'logprobs': true; send both, or omit top_logprobs",
                          "top_logprobs", "invalid_value")
    return (top or 0) if on else None


def _off(*values: Any):
    """A field accepted only as null or one of `values` (JSON values; a boolean never equals a number)."""
    def kind(x: Any) -> type:
        return float if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x)

    def neutral(v: Any) -> bool:
        return v is None or any(kind(v) is kind(x) and v == x for x in values)
    return neutral, list(values)


# Generation fields of the OpenAI API and llama-server that this server does not implement:
# name -> (endpoints, (is-off test, the accepted values), what it does, the fix). A request that
# sets one to anything but its "off" value (or null) is a 400 naming it. (logit_bias and the
# frequency / presence penalties are handled in sampling_args.)
_BOTH, _CHAT = ("completion", "chat"), ("chat",)
UNSUPPORTED_FIELDS = {
    "n_probs": (_BOTH, _off(0), "llama-server's token probabilities",
                "use logprobs (completions) or logprobs + top_logprobs (chat)"),
    "post_sampling_probs": (_BOTH, _off(False), "probabilities after the samplers", "omit it"),
    "n_predict": (_BOTH, _off(), "llama-server's token limit", "use max_tokens"),
    "n_cmpl": (_BOTH, _off(1), "several completions per request", "send one request per completion"),
    "typical_p": (_BOTH, _off(1), "locally typical sampling", "omit it or send 1"),
    "dynatemp_range": (_BOTH, _off(0), "dynamic temperature", "omit it or send 0"),
    "dynatemp_exponent": (_BOTH, _off(1), "dynamic temperature", "omit it or send 1"),
    "mirostat": (_BOTH, _off(0), "Mirostat sampling", "omit it or send 0"),
    "dry_multiplier": (_BOTH, _off(0), "DRY repetition penalty", "use repeat_penalty, or send 0"),
    "xtc_probability": (_BOTH, _off(0), "XTC sampling", "omit it or send 0"),
    "top_n_sigma": (_BOTH, _off(-1), "top-n-sigma sampling", "omit it or send -1"),
    "min_keep": (_BOTH, _off(0), "a floor on the candidates the samplers keep", "omit it or send 0"),
    "samplers": (_BOTH, _off(), "a custom sampler order", "omit it (the order is fixed)"),
    "lora": (_BOTH, _off([]), "LoRA adapters", "omit it"),
    "t_max_predict_ms": (_BOTH, _off(0), "a time limit on generation", "use max_tokens"),
    "n_indent": (_BOTH, _off(0), "an indentation stop", "omit it"),
    "return_tokens": (_BOTH, _off(False), "token ids in the response", "use POST /tokenize on the text"),
    "timings_per_token": (_BOTH, _off(False), "timings in every chunk", "omit it (see GET /metrics)"),
    "return_progress": (_BOTH, _off(False), "prompt progress chunks", "omit it"),
    "response_fields": (_BOTH, _off(), "a selection of response fields", "omit it"),
    "image_data": (_BOTH, _off([]), "images (this engine reads text only)", "omit it"),
    "multimodal_data": (_BOTH, _off([]), "images or audio (this engine reads text only)", "omit it"),
    "audio": (_CHAT, _off(), "audio output", "omit it"),
    "modalities": (_CHAT, _off(["text"]), "output modalities other than text", "omit it or send [\"text\"]"),
    "functions": (_CHAT, _off([]), "function calling (the deprecated form)", "omit it"),
    "function_call": (_CHAT, _off("none", "auto"), "forcing a function call", "omit it"),
    "reasoning_effort": (_CHAT, _off(), "reasoning effort", "pass template variables in chat_template_kwargs"),
    "verbosity": (_CHAT, _off(), "output verbosity", "omit it"),
    "web_search_options": (_CHAT, _off(), "web search", "omit it"),
    "reasoning_format": (_CHAT, _off("none"), "separating reasoning text (it stays in the content)",
                         "omit it or send \"none\""),
    "thinking_forced_open": (_CHAT, _off(False), "forcing the reasoning block open",
                             "pass template variables in chat_template_kwargs"),
}

# Variables the server itself gives the chat template; chat_template_kwargs may not replace them.
_TEMPLATE_RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                      "strftime_now", "tools")


def _refuse_unsupported(body: dict, chat: bool) -> None:
    endpoint = "chat" if chat else "completion"
    for name, (endpoints, (neutral, _), what, fix) in UNSUPPORTED_FIELDS.items():
        if endpoint in endpoints and name in body and not neutral(body[name]):
            raise bad_request(f"'{name}' ({what}) is not supported by this server; {fix}", name,
                              "unsupported_value")


def chat_template_kwargs(body: dict) -> dict:
    """The extra chat-template variables of a chat body (`chat_template_kwargs`, as llama-server)."""
    extra = _typed(body, "chat_template_kwargs", (dict,), "an object")
    if not extra:
        return {}
    clash = next((k for k in extra if k in _TEMPLATE_RESERVED), None)
    if clash is not None:
        raise bad_request(f"chat_template_kwargs may not set '{clash}' (the server sets it); remove it",
                          "chat_template_kwargs", "invalid_value")
    return dict(extra)


def tokenize_args(body: dict) -> tuple[str, bool, bool, bool]:
    """(content, add_special, parse_special, with_pieces) of a POST /tokenize body, with
    llama-server's defaults (no BOS, special-token text parsed, no pieces)."""
    content = body.get("content")
    if not isinstance(content, str):
        raise bad_request("'content' is required: the text to tokenize (a string)", "content",
                          "missing" if content is None else "invalid_type")
    flags = [_typed(body, name, (bool,), "a boolean") for name in ("add_special", "parse_special", "with_pieces")]
    add_special, parse_special, with_pieces = (bool(f) if f is not None else d
                                               for f, d in zip(flags, (False, True, False)))
    return content, add_special, parse_special, with_pieces


def detokenize_ids(body: dict, n_vocab: int) -> list[int]:
    """The token ids of a POST /detokenize body, each in [0, n_vocab)."""
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad_request("'tokens' is required: a list of token ids (integers)", "tokens",
                          "missing" if ids is None else "invalid_type")
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise bad_request(f"invalid token id {bad}: ids must be in [0, {n_vocab})", "tokens", "invalid_value")
    return ids


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
