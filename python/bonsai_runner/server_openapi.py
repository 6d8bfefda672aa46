"""The OpenAPI 3 document of the server (GET /openapi.json), written by hand.

It describes the routes, the request bodies and the responses of bonsai_runner.server, so that
clients and fuzzers (fuzz/server/run_schemathesis.py runs schemathesis against it) know what the
server takes. The handlers' own checks (server_requests) stay the authority: the numeric ranges
here are the same tables (server_requests.INT_RANGES / FLOAT_RANGES), and every error answers with
the one shape `{"error": {"message", "type", "param", "code"}}`. Bodies are open objects: clients
send vendor extensions, and the server ignores fields it does not know; the OpenAI / llama-server
fields it refuses (server_requests.UNSUPPORTED_FIELDS) are listed with the only values it accepts.
"""

from __future__ import annotations

from typing import Any

from .server_requests import ENCODING_FORMATS, FLOAT_RANGES, INT_RANGES, UNSUPPORTED_FIELDS

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
        "frequency_penalty": _float_field("frequency_penalty", "minus X times a token's count in the last "
                                          "repeat_last_n tokens; 0 = off"),
        "presence_penalty": _float_field("presence_penalty", "minus X for a token seen in the last repeat_last_n "
                                         "tokens; 0 = off"),
        "logit_bias": {"type": "object", "nullable": True,
                       "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
                       "description": "token id (decimal string) -> bias added to its logit; -100 bans it"},
        "response_format": {"type": "object", "nullable": True,
                            "description": "text (default), json_object (any JSON object, or the one its "
                                           "optional schema describes) or json_schema (OpenAI's "
                                           "{name, schema, strict}): the output is constrained to it",
                            "properties": {"type": {"type": "string",
                                                    "enum": ["text", "json_object", "json_schema"]},
                                           "schema": {"type": "object"},
                                           "json_schema": {"type": "object", "required": ["schema"],
                                                           "properties": {"name": {"type": "string"},
                                                                          "schema": {"type": "object"},
                                                                          "strict": {"type": "boolean",
                                                                                     "nullable": True}}}}},
        "json_schema": {"type": "object", "nullable": True,
                        "description": "llama-server's field: a JSON schema the output must match"},
        "grammar": {"type": "string", "nullable": True,
                    "description": "a GBNF grammar (llama.cpp's format) the output must match; \"\" = none"},
    }
    if chat:
        props["max_completion_tokens"] = _int_field("max_completion_tokens", "the same as max_tokens")
        props["logprobs"] = {"type": "boolean", "nullable": True, "description": "return each token's logprob"}
        props["top_logprobs"] = _int_field("top_logprobs", "alternatives per token (needs logprobs: true)")
        props["chat_template_kwargs"] = {"type": "object", "nullable": True,
                                         "description": "extra variables for the chat template"}
    else:
        props["best_of"] = {"type": "integer", "enum": [1], "nullable": True}
        props["echo"] = {"type": "boolean", "nullable": True, "description": "prepend the prompt to the text"}
        props["logprobs"] = _int_field("logprobs", "return each token's logprob and this many alternatives "
                                       "(not with echo)")
    endpoint = "chat" if chat else "completion"
    for name, (endpoints, (_, values), what, _fix) in UNSUPPORTED_FIELDS.items():
        if endpoint in endpoints:
            only = ", ".join(repr(v) for v in values)
            props[name] = {"nullable": True, "description": f"unsupported ({what}): only null"
                           + (f" or {only}" if values else "")}
            if values:
                props[name]["enum"] = values
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
                           "tools": {"type": "array", "nullable": True, "items": {"type": "object"},
                                     "description": "OpenAI function tools (tool_calls.py)"},
                           "tool_choice": {"nullable": True, "description": "auto, none, required or "
                                                                             "{type: function, function: {name}}",
                                           "oneOf": [{"type": "string", "enum": ["auto", "none", "required"]},
                                                     {"type": "object"}]},
                           "parallel_tool_calls": {"type": "boolean", "nullable": True,
                                                   "description": "a forced call may be several calls "
                                                                  "(default false)"},
                           "parse_tool_calls": {"type": "boolean", "nullable": True,
                                                "description": "false: tool calls stay in the content"},
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
    legacy_logprobs = {"type": "object", "nullable": True,
                       "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
                       "properties": {"tokens": {"type": "array", "items": {"type": "string"}},
                                      "token_logprobs": {"type": "array", "items": {"type": "number"}},
                                      "top_logprobs": {"type": "array", "items": {
                                          "type": "object", "additionalProperties": {"type": "number"}}},
                                      "text_offset": {"type": "array", "items": {"type": "integer"}}}}
    token_lp = {"type": "object", "required": ["token", "logprob", "bytes"],
                "properties": {"token": {"type": "string"}, "logprob": {"type": "number"},
                               "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                    "maximum": 255}}}}
    chat_logprobs = {"type": "object", "nullable": True, "required": ["content"],
                     "properties": {"content": {"type": "array", "items": {
                         "allOf": [token_lp, {"type": "object", "required": ["top_logprobs"],
                                              "properties": {"top_logprobs": {"type": "array",
                                                                              "items": token_lp}}}]}}}}
    model = {"type": "object", "required": ["id", "object", "created", "owned_by"],
             "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                            "created": {"type": "integer"}, "owned_by": {"type": "string"}}}
    count = {"type": "integer", "minimum": 0}
    tool_call = {"type": "object", "required": ["id", "type", "function"],
                 "properties": {"id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
                                "function": {"type": "object", "required": ["name", "arguments"],
                                             "properties": {"name": {"type": "string"},
                                                            "arguments": {"type": "string"}}}}}
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
                                                         "logprobs": legacy_logprobs,
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
                                                                  "content": {"type": "string", "nullable": True},
                                                                  "tool_calls": {"type": "array",
                                                                                 "items": tool_call}}},
                                                  "logprobs": chat_logprobs,
                                                  "finish_reason": {"type": "string",
                                                                    "enum": ["stop", "length", "tool_calls"]}}}},
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
                                  "data": {"type": "array", "items": _ref("Model")}}},
        "Model": model,
        "TokenizeRequest": {"type": "object", "required": ["content"],
                            "properties": {"content": {"type": "string", "description": "the text"},
                                           "add_special": {"type": "boolean", "nullable": True,
                                                           "description": "add BOS etc. as the model does "
                                                                          "(default false)"},
                                           "parse_special": {"type": "boolean", "nullable": True,
                                                             "description": "special-token text becomes its token "
                                                                            "(default true)"},
                                           "with_pieces": {"type": "boolean", "nullable": True,
                                                           "description": "return {id, piece} objects"}}},
        "Tokens": {"type": "object", "required": ["tokens"],
                   "properties": {"tokens": {"type": "array", "items": {"oneOf": [
                       {"type": "integer", "minimum": 0},
                       {"type": "object", "required": ["id", "piece"],
                        "properties": {"id": {"type": "integer", "minimum": 0},
                                       "piece": {"oneOf": [{"type": "string"},
                                                           {"type": "array", "items": {"type": "integer"}}]}}}]}}}},
        "DetokenizeRequest": {"type": "object", "required": ["tokens"],
                              "properties": {"tokens": {"type": "array", "items": {
                                  "type": "integer", "minimum": 0, "maximum": max(n_vocab - 1, 0)}}}},
        "Content": {"type": "object", "required": ["content"], "properties": {"content": {"type": "string"}}},
        "Props": {"type": "object",
                  "required": ["default_generation_settings", "total_slots", "model_path", "chat_template",
                               "build_info"],
                  "properties": {"default_generation_settings": {
                                     "type": "object", "required": ["n_ctx", "params"],
                                     "properties": {"n_ctx": count, "params": {"type": "object"}}},
                                 "total_slots": count, "model_path": {"type": "string"},
                                 "model_alias": {"type": "string"}, "chat_template": {"type": "string"},
                                 "bos_token": {"type": "string"}, "eos_token": {"type": "string"},
                                 "modalities": {"type": "object"}, "build_info": {"type": "string"},
                                 "n_vocab": count}},
        "Slots": {"type": "array", "items": {
            "type": "object", "required": ["id", "n_ctx", "is_processing", "n_cached_tokens"],
            "properties": {"id": count, "n_ctx": count, "is_processing": {"type": "boolean"},
                           "n_cached_tokens": count, "id_task": count, "n_prompt_tokens": count,
                           "n_prompt_tokens_cached": count, "n_prompt_tokens_pending": count,
                           "n_decoded": count}}},
        "Health": {"type": "object", "required": ["status", "slots_idle", "slots_processing", "queue_depth"],
                   "properties": {"status": {"type": "string", "enum": ["ok", "closed", "stopped", "stalled"]},
                                  "slots_idle": {"type": "integer"}, "slots_processing": {"type": "integer"},
                                  "queue_depth": {"type": "integer"},
                                  "error": {"type": "object"}}},
    }


