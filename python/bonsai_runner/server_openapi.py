"""The OpenAPI 3 document of the server (GET /openapi.json), written by hand.

It describes the routes, the request bodies and the responses of bonsai_runner.server, so that
clients and fuzzers (fuzz/server/run_schemathesis.py runs schemathesis against it) know what the
server takes. The handlers' own checks (server_requests) stay the authority: the numeric ranges
here are the same tables (server_requests.INT_RANGES / FLOAT_RANGES), and every error answers with
the one shape `{"error": {"message", "type", "param", "code"}}`. Bodies are open objects: clients
send vendor extensions, and the server ignores fields it does not know.
"""

from __future__ import annotations

from typing import Any

from .server_requests import ENCODING_FORMATS, FLOAT_RANGES, INT_RANGES

__all__ = ["openapi_document"]


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _int_field(name: str, description: str) -> dict:
    lo, hi = INT_RANGES[name]
    return {"type": "integer", "minimum": lo, "maximum": hi, "nullable": True, "description": description}


def _float_field(name: str, description: str) -> dict:
    lo, hi, lo_open = FLOAT_RANGES[name]
    out: dict[str, Any] = {"type": "number", "minimum": lo, "maximum": hi, "nullable": True,
                           "description": description}
    if lo_open:
        out["exclusiveMinimum"] = True
    return out


def _sampling_properties(chat: bool) -> dict:
    props = {
        "model": {"type": "string", "nullable": True, "description": "ignored: the server serves one model"},
        "max_tokens": _int_field("max_tokens", "tokens to generate at most (omitted: 16 for completions, "
                                 "until the end of text for chat)"),
        "temperature": _float_field("temperature", "0 = greedy"),
        "top_p": _float_field("top_p", "nucleus sampling mass"),
        "min_p": _float_field("min_p", "minimum probability relative to the most likely token"),
        "top_k": _int_field("top_k", "0 = off"),
        "repeat_penalty": _float_field("repeat_penalty", "1 = off"),
        "repeat_last_n": _int_field("repeat_last_n", "tokens the repeat penalty looks back on"),
        "seed": _int_field("seed", "seed of the request's sampler"),
        "stop": {"nullable": True, "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                 "description": "stop strings (not included in the text)"},
        "stream": {"type": "boolean", "nullable": True, "description": "server-sent events"},
        "stream_options": {"type": "object", "nullable": True,
                           "properties": {"include_usage": {"type": "boolean", "nullable": True}}},
        "ignore_eos": {"type": "boolean", "nullable": True,
                       "description": "never sample an end-of-generation token"},
        "n": {"type": "integer", "enum": [1], "nullable": True, "description": "one choice per request"},
        "frequency_penalty": {"type": "number", "enum": [0], "nullable": True, "description": "unsupported"},
        "presence_penalty": {"type": "number", "enum": [0], "nullable": True, "description": "unsupported"},
        "response_format": {"type": "object", "nullable": True,
                            "properties": {"type": {"type": "string", "enum": ["text"]}}},
    }
    if chat:
        props["max_completion_tokens"] = _int_field("max_completion_tokens", "the same as max_tokens")
    else:
        props["best_of"] = {"type": "integer", "enum": [1], "nullable": True}
        props["echo"] = {"type": "boolean", "nullable": True, "description": "prepend the prompt to the text"}
    return props


def _completion_request(n_vocab: int) -> dict:
    token_ids = {"type": "array", "minItems": 1,
                 "items": {"type": "integer", "minimum": 0, "maximum": max(n_vocab - 1, 0)}}
    return {
        "type": "object", "required": ["prompt"],
        "properties": {
            "prompt": {"description": "one prompt: text, token ids, or a list holding one of them",
                       "oneOf": [{"type": "string", "minLength": 1}, token_ids,
                                 {"type": "array", "minItems": 1, "maxItems": 1,
                                  "items": {"oneOf": [{"type": "string", "minLength": 1}, token_ids]}}]},
            **_sampling_properties(chat=False),
        },
    }


def _chat_request() -> dict:
    part = {"type": "object", "properties": {"type": {"type": "string"}, "text": {"type": "string"}}}
    message = {"type": "object", "required": ["role"],
               "properties": {"role": {"type": "string", "minLength": 1,
                                       "description": "system, user, assistant or tool"},
                              "content": {"nullable": True,
                                          "oneOf": [{"type": "string"}, {"type": "array", "items": part}]}}}
    return {"type": "object", "required": ["messages"],
            "properties": {"messages": {"type": "array", "minItems": 1, "items": message},
                           "tools": {"type": "array", "nullable": True, "items": {"type": "object"}},
                           **_sampling_properties(chat=True)}}


def _embedding_request(n_vocab: int) -> dict:
    token_ids = {"type": "array", "minItems": 1,
                 "items": {"type": "integer", "minimum": 0, "maximum": max(n_vocab - 1, 0)}}
    return {"type": "object", "required": ["input"],
            "properties": {
                "input": {"description": "one input (text or token ids) or several (a list of either)",
                          "oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}},
                                    token_ids, {"type": "array", "minItems": 1, "items": token_ids}]},
                "model": {"type": "string", "nullable": True, "description": "ignored: the server serves one model"},
                "encoding_format": {"type": "string", "enum": list(ENCODING_FORMATS), "nullable": True,
                                    "description": "float (default) or base64 (little-endian float32 bytes)"},
                "dimensions": {"type": "integer", "nullable": True,
                               "description": "must equal the model's embedding width (vectors are not shortened)"},
                "user": {"type": "string", "nullable": True, "description": "ignored"}}}


