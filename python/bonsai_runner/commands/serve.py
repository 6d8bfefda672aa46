"""Serve a model over an OpenAI-compatible HTTP API.

Routes: /v1/completions, /v1/chat/completions (streaming with server-sent events), /v1/models,
/health and /metrics (Prometheus). --parallel sequences are decoded together in one batch
(continuous batching); each has --ctx-size tokens of KV cache (prompt + completion). Requests
beyond --parallel wait in a queue of --queue-limit; when it is full the server answers 429.

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


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _non_negative(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="GGUF model file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=_non_negative, default=8080, help="TCP port (default: 8080)")
    p.add_argument("-np", "--parallel", type=_positive, default=4,
                   help="sequences decoded together, at most 64 (default: 4)")
    p.add_argument("-c", "--ctx-size", type=_positive, default=2048,
                   help="KV cache tokens per sequence slot, prompt + completion (default: 2048)")
    p.add_argument("-b", "--batch-size", type=_positive, default=512,
                   help="tokens per engine step (generating tokens + prompt chunks; default: 512)")
    p.add_argument("--queue-limit", type=_non_negative, default=64,
                   help="requests that may wait for a slot before the server answers 429 (default: 64)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default: $BONSAI_API_KEY or none)")
    p.add_argument("--chat-template", default=None,
                   help="Jinja2 chat template: a file, or the template text itself (default: the model file's own, "
                   "else ChatML)")
    p.add_argument("-t", "--threads", type=_non_negative, default=0, help="CPU threads (default: 0 = all cores)")
    p.add_argument("--cache-prompt", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV cache of shared prompt prefixes (default: on)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the GPU (CUDA builds; -1 = all)")
    p.add_argument("--cache-type-k", choices=("f16", "q8_0"), default="f16", help="K cache type (default: f16)")
    p.add_argument("--cache-type-v", choices=("f16", "q8_0"), default="f16", help="V cache type (default: f16)")
    p.add_argument("--flash-attn", action="store_true", help="one-pass (online-softmax) attention")
    p.add_argument("--alias", default=None, help="model id reported by /v1/models (default: the file name)")
    p.add_argument("--verbose", action="store_true", help="print the engine's load report")


def run(args: argparse.Namespace) -> int:
    from ..errors import BonsaiError
    from ..server import ServingEngine, run_server

    template = args.chat_template
    if template is not None and "{{" not in template and "{%" not in template:  # a path, not template text
        if not os.path.isfile(template):
            raise BonsaiError(f"--chat-template {template}: no such file (give a Jinja2 template file, "
                              "or the template text itself)")
        with open(template, encoding="utf-8") as f:
            template = f.read()
    api_key = args.api_key if args.api_key is not None else os.environ.get("BONSAI_API_KEY") or None
    engine = ServingEngine(args.model, n_parallel=args.parallel, n_ctx_slot=args.ctx_size,
                           n_batch=args.batch_size, n_threads=args.threads, cache_prompt=args.cache_prompt,
                           queue_limit=args.queue_limit, chat_template=template, model_alias=args.alias,
                           n_gpu_layers=args.n_gpu_layers, type_k=args.cache_type_k, type_v=args.cache_type_v,
                           flash_attn=args.flash_attn, verbose=args.verbose)
    try:
        print(f"bonsai serve: {engine.model_id} on http://{args.host}:{args.port}/v1 "
              f"({args.parallel} slots x {args.ctx_size} tokens)", file=sys.stderr)
        run_server(engine, host=args.host, port=args.port, api_key=api_key)
    finally:
        engine.close()
    return 0
