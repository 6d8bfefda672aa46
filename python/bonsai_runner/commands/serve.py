"""Serve a model over an OpenAI-compatible HTTP API.

Routes: /v1/completions, /v1/chat/completions (streaming with server-sent events, logprobs),
/v1/embeddings, /v1/models, /v1/models/{id}, /health, /metrics (Prometheus), and llama-server's
/tokenize, /detokenize, /props and /slots. --parallel sequences are decoded together in one batch
(continuous batching); each has --ctx-size tokens of KV cache (prompt + completion). Requests
beyond --parallel wait in a queue of --queue-limit; when it is full the server answers 429 with a
Retry-After header. --cors-origins allows browsers on other origins; an access log line per request
goes to stderr (--no-access-log turns it off).
Request bodies over --max-body are refused (413). On SIGTERM / SIGINT in-flight requests get
--shutdown-timeout seconds, then they are cancelled and the server exits. /health answers 503 when
the scheduler has stopped or made no progress for --stall-timeout seconds while it had work.
Start-up errors (a bad model file, a port in use, sizes the engine cannot hold) are one line, exit 2.

examples:
  bonsai serve --model model.gguf --port 8080 --parallel 4
  bonsai serve --model model.gguf --host 0.0.0.0 --api-key secret --ctx-size 4096
  python -m bonsai_runner.server --model model.gguf
"""

from __future__ import annotations

import argparse
import os
import sys

HELP = "serve a model over an OpenAI-compatible HTTP API (continuous batching)"


INT32_MAX = 2**31 - 1  # the engine's C int (engine_limits.INT32_MAX; not imported: `bonsai --help` stays light)


def _int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, got {v}")
        return v

    return parse


_positive = _int_in(1, INT32_MAX)
_non_negative = _int_in(0, INT32_MAX)

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
          "g": 1000**3, "gb": 1000**3, "gib": 1 << 30}


def _size(text: str) -> int:
    """Bytes: an integer with an optional unit (4MiB, 512k, 1000000)."""
    t = text.strip().lower()
    digits = len(t) - len(t.lstrip("0123456789."))
    number, unit = t[:digits], t[digits:].strip()
    try:
        v = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"expected a size such as 4MiB, 512k or 1000000, got {text!r}") from None
    if not 1 <= v <= 1 << 40:
        raise argparse.ArgumentTypeError(f"must be between 1 byte and 1 TiB, got {text!r}")
    return int(v)


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= v <= 86400:
        raise argparse.ArgumentTypeError(f"must be in 0..86400 seconds, got {text!r}")
    return v