def _errors(*statuses: int) -> dict:
    what = {400: "invalid request (the message names the field and the fix)", 401: "wrong or missing API key",
            404: "no such model", 413: "request body larger than --max-body",
            429: "the queue is full; retry after the Retry-After header's seconds",
            500: "this request failed inside the engine (its slot is freed)",
            503: "the scheduler is stopped, stalled or shutting down"}
    out = {str(s): {"description": what[s], "content": {"application/json": {"schema": _ref("Error")}}}
           for s in statuses}
    if "429" in out:
        out["429"]["headers"] = {"Retry-After": {
            "description": "seconds: the mean time a slot took per request / the number of slots, 1..60",
            "schema": {"type": "integer", "minimum": 1, "maximum": 60}}}
    return out


def _json(schema: str, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _post(request: str, response: str, summary: str, key_errors: tuple) -> dict:
    return {"post": {"summary": summary,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
                     "responses": {"200": _json(response, summary), **_errors(400, 413, *key_errors)}}}


def _get(response: str, summary: str, key_errors: tuple) -> dict:
    return {"get": {"summary": summary, "responses": {"200": _json(response, summary), **_errors(*key_errors)}}}


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
            "/v1/models": _get("Models", "the served model", v1_errors),
            "/v1/models/{model_id}": {"get": {
                "summary": "one model by id",
                "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": _json("Model", "the model"), **_errors(404, *v1_errors)}}},
            "/tokenize": _post("TokenizeRequest", "Tokens", "text to token ids (llama-server)", v1_errors),
            "/detokenize": _post("DetokenizeRequest", "Content", "token ids to text (llama-server)", v1_errors),
            "/props": _get("Props", "server and model properties (llama-server)", v1_errors),
            "/slots": _get("Slots", "the state of each parallel sequence slot (llama-server)", v1_errors),
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
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models",
                     "/v1/models/{model_id}", "/tokenize", "/detokenize", "/props", "/slots"):
            for op in doc["paths"][path].values():
                op["security"] = [{"bearer": []}]
    return doc