def _schemas(n_vocab: int) -> dict:
    usage = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
             "properties": {k: {"type": "integer", "minimum": 0}
                            for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
    finish = {"type": "string", "enum": ["stop", "length"]}
    head = {"id": {"type": "string"}, "created": {"type": "integer"}, "model": {"type": "string"}}
    return {
        "CompletionRequest": _completion_request(n_vocab),
        "ChatCompletionRequest": _chat_request(),
        "Error": {"type": "object", "required": ["error"],
                  "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"],
                                           "properties": {"message": {"type": "string"},
                                                          "type": {"type": "string"},
                                                          "param": {"type": "string", "nullable": True},
                                                          "code": {"type": "string", "nullable": True}}}}},
        "Usage": usage,
        # One event of a stream: `data` is a chunk (or an Error) as JSON text, or "[DONE]" at the end.
        "ServerSentEvent": {"type": "object", "required": ["data"],
                            "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                                           "id": {"type": "string"}}},
        "Completion": {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                       "properties": {**head, "object": {"type": "string", "enum": ["text_completion"]},
                                      "choices": {"type": "array", "minItems": 1, "items": {
                                          "type": "object", "required": ["text", "index", "finish_reason"],
                                          "properties": {"text": {"type": "string"}, "index": {"type": "integer"},
                                                         "finish_reason": finish}}},
                                      "usage": _ref("Usage")}},
        "ChatCompletion": {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                           "properties": {**head, "object": {"type": "string", "enum": ["chat.completion"]},
                                          "choices": {"type": "array", "minItems": 1, "items": {
                                              "type": "object", "required": ["index", "message", "finish_reason"],
                                              "properties": {
                                                  "index": {"type": "integer"},
                                                  "message": {"type": "object", "required": ["role", "content"],
                                                              "properties": {
                                                                  "role": {"type": "string", "enum": ["assistant"]},
                                                                  "content": {"type": "string"}}},
                                                  "finish_reason": finish}}},
                                          "usage": _ref("Usage")}},
        "EmbeddingRequest": _embedding_request(n_vocab),
        "EmbeddingList": {"type": "object", "required": ["object", "data", "model", "usage"],
                          "properties": {"object": {"type": "string", "enum": ["list"]},
                                         "data": {"type": "array", "minItems": 1, "items": {
                                             "type": "object", "required": ["object", "embedding", "index"],
                                             "properties": {"object": {"type": "string", "enum": ["embedding"]},
                                                            "embedding": {"oneOf": [
                                                                {"type": "array", "items": {"type": "number"}},
                                                                {"type": "string"}]},
                                                            "index": {"type": "integer", "minimum": 0}}}},
                                         "model": {"type": "string"},
                                         "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                                                   "properties": {k: {"type": "integer", "minimum": 0}
                                                                  for k in ("prompt_tokens", "total_tokens")}}}},
        "Models": {"type": "object", "required": ["object", "data"],
                   "properties": {"object": {"type": "string", "enum": ["list"]},
                                  "data": {"type": "array", "items": {
                                      "type": "object", "required": ["id", "object", "created", "owned_by"],
                                      "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                                                     "created": {"type": "integer"},
                                                     "owned_by": {"type": "string"}}}}}},
        "Health": {"type": "object", "required": ["status", "slots_idle", "slots_processing", "queue_depth"],
                   "properties": {"status": {"type": "string", "enum": ["ok", "closed", "stopped", "stalled"]},
                                  "slots_idle": {"type": "integer"}, "slots_processing": {"type": "integer"},
                                  "queue_depth": {"type": "integer"},
                                  "error": {"type": "object"}}},
    }


