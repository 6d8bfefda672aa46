"""OpenAI-compatible HTTP server over the continuous-batching scheduler (FastAPI + uvicorn).

Routes: POST /v1/completions, POST /v1/chat/completions (JSON, or server-sent events ending with
`data: [DONE]` when "stream": true; logprobs as server_logprobs describes), POST /v1/embeddings,
GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics (Prometheus text), and llama-server's
POST /tokenize, POST /detokenize, GET /props and GET /slots. With an API key, every route but
/health, /metrics and /openapi.json needs it.

CORS (`cors_origins`): Starlette's CORSMiddleware answers preflights and adds the
Access-Control-* headers for the listed origins ("*": any); off by default. Access log
(`access_log`, on by default): one line per request on the `bonsai_runner.server` logger at INFO
(run_server prints it on stderr): method, path, status, the prompt and completion tokens of a
request that generated (and how it finished), and the wall time in ms; a streamed response is
logged when its stream ends, a failed one with its error status.

Embeddings are always served, beside generation (no --embeddings switch as llama-server needs): a
request runs in a worker thread on a context of its own (one sequence of --ctx-size cells, created
at the first embeddings request and kept), so it never touches the slots' KV cache; embeddings
requests run one at a time. Pooling: --pooling, else the file's pooling_type; as llama-server's
/v1/embeddings, pooling none (the default of a generative model) is refused with 400. Vectors are
L2-normalized; `encoding_format` "base64" sends their little-endian float32 bytes. Input text is
tokenized as completion prompts are (BOS as the vocabulary asks, special-token text parsed).

One `ServingEngine` owns the model and the `Scheduler`; the scheduler thread calls each request's
event callback, which hands the event to the asyncio loop (`call_soon_threadsafe`), so handlers
only await queues and never block the loop. A client that goes away cancels its request: a
streaming response is cancelled by Starlette when the connection closes (the generator's `finally`
cancels the request), a non-streaming one polls `is_disconnected()` while it waits. Cancellation
frees the slot and its KV cache before the next engine step.

The server survives every request. Every failure answers with an OpenAI-style error body
(server_requests.APIError): malformed JSON, JSON nested too deep, wrong field types, out-of-range
numbers (the engine's ranges), unsupported options and prompts longer than a slot are 400, a wrong
or missing API key 401, a body over `max_body` bytes 413 (checked on Content-Length and while a
chunked body is read), a full queue 429 (with a Retry-After header, QueueFullError.retry_after),
an unknown route or model id 404, a request the scheduler failed 500 (that request alone: its slot
is freed), a stopped or stalled scheduler 503 (/health too). Body parsing, validation, chat
rendering and tokenization run in worker threads (tokenization through a `_core.Vocab`, which
releases the GIL), so a large prompt never holds up the event loop; a prompt with more bytes than
a slot's tokens could ever hold is refused before it is tokenized.
Response bodies are completion_format's shapes. GET /openapi.json describes the routes
(server_openapi); the handlers' own checks stay the authority.

Shutdown (SIGTERM / SIGINT): the listening socket closes, in-flight requests get `shutdown_timeout`
seconds to finish, then uvicorn cancels them (which cancels their scheduler requests) and exits,
also while a streaming client stays connected.

`python -m bonsai_runner.server --model m.gguf` and `bonsai serve --model m.gguf` take the options
of commands/serve.py.
"""
# No `from __future__ import annotations` here: FastAPI reads the handlers' annotations at runtime.

import asyncio
import json
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

from . import __version__
from . import completion_format as fmt
from . import embeddings as emb
from .chat_template import ChatTemplate
from .constrained import ConstraintError
from .errors import BonsaiError, check_model_file
from .scheduler import (GenerationRequest, InvalidRequestError, QueueFullError, Scheduler,
                        SchedulerUnavailableError, StreamEvent)
from .server_logprobs import LogprobFormatter, chat_logprobs
from .server_requests import (COMPLETION_DEFAULTS, SAMPLING_DEFAULTS, APIError, bad_request, chat_template_kwargs,
                              completion_prompt, detokenize_ids, embeddings_args, from_invalid, parse_json_body,
                              sampling_args, stream_flags, tokenize_args)
from .tool_calls import ChunkFilter, ToolCallError, ToolPlan, apply_to_response, plan_tools
from .vocab_facts import adds_bos, end_of_generation_ids, special_token_id, token_text

