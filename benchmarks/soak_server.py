"""Soak test of `bonsai serve` (a benchmark script, not a unit test): bounded overload, bad input and
clients that vanish, against a real server process on loopback.

It starts `python -m bonsai_runner serve --parallel 4 --queue-limit 8` on a free 127.0.0.1 port,
warms it up (a few single requests, then one unmeasured round of the same mix), reads its RSS, then sends exactly 200 requests from 32 concurrent clients (raw HTTP,
so every status code is seen as sent), a fixed seeded mix of
  stream      streamed /v1/completions read to `data: [DONE]`,
  plain       non-streamed /v1/completions,
  chat        non-streamed /v1/chat/completions (only if the model file has a chat template),
  disconnect  streamed completion of 256 tokens (ignore_eos) whose client closes the socket after
              1-8 events (counted apart when the stream ends first: a model whose pieces are
              mostly held-back bytes sends few events),
  malformed   bad JSON, a missing prompt, top_p 7, bytes that are not UTF-8, a string temperature,
              a stop object, a JSON list: must be answered 400.
A client retries a 429/503 refusal --retries times after a short random pause; the report counts
every refusal and the requests refused on every try. A poller GETs /health every 0.2 s the whole time. After the last request it waits (bounded) for
/metrics to show no busy slot and an empty queue, reads the RSS again and stops the server.

Pass criteria (exit 1 otherwise, listing what failed): every well-formed request answered 200 with
a complete body/stream, or refused 429 / 503; every malformed one answered 400; /health answered
200 every time; all slots free at the end; RSS growth from after warm-up to the end under
--rss-tolerance-mib. Everything is bounded: --timeout seconds overall, 120 s per request.

    PYTHONPATH=python python3 benchmarks/soak_server.py --model model.gguf [--ctx-size 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bench_serving import random_text

N_REQUESTS = 200
N_CLIENTS = 32
PARALLEL = 4
QUEUE_LIMIT = 8
KINDS = ("stream", "plain", "chat", "disconnect", "malformed")
WEIGHTS = (30, 25, 10, 15, 20)
MALFORMED = (
    b'{"prompt": "hello", "max_tokens": 4',                       # truncated JSON
    b'{"max_tokens": 4}',                                         # no prompt
    b'{"prompt": "hello", "max_tokens": 4, "top_p": 7}',           # top_p out of range
    b'\xff\xfe{"prompt": "hello"}',                                # not UTF-8
    b'{"prompt": "hello", "max_tokens": 4, "temperature": "hot"}',  # wrong type
    b'{"prompt": "hello", "max_tokens": 4, "stop": {"a": 1}}',    # stop must be a string or list
    b'["not", "an", "object"]',                                   # not an object
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/{pid}/status")


class Server:
    """`bonsai serve` as a child process on a free loopback port."""

    def __init__(self, args):
        self.port = free_port()
        cmd = [sys.executable, "-m", "bonsai_runner", "serve", "-m", args.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--parallel", str(PARALLEL), "--queue-limit", str(QUEUE_LIMIT),
               "--ctx-size", str(args.ctx_size), "--threads", str(args.threads)]
        self.log = open(args.server_log, "wb") if args.server_log else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"soak: the server exited with status {self.proc.returncode} at start "
                                 f"(run with --server-log FILE to see why)")
            try:
                if request(self.port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("soak: the server did not answer /health within 120 s")
            time.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.log is not subprocess.DEVNULL:
            self.log.close()


def request(port, method, path, body=None, timeout=120.0):
    """(status, body bytes) of one request on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def stream_request(port, body, stop_after=None, timeout=120.0):
    """Streams a completion. Returns (status, "done" | "closed" | "truncated" | "refused")."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return resp.status, "refused"
        events = 0
        while True:
            line = resp.readline()
            if not line:
                return 200, "truncated"
            if not line.startswith(b"data: "):
                continue
            if line.strip() == b"data: [DONE]":
                return 200, "done"
            events += 1
            if stop_after is not None and events >= stop_after:
                return 200, "closed"  # the finally block closes the socket under the open stream
    finally:
        conn.close()


def metrics(port) -> dict:
    status, text = request(port, "GET", "/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    out = {}
    for line in text.decode().splitlines():
        m = re.match(r"^(bonsai_\w+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def has_chat_template(model_path) -> bool:
    from bonsai_runner import _core

    with _core.Model(model_path) as m:
        return bool(m.metadata.get("tokenizer.chat_template"))


def one_request(port, i, use_chat, retries):
    """Runs request i of the fixed mix, retrying a 429/503 refusal up to `retries` times after a short
    random pause (as a client honouring the refusal would). Returns (kind, outcome, refusals) with
    outcome 'ok', 'ok-ended-first' (a disconnect whose stream ended first), 'refused-429' or
    'refused-503' (the last attempt's refusal), 'rejected-400' or 'FAIL: ...', and refusals the
    list of refusal statuses seen."""
    r = random.Random(1000 + i)
    kind = r.choices(KINDS, WEIGHTS)[0]
    if kind == "chat" and not use_chat:
        kind = "plain"
    prompt = random_text(r, r.randint(3, 40))
    refusals: list[int] = []
    for attempt in range(retries + 1):
        outcome = attempt_request(port, i, kind, prompt, r)
        if not outcome.startswith("refused"):
            break
        refusals.append(int(outcome[-3:]))
        time.sleep(r.uniform(0.05, 0.3) * (attempt + 1))
    return kind, outcome, refusals


def attempt_request(port, i, kind, prompt, r) -> str:
    try:
        if kind == "malformed":
            status, body = request(port, "POST", "/v1/completions", MALFORMED[i % len(MALFORMED)])
            return "rejected-400" if status == 400 else f"FAIL: status {status}: {body[:200]!r}"
        if kind in ("stream", "disconnect"):
            body = {"model": "m", "prompt": prompt, "stream": True, "temperature": r.choice([0, 0.8]), "seed": i}
            if kind == "stream":
                body["max_tokens"] = r.randint(1, 48)
                status, how = stream_request(port, body)
                ok = how == "done"
            else:
                body.update(max_tokens=256, ignore_eos=True)
                status, how = stream_request(port, body, stop_after=r.randint(1, 8))
                ok = how in ("closed", "done")  # done: the stream ended before the client left
                if status == 200 and how == "done":
                    return "ok-ended-first"
            if status in (429, 503):
                return f"refused-{status}"
            return "ok" if status == 200 and ok else f"FAIL: status {status}, stream {how}"
        if kind == "chat":
            body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": r.randint(1, 48)}
            path = "/v1/chat/completions"
        else:
            body = {"model": "m", "prompt": prompt, "max_tokens": r.randint(1, 48), "temperature": r.choice([0, 0.8])}
            path = "/v1/completions"
        status, raw = request(port, "POST", path, json.dumps(body).encode())
        if status in (429, 503):
            return f"refused-{status}"
        if status != 200:
            return f"FAIL: status {status}: {raw[:200]!r}"
        reason = json.loads(raw)["choices"][0]["finish_reason"]
        return "ok" if reason in ("stop", "length") else f"FAIL: finish_reason {reason}"
    except Exception as e:  # a client-side failure is a soak failure, reported with the request
        return f"FAIL: {type(e).__name__}: {e}"


class HealthPoller(threading.Thread):
    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.ok, self.bad, self.worst_ms = port, 0, [], 0.0
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            t0 = time.perf_counter()
            try:
                status, body = request(self.port, "GET", "/health", timeout=10)
                good = status == 200 and json.loads(body).get("status") == "ok"
            except Exception as e:
                status, good = f"{type(e).__name__}: {e}", False
            self.worst_ms = max(self.worst_ms, (time.perf_counter() - t0) * 1000)
            if good:
                self.ok += 1
            else:
                self.bad.append(status)
            self.halt.wait(0.2)


def run_soak(args) -> int:
    """Runs the soak and prints its report; returns 0 when every criterion holds, 1 otherwise."""
    t_start = time.monotonic()
    use_chat = has_chat_template(args.model)
    server = Server(args)
    failures: list[str] = []
    try:
        port = server.port
        for i in range(4):  # warm-up: first allocations, both endpoints, a cancelled stream
            text = random_text(random.Random(i), 30)
            stream_request(port, {"model": "m", "prompt": text, "max_tokens": 16, "stream": True})
            stream_request(port, {"model": "m", "prompt": text, "max_tokens": 1 << 20, "ignore_eos": True,
                                  "stream": True}, stop_after=2)
            request(port, "POST", "/v1/completions", json.dumps({"prompt": "warm up", "max_tokens": 8}).encode())
        # Then one whole round of the soak's own mix (other seeds), so that batched decoding, the
        # server's worker threads, the engine's per-thread scratch and the allocator's high-water
        # marks reach their working size before the baseline is read: growth after this point is
        # what a leak would show. (Measured on the 483M synthetic model: after such a round, further
        # rounds of 200 requests add +17, +6, +4, +2, +1 MiB — a plateau, not a per-request leak.)
        with ThreadPoolExecutor(N_CLIENTS) as pool:
            for f in [pool.submit(one_request, port, N_REQUESTS + i, use_chat, args.retries)
                      for i in range(N_REQUESTS)]:
                f.result(timeout=max(args.timeout - (time.monotonic() - t_start), 1))
        rss_before = rss_mib(server.proc.pid)
        poller = HealthPoller(port)
        poller.start()
        outcomes = collections.Counter()
        refusals = collections.Counter()
        by_kind = collections.Counter()
        t0 = time.monotonic()
        with ThreadPoolExecutor(N_CLIENTS) as pool:
            futures = [pool.submit(one_request, port, i, use_chat, args.retries) for i in range(N_REQUESTS)]
            for i, f in enumerate(futures):
                if i == N_REQUESTS // 2:
                    rss_mid = rss_mib(server.proc.pid)
                remaining = args.timeout - (time.monotonic() - t_start)
                kind, outcome, refused = f.result(timeout=max(remaining, 1))
                by_kind[kind] += 1
                refusals.update(refused)
                outcomes[(kind, outcome if not outcome.startswith("FAIL") else "FAIL")] += 1
                if outcome.startswith("FAIL"):
                    failures.append(f"request {i} ({kind}): {outcome}")
        wall = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while True:
            m = metrics(port)
            if m.get("bonsai_slots_busy") == 0 and m.get("bonsai_queue_depth") == 0:
                break
            if time.monotonic() > deadline:
                failures.append(f"slots still busy 30 s after the last request: slots_busy "
                                f"{m.get('bonsai_slots_busy')}, queue_depth {m.get('bonsai_queue_depth')}")
                break
            time.sleep(0.2)
        poller.halt.set()
        poller.join(15)
        rss_after = rss_mib(server.proc.pid)
    finally:
        server.stop()

    wf = [k for k in KINDS if k != "malformed"]
    answered = sum(n for (k, o), n in outcomes.items() if k in wf and o.startswith("ok"))
    r429 = sum(n for (k, o), n in outcomes.items() if o == "refused-429")
    r503 = sum(n for (k, o), n in outcomes.items() if o == "refused-503")
    n_wf = sum(by_kind[k] for k in wf)
    print(f"soak: {N_REQUESTS} requests from {N_CLIENTS} clients against bonsai serve --parallel {PARALLEL} "
          f"--queue-limit {QUEUE_LIMIT} in {wall:.1f} s (mix: {dict(by_kind)})")
    print(f"  well-formed {n_wf}: answered {answered} (of which {outcomes[('disconnect', 'ok')]} disconnected "
          f"mid-stream by the client, {outcomes[('disconnect', 'ok-ended-first')]} ended before the client "
          f"could), refused on every try 429 {r429} / 503 {r503}, "
          f"failed {n_wf - answered - r429 - r503}; refusals seen (incl. retried) 429 {refusals[429]}, "
          f"503 {refusals[503]}")
    print(f"  malformed {by_kind['malformed']}: answered 400 {outcomes[('malformed', 'rejected-400')]}")
    print(f"  /health: {poller.ok} OK, {len(poller.bad)} not OK, slowest {poller.worst_ms:.0f} ms")
    cancelled = m.get('bonsai_requests_finished_total{reason="cancelled"}', 0)
    errors = m.get('bonsai_requests_finished_total{reason="error"}', 0)
    print(f"  metrics at the end: slots_busy {m.get('bonsai_slots_busy'):.0f} of {m.get('bonsai_slots_total'):.0f}, "
          f"queue_depth {m.get('bonsai_queue_depth'):.0f}, accepted {m.get('bonsai_requests_total'):.0f}, "
          f"rejected {m.get('bonsai_requests_rejected_total'):.0f}, cancelled {cancelled:.0f}, errors {errors:.0f}")
    growth = rss_after - rss_before
    print(f"  server RSS: {rss_before:.1f} MiB after warm-up, {rss_mid:.1f} MiB when the first "
          f"{N_REQUESTS // 2} requests were done, {rss_after:.1f} MiB at the end "
          f"({growth:+.1f} MiB; tolerance {args.rss_tolerance_mib:.0f} MiB)")
    if poller.bad:
        failures.append(f"/health failed {len(poller.bad)} times: {poller.bad[:3]}")
    if growth > args.rss_tolerance_mib:
        failures.append(f"server RSS grew by {growth:.1f} MiB")
    if errors:
        failures.append("the scheduler finished requests with an error")
    for f in failures[:20]:
        print(f"  FAIL {f}")
    print("soak: " + ("PASS" if not failures else f"FAILED ({len(failures)} problems)"))
    return 0 if not failures else 1


def add_soak_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retries", type=int, default=3,
                   help="times a client retries a 429/503 refusal after a short pause (default 3)")
    p.add_argument("--server-log", default=None, help="write the server's output to this file")
    p.add_argument("--rss-tolerance-mib", type=float, default=32.0,
                   help="largest RSS growth from after warm-up to the end that counts as flat (default 32)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="GGUF file to serve")
    p.add_argument("--ctx-size", type=int, default=512, help="KV tokens per slot (default 512)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="bound on the whole soak in seconds (default 600)")
    add_soak_arguments(p)
    args = p.parse_args(argv)
    if not os.path.isfile(args.model):
        p.error(f"no model file at {args.model}")
    return run_soak(args)


if __name__ == "__main__":
    sys.exit(main())