def _origins(text: str) -> list[str]:
    """--cors-origins: `*`, or a comma-separated list of origins such as http://localhost:3000."""
    origins = [o.strip().rstrip("/") for o in text.split(",") if o.strip()]
    if not origins:
        raise argparse.ArgumentTypeError("give '*' or a comma-separated list of origins, e.g. http://localhost:3000")
    if "*" in origins:
        if len(origins) > 1:
            raise argparse.ArgumentTypeError("'*' allows every origin: give it alone, not in a list")
        return origins
    for o in origins:
        scheme, sep, host = o.partition("://")
        if not sep or scheme not in ("http", "https") or not host or "/" in host:
            raise argparse.ArgumentTypeError(f"{o!r} is not an origin: give scheme://host[:port], "
                                             "e.g. http://localhost:3000")
    return origins


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="GGUF model file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=_int_in(0, 65535), default=8080, help="TCP port, 0..65535 (default: 8080)")
    p.add_argument("-np", "--parallel", type=_int_in(1, 64), default=4,
                   help="sequences decoded together, at most 64 (default: 4)")
    p.add_argument("-c", "--ctx-size", type=_positive, default=2048,
                   help="KV cache tokens per sequence slot, prompt + completion (default: 2048)")
    p.add_argument("-b", "--batch-size", type=_positive, default=512,
                   help="tokens per engine step (generating tokens + prompt chunks; default: 512)")
    p.add_argument("--queue-limit", type=_int_in(0, 1 << 20), default=64,
                   help="requests that may wait for a slot before the server answers 429 (default: 64)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default: $BONSAI_API_KEY or none)")
    p.add_argument("--chat-template", default=None,
                   help="Jinja2 chat template: a file, or the template text itself (default: the model file's own, "
                   "else ChatML)")
    p.add_argument("-t", "--threads", type=_non_negative, default=0, help="CPU threads (default: 0 = all cores)")
    p.add_argument("--cache-prompt", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV cache of shared prompt prefixes (default: on)")
    p.add_argument("-ngl", "--n-gpu-layers", type=_int_in(-1, INT32_MAX), default=0,
                   help="layers on the GPU (CUDA builds; -1 = all)")
    p.add_argument("--cache-type-k", choices=("f16", "q8_0"), default="f16", help="K cache type (default: f16)")
    p.add_argument("--cache-type-v", choices=("f16", "q8_0"), default="f16", help="V cache type (default: f16)")
    p.add_argument("--flash-attn", action="store_true", help="one-pass (online-softmax) attention")
    p.add_argument("--pooling", choices=("none", "mean", "cls", "last"), default=None,
                   help="how /v1/embeddings pools the token vectors (default: the file's pooling_type; a generative "
                   "model has none, which /v1/embeddings refuses, as llama-server: pass last, mean or cls)")
    p.add_argument("--alias", default=None, help="model id reported by /v1/models (default: the file name)")
    p.add_argument("--verbose", action="store_true", help="print the engine's load report")
    p.add_argument("--max-body", type=_size, default=4 << 20,
                   help="largest request body in bytes, e.g. 4MiB or 512k; larger ones get 413 (default: 4MiB)")
    p.add_argument("--shutdown-timeout", type=_seconds, default=10.0,
                   help="seconds in-flight requests get to finish after SIGTERM/SIGINT before they are "
                   "cancelled (default: 10)")
    p.add_argument("--cors-origins", type=_origins, default=None, metavar="ORIGINS",
                   help="allow cross-origin (browser) requests from these origins: '*' or a comma-separated list "
                   "such as http://localhost:3000,https://app.example (default: off)")
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                   help="one line per request on stderr: method, path, status, tokens, milliseconds (default: on)")
    p.add_argument("--stall-timeout", type=_seconds, default=120.0,
                   help="seconds a busy scheduler may make no progress before /health answers 503 (default: 120)")
    # Tests and the soak only: honour a request's "debug_fault" field (fail that request on purpose).
    p.add_argument("--debug-fault-injection", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Serves until SIGTERM / SIGINT. A start-up error is printed as one `error: ...` line and
    returns 2."""
    from ..errors import BonsaiError

    try:
        engine, sock, api_key = _start(args)
    except (BonsaiError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from ..server import run_server

    try:
        print(f"bonsai serve: {engine.model_id} on http://{args.host}:{sock.getsockname()[1]}/v1 "
              f"({args.parallel} slots x {args.ctx_size} tokens)", file=sys.stderr)
        run_server(engine, api_key=api_key, sock=sock, max_body=args.max_body,
                   shutdown_timeout=args.shutdown_timeout, cors_origins=args.cors_origins,
                   access_log=args.access_log)
    finally:
        engine.close()
    return 0


def _start(args: argparse.Namespace):
    """(engine, bound socket, API key), or BonsaiError / OSError naming what is wrong."""
    from ..errors import BonsaiError, check_model_file
    from ..server import ServingEngine, bind_socket

    if args.parallel * args.ctx_size > INT32_MAX:
        raise BonsaiError(f"--parallel {args.parallel} x --ctx-size {args.ctx_size} = "
                          f"{args.parallel * args.ctx_size} KV cells is more than the engine holds ({INT32_MAX}); "
                          "lower --ctx-size or --parallel")
    check_model_file(args.model)
    template = args.chat_template
    if template is not None and "{{" not in template and "{%" not in template:  # a path, not template text
        if not os.path.isfile(template):
            raise BonsaiError(f"--chat-template {template}: no such file (give a Jinja2 template file, "
                              "or the template text itself)")
        with open(template, encoding="utf-8") as f:
            template = f.read()
    api_key = args.api_key if args.api_key is not None else os.environ.get("BONSAI_API_KEY") or None
    sock = bind_socket(args.host, args.port)  # before loading: a port in use fails at once
    try:
        engine = ServingEngine(args.model, n_parallel=args.parallel, n_ctx_slot=args.ctx_size,
                               n_batch=args.batch_size, n_threads=args.threads, cache_prompt=args.cache_prompt,
                               queue_limit=args.queue_limit, chat_template=template, model_alias=args.alias,
                               n_gpu_layers=args.n_gpu_layers, type_k=args.cache_type_k, type_v=args.cache_type_v,
                               flash_attn=args.flash_attn, verbose=args.verbose,
                               fault_injection=args.debug_fault_injection, stall_timeout=args.stall_timeout,
                               pooling=args.pooling)
    except BaseException:
        sock.close()
        raise
    return engine, sock, api_key