__all__ = ["ServingEngine", "create_app", "run_server", "bind_socket", "main", "DEFAULT_MAX_BODY",
           "DEFAULT_SHUTDOWN_TIMEOUT"]

_DISCONNECT_POLL_S = 0.25  # how often a non-streaming handler checks that its client is still there
DEFAULT_MAX_BODY = 4 << 20  # bytes of a request body (--max-body)
DEFAULT_SHUTDOWN_TIMEOUT = 10.0  # seconds in-flight requests get after SIGTERM (--shutdown-timeout)
log = logging.getLogger("bonsai_runner.server")


class ServingEngine:
    """The model, its tokenization and chat template, and the scheduler that serves it."""

    def __init__(self, model_path: str, *, n_parallel: int = 4, n_ctx_slot: int = 2048, n_batch: int = 512,
                 n_threads: int = 0, cache_prompt: bool = True, queue_limit: int = 64,
                 chat_template: Optional[str] = None, model_alias: Optional[str] = None, n_gpu_layers: int = 0,
                 type_k: str = "f16", type_v: str = "f16", flash_attn: bool = False, verbose: bool = False,
                 fault_injection: bool = False, stall_timeout: float = 120.0, pooling: Optional[str] = None):
        from . import _core

        check_model_file(model_path)
        self.model_path = model_path
        self.model_id = model_alias or os.path.basename(model_path)
        self.created = int(time.time())
        self._model = _core.Model(model_path, n_gpu_layers=n_gpu_layers, verbose=verbose)
        try:
            self._setup_embeddings(_core, pooling, dict(n_ctx=n_ctx_slot, n_batch=min(n_batch, n_ctx_slot),
                                                        n_threads=n_threads, type_k=type_k, type_v=type_v,
                                                        flash_attn=flash_attn))
            self._setup(_core, model_path, chat_template, n_parallel=n_parallel, n_ctx_slot=n_ctx_slot,
                        n_batch=n_batch, n_threads=n_threads, cache_prompt=cache_prompt, queue_limit=queue_limit,
                        type_k=type_k, type_v=type_v, flash_attn=flash_attn, fault_injection=fault_injection,
                        stall_timeout=stall_timeout)
        except BaseException:
            self._model.close()
            raise

    def _setup(self, _core, model_path: str, chat_template: Optional[str], **scheduler_args) -> None:
        self.metadata = dict(self._model.metadata)
        self.n_vocab = int(self._model.n_vocab)
        # The file's tokenizer once more, as a _core.Vocab: its tokenize releases the GIL (Model's does
        # not), so a long prompt tokenized in a worker thread leaves the event loop running.
        self._vocab = _core.Vocab.from_gguf(model_path)
        if int(self._vocab.n_vocab) != self.n_vocab:
            raise BonsaiError(f"{model_path}: the tokenizer has {self._vocab.n_vocab} tokens but the model "
                              f"{self.n_vocab}")
        # No token covers more prompt bytes than its longest piece (special tokens: their text).
        longest = max((len(self._vocab.token_to_piece(i, True)) for i in range(self.n_vocab)), default=1)
        self._add_bos = adds_bos(self._model)
        self._bos = int(self._model.bos)
        def piece(t: int) -> bytes:
            return bytes(self._model.token_to_piece(int(t)))

        bos_text = token_text(self.metadata, self._bos, piece)
        eos_text = token_text(self.metadata, int(self._model.eos), piece)
        if chat_template:
            self.chat = ChatTemplate(chat_template, bos_token=bos_text, eos_token=eos_text)
        else:
            self.chat = ChatTemplate.from_metadata(self.metadata, bos_token=bos_text, eos_token=eos_text)
        eog = end_of_generation_ids(_core, self._model, self.metadata, self.n_vocab, False)
        self.scheduler = Scheduler(self._model, eog_ids=eog, **scheduler_args)
        self.fault_injection = self.scheduler.fault_injection
        self._max_prompt_bytes = 2 * max(longest, 8) * self.scheduler.n_ctx_slot
        self._pieces: dict[int, bytes] = {}

    def piece(self, token: int) -> bytes:
        """The bytes of a token, as the completion text has them."""
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = bytes(self._model.token_to_piece(int(token)))
        return p

    def tokenize(self, text: str, add_special: bool, parse_special: bool, with_pieces: bool) -> list:
        """POST /tokenize: ids, or with_pieces [{"id", "piece"}] (the piece a string when its bytes
        are valid UTF-8, else the list of bytes, as llama-server)."""
        tokens = [int(t) for t in self._vocab.tokenize(_utf8(text, "content"), add_special=add_special,
                                                        parse_special=parse_special)]
        if not with_pieces:
            return tokens
        out = []
        for t in tokens:
            b = bytes(self._vocab.token_to_piece(t, True))
            try:
                piece: Any = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)
            out.append({"id": t, "piece": piece})
        return out

    def detokenize(self, tokens: list[int]) -> str:
        """POST /detokenize: the text of `tokens`, special tokens as their text; bytes that are not
        valid UTF-8 become U+FFFD."""
        return bytes(self._vocab.detokenize(tokens, True)).decode("utf-8", errors="replace")

    def _setup_embeddings(self, _core, pooling: Optional[str], context_args: dict) -> None:
        self._core = _core
        self.n_embd = int(self._model.n_embd)
        self._embd_args = context_args
        self._embd_ctx = None  # created by the first embeddings request
        self._embd_lock = threading.Lock()
        self._pooling_error: Optional[str] = None
        try:
            self.pooling = emb.resolve_pooling(pooling, lambda: self._model.pooling_type, BonsaiError)
        except BonsaiError as e:
            if pooling is not None:
                raise BonsaiError(f"--pooling: {e}") from None
            self.pooling, self._pooling_error = None, str(e)  # generation still works; embeddings say why not
        if self.pooling == "none":
            self._pooling_error = ("pooling type 'none' is not OpenAI compatible (one vector per token); start the "
                                   "server with --pooling last, mean or cls")

    def close(self) -> None:
        self.scheduler.close()
        with self._embd_lock:
            if self._embd_ctx is not None:
                self._embd_ctx.close()
        self._model.close()

    def embeddings(self, raw: bytes) -> dict:
        """Parses, validates, tokenizes and embeds a /v1/embeddings body (worker thread; blocking)."""
        body = parse_json_body(raw)
        value, encoding = embeddings_args(body, self.n_embd)
        if self._pooling_error is not None:
            raise bad_request(self._pooling_error, None, "unsupported_value")
        n_ctx = self._embd_args["n_ctx"]

        def tokenize(text: str) -> list[int]:
            data = _utf8(text, "input")
            if len(data) > self._max_prompt_bytes:
                raise bad_request(f"an input is {len(data)} bytes, more than {n_ctx} tokens can hold; shorten it or "
                                  "start the server with a larger --ctx-size", "input", "context_length_exceeded")
            return list(self._vocab.tokenize(data, add_special=True, parse_special=True))

        def invalid(message: str) -> APIError:
            return bad_request(message, "input", "invalid_value")

        inputs, _ = emb.parse_input(value, tokenize, self.n_vocab, invalid)
        for i, tokens in enumerate(inputs):
            if len(tokens) > n_ctx:
                raise bad_request(f"input {i} has {len(tokens)} tokens, more than the {n_ctx} an embeddings request "
                                  "may hold (--ctx-size); shorten it", "input", "context_length_exceeded")
        vectors = []
        with self._embd_lock:
            if self._embd_ctx is None:
                try:
                    self._embd_ctx = self._core.Context(self._model, n_seq_max=1, **self._embd_args)
                except BonsaiError as e:
                    raise APIError(503, f"cannot create the embeddings context: {e}", "server_error", None,
                                   "unavailable") from None
            for tokens in inputs:
                rows = self._embd_ctx.embed(tokens, seq=0, pooling=self.pooling)
                vectors.append(emb.l2_normalize(rows)[0].tolist())
        return emb.embedding_list(vectors, self.model_id, sum(len(t) for t in inputs),
                                  emb.to_base64 if encoding == "base64" else None)

    def completion_tokens(self, prompt: Any) -> tuple[list[int], str]:
        """Tokens and text of a completion prompt (text: BOS as the vocabulary asks, special-token
        text parsed, as Llama does; token ids are taken as they are)."""
        if isinstance(prompt, str):
            return self._tokenize(_utf8(prompt, "prompt"), "prompt", add_special=True), prompt
        bad = next((t for t in prompt if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise bad_request(f"invalid token id {bad} in the prompt: ids must be in [0, {self.n_vocab})",
                              "prompt", "invalid_value")
        return list(prompt), bytes(self._model.detokenize(prompt)).decode("utf-8", errors="ignore")

    def special_id(self, text: str) -> Optional[int]:
        return special_token_id(self.metadata, lambda b: self._vocab.tokenize(b, add_special=False,
                                                                              parse_special=True), text)

    def chat_tokens(self, messages: Any, tools: ToolPlan, template_kwargs: Optional[dict] = None) -> list[int]:
        try:
            text = self.chat.render(tools.messages(messages), add_generation_prompt=True, text_only=True,
                                    tools=tools.template_tools(), **(template_kwargs or {}))
        except BonsaiError as e:
            raise bad_request(str(e), "messages", "invalid_value") from None
        tokens = self._tokenize(_utf8(text, "messages"), "messages", add_special=False)
        if self._add_bos and tokens[:1] != [self._bos]:
            tokens.insert(0, self._bos)
        if not tokens:
            raise bad_request("the rendered chat prompt is empty", "messages", "invalid_value")
        return tokens

    def _tokenize(self, text: bytes, param: str, add_special: bool) -> list[int]:
        if len(text) > self._max_prompt_bytes:
            raise bad_request(f"the {param} is {len(text)} bytes, more than a slot of {self.scheduler.n_ctx_slot} "
                              "tokens (prompt + completion) can hold; shorten it or start the server with a larger "
                              "--ctx-size", param, "context_length_exceeded")
        tokens = self._vocab.tokenize(text, add_special=add_special, parse_special=True)
        if len(tokens) >= self.scheduler.n_ctx_slot:  # refused here, before any per-token Python work
            raise bad_request(f"the {param} has {len(tokens)} tokens but a slot holds {self.scheduler.n_ctx_slot} "
                              "(prompt + completion); shorten it or start the server with a larger --ctx-size",
                              param, "context_length_exceeded")
        return list(tokens)

    def submit(self, tokens: list[int], args: dict, on_event) -> GenerationRequest:
        try:
            return self.scheduler.submit(GenerationRequest(tokens, on_event=on_event, **args))
        except InvalidRequestError as e:
            raise from_invalid(e) from None
        except QueueFullError as e:
            raise APIError(429, str(e), "rate_limit_exceeded", None, "queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except SchedulerUnavailableError as e:
            raise APIError(503, str(e), "server_error", None, "unavailable") from None


def _utf8(text: str, param: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"'{param}' is not valid Unicode (it holds an unpaired surrogate escape such as "
                          "\\ud800); send UTF-8 text", param, "invalid_value") from None


@dataclass
class _Job:
    """A validated, tokenized request, ready to submit."""

    tokens: list[int]
    args: dict  # GenerationRequest keyword arguments
    stream: bool
    include_usage: bool
    echo_text: str = ""  # the prompt text to echo before the completion ("" = no echo)
    text_offset: int = 0  # characters of prompt text before the completion (logprobs' text_offset)
    tools: Optional[ToolPlan] = None  # a chat request's tools (its output's tool calls are parsed)


def _fault_arg(engine: ServingEngine, body: dict, args: dict) -> None:
    """`debug_fault` is honoured only by a server started with fault injection (tests, the soak)."""
    if engine.fault_injection and body.get("debug_fault") is not None:
        args["fault"] = body["debug_fault"]


def _constraint_vocabulary(engine: ServingEngine, args: dict) -> None:
    """A constrained request builds the scheduler's token table here, in the worker thread, the first
    time (about 1 s for a 152k vocabulary), so the scheduler thread never waits for it, and checks the
grammar against it (a 400 naming the field when it cannot be used)."""
    if args.get("constraint") is not None:
        try:
            args["constraint"].check(engine.scheduler.constraint_vocabulary())
        except ConstraintError as e:
            raise bad_request(str(e), e.param, "invalid_value") from None


def _completion_job(engine: ServingEngine, raw: bytes) -> _Job:
    """Parses, validates and tokenizes a /v1/completions body (CPU work: runs in a worker thread)."""
    body = parse_json_body(raw)
    stream, include_usage = stream_flags(body)
    args = sampling_args(body, chat=False)
    prompt = completion_prompt(body)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise bad_request("'echo' must be a boolean", "echo", "invalid_type")
    if body.get("suffix"):
        raise bad_request("suffix (fill-in-the-middle) is not supported by the server", "suffix",
                          "unsupported_value")
    if echo and args["logprobs"] is not None:
        raise bad_request("logprobs with echo (the prompt's logprobs) are not supported by the server; "
                          "send echo or logprobs, not both", "logprobs", "unsupported_value")
    _fault_arg(engine, body, args)
    _constraint_vocabulary(engine, args)
    tokens, prompt_text = engine.completion_tokens(prompt)
    return _Job(tokens, args, stream, include_usage, prompt_text if echo else "", len(prompt_text))


def _chat_job(engine: ServingEngine, raw: bytes) -> _Job:
    """Parses, validates, renders and tokenizes a /v1/chat/completions body (in a worker thread)."""
    body = parse_json_body(raw)
    stream, include_usage = stream_flags(body)
    args = sampling_args(body, chat=True)
    if "messages" not in body:
        raise bad_request("'messages' is required: a list of {role, content} objects", "messages", "missing")
    try:
        plan = plan_tools(body.get("tools"), body.get("tool_choice"), engine.chat.source,
                          body.get("parallel_tool_calls"))
        if body.get("parse_tool_calls") is False:  # llama-server's switch: the calls stay in the content
            plan.parse_output = False
        if plan.forced:
            if args.get("constraint") is not None:
                raise ToolCallError(f"tool_choice forces a tool call, so it cannot be combined with "
                                    f"{args['constraint'].param}; drop one of them", "tool_choice")
            args["constraint"] = plan.constraint(engine.special_id)
    except ToolCallError as e:
        raise bad_request(str(e), e.param, "invalid_value") from None
    tokens = engine.chat_tokens(body["messages"], plan, chat_template_kwargs(body))
    stops = [] if args["stop"] is None else [args["stop"]] if isinstance(args["stop"], str) else list(args["stop"])
    if engine.chat.eos_token:
        stops.append(engine.chat.eos_token)
    args["stop"] = stops
    _fault_arg(engine, body, args)
    _constraint_vocabulary(engine, args)
    return _Job(tokens, args, stream, include_usage, tools=plan)


def _too_large(size: Optional[int], limit: int) -> APIError:
    what = f"{size} bytes" if size is not None else f"over {limit} bytes"
    return APIError(413, f"the request body is {what}, more than this server accepts ({limit} bytes, --max-body); "
                    "send a shorter prompt or start the server with a larger --max-body", "invalid_request_error",
                    None, "request_too_large")


async def _read_body(request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` bytes: from Content-Length
    before reading, and while reading a chunked (or mislabelled) body."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise bad_request(f"invalid Content-Length header {declared!r}", code="invalid_header") from None
        if n > limit:
            raise _too_large(n, limit)
    parts: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise _too_large(None, limit)
        parts.append(chunk)
    return b"".join(parts)


class _EventQueue:
    """Receives StreamEvents on the scheduler thread, delivers them on the asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()

    def __call__(self, ev: StreamEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, ev)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def events(self) -> AsyncIterator[StreamEvent]:
        while True:
            ev = await self.queue.get()
            yield ev
            if ev.finish_reason is not None:
                return


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _usage(req: GenerationRequest) -> dict:
    n = len(req.completion_tokens)
    return {"prompt_tokens": req.n_prompt, "completion_tokens": n, "total_tokens": req.n_prompt + n}


async def _collect(request, req: GenerationRequest, events: _EventQueue) -> tuple[str, str, Optional[list]]:
    """Waits for a non-streamed result, cancelling the request if the client disconnects; returns
    (text, finish reason, the TokenLogprobs or None without logprobs)."""
    parts: list[str] = []
    logprobs = None if req.logprobs is None else []
    next_check = time.monotonic() + _DISCONNECT_POLL_S
    try:
        while True:
            try:
                ev = await asyncio.wait_for(events.queue.get(), timeout=_DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                ev = None
            if time.monotonic() >= next_check:  # also while events keep coming
                next_check = time.monotonic() + _DISCONNECT_POLL_S
                if await request.is_disconnected():
                    req.cancel()
                    raise APIError(499, "the client closed the connection", "client_closed")
            if ev is None:
                continue
            if ev.finish_reason == "error":
                raise APIError(500, ev.error or "generation failed", "server_error")
            parts.append(ev.text)
            if ev.logprobs:
                logprobs.extend(ev.logprobs)
            if ev.finish_reason is not None:
                return "".join(parts), ev.finish_reason, logprobs
    finally:
        if not req.done:
            req.cancel()


def _stream(chunks: AsyncIterator[str], req: GenerationRequest):
    from fastapi.responses import StreamingResponse

    async def body():
        try:
            async for c in chunks:
                yield c
            yield "data: [DONE]\n\n"
        finally:
            if not req.done:
                req.cancel()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _metrics_text(engine: ServingEngine) -> str:
    s = engine.scheduler.stats()
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, value) -> None:
        lines.extend([f"# HELP bonsai_{name} {help_}", f"# TYPE bonsai_{name} {kind}",
                      f"bonsai_{name} {value}"])

    metric("requests_total", "counter", "Requests accepted by the scheduler.", s["requests_total"])
    metric("requests_rejected_total", "counter", "Requests refused because the queue was full.",
           s["requests_rejected_total"])
    lines += ["# HELP bonsai_requests_finished_total Requests finished, by reason.",
              "# TYPE bonsai_requests_finished_total counter"]
    for reason in ("stop", "length", "cancelled", "error"):
        lines.append(f'bonsai_requests_finished_total{{reason="{reason}"}} {s["finished"].get(reason, 0)}')
    metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", s["prompt_tokens_total"])
    metric("prompt_tokens_reused_total", "counter", "Prompt tokens served from the prefix cache.",
           s["prompt_tokens_reused_total"])
    metric("generated_tokens_total", "counter", "Completion tokens generated.", s["generated_tokens_total"])
    metric("decode_steps_total", "counter", "Engine steps (one batched decode each).", s["decode_steps_total"])
    lines += ["# HELP bonsai_time_to_first_token_seconds From submission to the first sampled token.",
              "# TYPE bonsai_time_to_first_token_seconds summary",
              f"bonsai_time_to_first_token_seconds_sum {s['first_token_seconds_sum']:.6f}",
              f"bonsai_time_to_first_token_seconds_count {s['first_token_count']}"]
    metric("queue_depth", "gauge", "Requests waiting for a slot.", s["queue_depth"])
    metric("slots_busy", "gauge", "Slots serving a request.", s["slots_busy"])
    metric("slots_total", "gauge", "Slots (--parallel).", s["slots_total"])
    metric("kv_cached_tokens", "gauge", "Tokens held in the slots' KV cache.", s["cached_tokens"])
    metric("generated_tokens_per_second", "gauge", "Completion tokens per second of engine busy time.",
           f"{s['generated_tokens_per_second']:.3f}")
    return "\n".join(lines) + "\n"


class _AccessLog:
    """ASGI middleware: one access-log line per HTTP request, written when the response has been
    sent (for a stream: when it ends), also when the application raised (logged as 500)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        note: dict = {}
        scope["bonsai.access"] = note  # handlers put their GenerationRequest here (_note_request)
        status = [0]

        async def send_and_see(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_see)
        except BaseException:
            status[0] = status[0] or 500
            raise
        finally:
            _log_access(scope, status[0], note.get("request"), time.perf_counter() - t0)


def _note_request(request, req: GenerationRequest) -> None:
    note = request.scope.get("bonsai.access")
    if note is not None:
        note["request"] = req


def _log_access(scope, status: int, req: Optional[GenerationRequest], seconds: float) -> None:
    path = scope.get("path", "")
    line = f"{scope.get('method', '-')} {path} {status or '-'}"
    if req is not None:
        line += (f" prompt_tokens={req.n_prompt} completion_tokens={len(req.completion_tokens)}"
                 f" finish={req.finish_reason or 'unfinished'}")
    log.info("%s %.1f ms", line, seconds * 1000.0)


def _props(engine: ServingEngine) -> dict:
    """GET /props: llama-server's fields that apply here, with this server's values (`params`: the
    defaults of /v1/completions; chat differs in temperature 0.2 and no token limit)."""
    sched = engine.scheduler
    params = {"n_predict": COMPLETION_DEFAULTS["max_tokens"], "temperature": COMPLETION_DEFAULTS["temperature"],
              **SAMPLING_DEFAULTS, "ignore_eos": False, "stop": [], "stream": False,
              "cache_prompt": sched.cache_prompt}
    out = {"default_generation_settings": {"n_ctx": sched.n_ctx_slot, "params": params},
           "total_slots": sched.n_parallel, "model_path": engine.model_path, "model_alias": engine.model_id,
           "chat_template": engine.chat.source, "bos_token": engine.chat.bos_token,
           "eos_token": engine.chat.eos_token, "modalities": {"vision": False, "audio": False},
           "build_info": f"bonsai-runner {__version__}", "n_vocab": engine.n_vocab}
    return {k: v for k, v in out.items() if v is not None}


def create_app(engine: ServingEngine, api_key: Optional[str] = None, max_body: int = DEFAULT_MAX_BODY,
               cors_origins: Optional[list[str]] = None, access_log: bool = True):
    """The FastAPI application serving `engine`; `api_key` (if set) is required as a Bearer token
    on every route but /health, /metrics and /openapi.json; request bodies over `max_body` bytes
    are refused with 413; `cors_origins` (a list of origins, ["*"] for any; None = no CORS) are
    allowed cross-origin requests; `access_log` logs one line per request (see the module docstring)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from .server_openapi import openapi_document

    app = FastAPI(title="bonsai-runner", docs_url=None, redoc_url=None, openapi_url=None)
    schema = openapi_document(max_body=max_body, api_key=api_key is not None, n_vocab=engine.n_vocab)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"], max_age=600)
    if access_log:
        app.add_middleware(_AccessLog)  # added last: outside CORS, so preflights are logged too

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}",
                                     kind).body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc):
        return JSONResponse(bad_request(f"invalid request: {exc.errors()}").body(), status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request, exc):
        return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error").body(),
                            status_code=500)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {api_key}":
            raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>' "
                           "with the key the server was started with (--api-key)", "invalid_request_error",
                           None, "invalid_api_key")

    @app.get("/health")
    async def health():
        h = engine.scheduler.health()  # takes no lock: answers even when the scheduler is stuck
        body = {"status": h["state"], "slots_idle": h["slots_total"] - h["slots_busy"],
                "slots_processing": h["slots_busy"], "queue_depth": h["queue_depth"]}
        if h["state"] == "ok":
            return body
        body["error"] = APIError(503, h["detail"], "server_error", None, "unavailable").body()["error"]
        return JSONResponse(body, status_code=503)

    @app.get("/openapi.json")
    async def openapi():
        return schema

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(_metrics_text(engine), media_type="text/plain; version=0.0.4")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        check_key(request)
        return await asyncio.to_thread(engine.embeddings, await _read_body(request, max_body))

    def model_card() -> dict:
        return {"id": engine.model_id, "object": "model", "created": engine.created, "owned_by": "bonsai-runner"}

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        check_key(request)
        if model_id != engine.model_id:
            raise APIError(404, f"the model '{model_id}' does not exist: this server serves '{engine.model_id}' "
                           "(GET /v1/models)", "invalid_request_error", "model", "model_not_found")
        return model_card()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        check_key(request)

        def work(raw: bytes) -> dict:
            content, add_special, parse_special, with_pieces = tokenize_args(parse_json_body(raw))
            return {"tokens": engine.tokenize(content, add_special, parse_special, with_pieces)}

        return await asyncio.to_thread(work, await _read_body(request, max_body))

    @app.post("/detokenize")
    async def detokenize(request: Request):
        check_key(request)

        def work(raw: bytes) -> dict:
            return {"content": engine.detokenize(detokenize_ids(parse_json_body(raw), engine.n_vocab))}

        return await asyncio.to_thread(work, await _read_body(request, max_body))

    @app.get("/props")
    async def props(request: Request):
        check_key(request)
        return _props(engine)

    @app.get("/slots")
    async def slots(request: Request):
        check_key(request)
        return await asyncio.to_thread(engine.scheduler.slots)  # takes the scheduler's lock

    @app.post("/v1/completions")
    async def completions(request: Request):
        check_key(request)
        job = await asyncio.to_thread(_completion_job, engine, await _read_body(request, max_body))
        stream, include_usage, echo, prompt_text = job.stream, job.include_usage, bool(job.echo_text), job.echo_text
        events = _EventQueue(asyncio.get_running_loop())
        req = engine.submit(job.tokens, job.args, events)
        _note_request(request, req)
        cid, created = fmt.new_completion_id()
        model = engine.model_id
        lp = LogprobFormatter(engine.piece, job.text_offset)
        if not stream:
            text, reason, logprobs = await _collect(request, req, events)
            return fmt.completion_response(cid, created, model, (prompt_text if echo else "") + text,
                                           lp.legacy(logprobs), reason, req.n_prompt, len(req.completion_tokens))

        async def chunks():
            if echo:
                yield _sse(fmt.completion_chunk(cid, created, model, prompt_text, None, None))
            async for ev in events.events():
                if ev.finish_reason == "error":
                    yield _sse(APIError(500, ev.error or "generation failed", "server_error").body())
                    return
                if ev.text or ev.logprobs:
                    yield _sse(fmt.completion_chunk(cid, created, model, ev.text, lp.legacy(ev.logprobs), None))
                if ev.finish_reason is not None:
                    yield _sse(fmt.completion_chunk(cid, created, model, "", None, ev.finish_reason))
            if include_usage:
                yield _sse({"id": cid, "object": "text_completion", "created": created, "model": model,
                            "choices": [], "usage": _usage(req)})

        return _stream(chunks(), req)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_key(request)
        job = await asyncio.to_thread(_chat_job, engine, await _read_body(request, max_body))
        stream, include_usage = job.stream, job.include_usage
        events = _EventQueue(asyncio.get_running_loop())
        req = engine.submit(job.tokens, job.args, events)
        _note_request(request, req)
        cid, created = fmt.new_completion_id()
        model = engine.model_id
        if not stream:
            text, reason, logprobs = await _collect(request, req, events)
            out = fmt.chat_response(fmt.completion_response(cid, created, model, text, None, reason, req.n_prompt,
                                                            len(req.completion_tokens)))
            out["choices"][0]["logprobs"] = chat_logprobs(logprobs, engine.piece)
            return apply_to_response(job.tools, out)

        tool_filter = ChunkFilter(job.tools)

        async def chunks():
            first = True
            async for ev in events.events():
                if ev.finish_reason == "error":
                    yield _sse(APIError(500, ev.error or "generation failed", "server_error").body())
                    return
                parts = []
                if ev.text or ev.logprobs:
                    parts.append((fmt.completion_chunk(cid, created, model, ev.text, None, None),
                                  chat_logprobs(ev.logprobs, engine.piece)))
                if ev.finish_reason is not None:
                    parts.append((fmt.completion_chunk(cid, created, model, "", None, ev.finish_reason), None))
                for part, logprobs in parts:
                    out = list(fmt.chat_chunks([part]))  # [role delta, this delta]
                    out[-1]["choices"][0]["logprobs"] = logprobs
                    for c in (out if first else out[1:]):
                        for filtered in tool_filter(c):
                            yield _sse(filtered)
                    first = False
            if include_usage:
                yield _sse({"id": "chat" + cid, "object": "chat.completion.chunk", "created": created,
                            "model": model, "choices": [], "usage": _usage(req)})

        return _stream(chunks(), req)

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening); any failure (port out of range or in
    use, an unknown host, no permission) is one BonsaiError that says which address and why."""
    if not 0 <= port <= 65535:
        raise BonsaiError(f"--port {port} is out of range: give a TCP port in 0..65535 (0 = any free port)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except (OSError, UnicodeError) as e:
        raise BonsaiError(f"cannot listen on {host}:{port}: unknown host ({e}); give an address such as "
                          "127.0.0.1 or 0.0.0.0") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        hint = "; stop the other server or choose another --port" if e.errno == 98 else ""
        raise BonsaiError(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}") from None
    return sock


def run_server(engine: ServingEngine, host: str = "127.0.0.1", port: int = 8080, api_key: Optional[str] = None,
               log_level: str = "warning", max_body: int = DEFAULT_MAX_BODY,
               shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT, sock: Optional[socket.socket] = None,
               cors_origins: Optional[list[str]] = None, access_log: bool = True) -> None:
    """Serves `engine` until SIGTERM / SIGINT, on `sock` (from bind_socket) or host:port. On the
    signal, in-flight requests get `shutdown_timeout` seconds, then they are cancelled. The access
    log (see create_app) goes to stderr, one line per request."""
    import uvicorn

    if sock is None:
        sock = bind_socket(host, port)
    if access_log and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    config = uvicorn.Config(create_app(engine, api_key, max_body, cors_origins, access_log), log_level=log_level,
                            access_log=False, timeout_graceful_shutdown=shutdown_timeout)
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    from .commands import serve

    parser = argparse.ArgumentParser(prog="python -m bonsai_runner.server", description=serve.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_arguments(parser)
    return serve.run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
