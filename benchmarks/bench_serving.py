"""Serving benchmark (not a test): continuous batching and prompt-prefix reuse, measured through
the HTTP API with the official `openai` client, and a soak mode.

Throughput: one streaming client, then `--clients` concurrent streaming clients, each generating
`--tokens` tokens (end-of-generation masked with ignore_eos, so every request does the same work);
prints the aggregate generated tokens/s of both and their ratio (the batching speed-up).
Prefix reuse: time to first token (a one-token completion) of a prompt made of a shared
`--prefix-tokens`-token prefix and
a short question, first cold (nothing cached), then warm (a different question after the same
prefix); prints both and the cold/warm ratio.
Soak (`--soak SECONDS`, with --model): benchmarks/soak_server.py bounded by SECONDS: 200 requests
from 32 clients against a `bonsai serve --parallel 4 --queue-limit 8` child process (malformed
requests and mid-stream disconnects included); reports answered / 429 / 503 counts, /health,
free slots from /metrics and the server's RSS before and after, and exits 1 if any check fails.

The server runs in this process (uvicorn in a thread, loopback, a free port), or pass --url to
measure one that is already running.

    PYTHONPATH=python python3 benchmarks/bench_serving.py --model model.gguf [--parallel 8] [--threads 0]
    PYTHONPATH=python python3 benchmarks/bench_serving.py --url http://127.0.0.1:8080 --clients 16
    PYTHONPATH=python python3 benchmarks/bench_serving.py --model model.gguf --soak 300
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have "
         "an they you were her she there been one all we their has would when if so what more can no said who").split()


class LocalServer:
    """A ServingEngine behind uvicorn in a thread, on a free loopback port."""

    def __init__(self, args):
        import uvicorn

        from bonsai_runner.server import ServingEngine, create_app

        self.engine = ServingEngine(args.model, n_parallel=args.parallel, n_ctx_slot=args.ctx_size,
                                    n_batch=args.batch_size, n_threads=args.threads, cache_prompt=True,
                                    queue_limit=256, n_gpu_layers=args.n_gpu_layers)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.engine), log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.05)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        self.engine.close()


def stream_once(client, prompt, max_tokens, **extra):
    """Returns (time to first text, total time, usage) of one streamed completion."""
    t0 = time.perf_counter()
    first = None
    usage = None
    for chunk in client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True, **extra}):
        if chunk.choices and chunk.choices[0].text and first is None:
            first = time.perf_counter() - t0
        if chunk.usage is not None:
            usage = chunk.usage
    return first if first is not None else float("nan"), time.perf_counter() - t0, usage


def random_text(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def bench_throughput(client, args):
    rng = random.Random(1)
    prompts = [f"Story {i}: " + random_text(rng, 20) for i in range(args.clients)]
    stream_once(client, "warm up", 4)
    t0 = time.perf_counter()
    _, _, u = stream_once(client, prompts[0], args.tokens)
    single = u.completion_tokens / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        results = list(pool.map(lambda p: stream_once(client, p, args.tokens), prompts))
    wall = time.perf_counter() - t0
    total = sum(r[2].completion_tokens for r in results)
    many = total / wall
    print(f"throughput: 1 client {single:.1f} tok/s; {args.clients} clients {many:.1f} tok/s aggregate "
          f"({total} tokens in {wall:.2f} s); ratio {many / single:.2f}x")


def first_token_time(client, prompt):
    """Seconds until the first generated token (a one-token completion: prefill + one step, so the
    figure does not depend on whether that token's text is empty) and the prompt's token count."""
    t0 = time.perf_counter()
    r = client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0)
    return time.perf_counter() - t0, r.usage.prompt_tokens


def bench_prefix(client, args):
    rng = random.Random(2)
    # size the prefix to about --prefix-tokens tokens of this model's vocabulary, measured on an
    # unrelated probe text so that nothing of the real prefix is cached before the cold request
    probe_words = 200
    _, n_probe = first_token_time(client, random_text(random.Random(99), probe_words))
    n_words = max(1, round(args.prefix_tokens * probe_words / max(n_probe, 1)))
    prefix = random_text(rng, n_words)
    cold, n_prompt = first_token_time(client, prefix + "\nQuestion: what is first?")
    warm, _ = first_token_time(client, prefix + "\nQuestion: what is last?")
    print(f"time to first token, {n_prompt}-token prompts sharing a prefix of about "
          f"{args.prefix_tokens} tokens: cold {cold * 1000:.0f} ms, warm {warm * 1000:.0f} ms; "
          f"warm/cold {warm / cold:.1%} (ratio {cold / warm:.1f}x)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF file (starts a server in this process)")
    p.add_argument("--url", help="measure a running server instead")
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--ctx-size", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per client")
    p.add_argument("--prefix-tokens", type=int, default=1000,
                   help="tokens of the shared prefix (sized with the model's own tokenizer)")
    p.add_argument("--soak", type=float, default=0.0,
                   help="run the soak (benchmarks/soak_server.py) instead, bounded by this many seconds")
    from soak_server import add_soak_arguments, run_soak

    add_soak_arguments(p)
    args = p.parse_args(argv)
    if bool(args.model) == bool(args.url):
        p.error("give exactly one of --model and --url")
    if args.soak > 0:
        if not args.model:
            p.error("--soak starts its own `bonsai serve` (to read its RSS); give --model")
        args.timeout = args.soak
        return run_soak(args)
    local = LocalServer(args) if args.model else None
    url = local.url if local else args.url.rstrip("/")
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    try:
        bench_throughput(client, args)
        bench_prefix(client, args)
    finally:
        if local:
            local.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