def _errors(*statuses: int) -> dict:
    what = {400: "invalid request (the message names the field and the fix)", 401: "wrong or missing API key",
            413: "request body larger than --max-body", 429: "the queue is full; retry later",
            500: "this request failed inside the engine (its slot is freed)",
            503: "the scheduler is stopped, stalled or shutting down"}
    return {str(s): {"description": what[s], "content": {"application/json": {"schema": _ref("Error")}}}
            for s in statuses}


def _generation(request: str, response: str, summary: str, api_key: bool) -> dict:
    errors = (400, 401, 413, 429, 500, 503) if api_key else (400, 413, 429, 500, 503)
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {"200": {"description": "the result, or server-sent events ending with `data: [DONE]` "
                                             "when stream is true",
                              "content": {"application/json": {"schema": _ref(response)},
                                          "text/event-stream": {"schema": _ref("ServerSentEvent")}}},
                      **_errors(*errors)}}}


def openapi_document(*, max_body: int, api_key: bool, n_vocab: int = 1 << 31) -> dict:
    """The document for a server refusing bodies over `max_body` bytes, requiring a Bearer key on
    /v1 when `api_key`, serving a vocabulary of `n_vocab` tokens."""
    v1_errors = (401,) if api_key else ()
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "bonsai-runner", "version": "1",
                 "description": "OpenAI-compatible completions over a continuous-batching scheduler. Request "
                                f"bodies are at most {max_body} bytes (413 above)."},
        "paths": {
            "/v1/completions": _generation("CompletionRequest", "Completion", "text completion", api_key),
            "/v1/chat/completions": _generation("ChatCompletionRequest", "ChatCompletion", "chat completion",
                                                api_key),
            "/v1/embeddings": {"post": {
                "summary": "embeddings: the final hidden state after output_norm, pooled (--pooling), L2-normalized",
                "requestBody": {"required": True,
                                "content": {"application/json": {"schema": _ref("EmbeddingRequest")}}},
                "responses": {"200": {"description": "one embedding per input, in input order",
                                      "content": {"application/json": {"schema": _ref("EmbeddingList")}}},
                              **_errors(*((400, 401, 413, 500, 503) if api_key else (400, 413, 500, 503)))}}},
            "/v1/models": {"get": {"summary": "the served model",
                                   "responses": {"200": {"description": "one model",
                                                         "content": {"application/json": {
                                                             "schema": _ref("Models")}}},
                                                 **_errors(*v1_errors)}}},
            "/health": {"get": {"summary": "liveness of the scheduler",
                                "responses": {"200": {"description": "serving",
                                                      "content": {"application/json": {"schema": _ref("Health")}}},
                                              "503": {"description": "the scheduler is stopped, stalled or closing",
                                                      "content": {"application/json": {
                                                          "schema": _ref("Health")}}}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "text exposition format",
                                                       "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        },
        "components": {"schemas": _schemas(n_vocab)},
    }
    if api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models"):
            for op in doc["paths"][path].values():
                op["security"] = [{"bearer": []}]
    return doc
