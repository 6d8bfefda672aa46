"""Soak test of `bonsai serve` (a benchmark script, not a unit test): bounded overload, bad input,
clients that vanish or read slowly, and injected scheduler faults, against a real server process on
loopback.

It starts `python -m bonsai_runner serve --parallel 4 --queue-limit 8 --max-body 256KiB
--debug-fault-injection` on a free 127.0.0.1 port, warms it up (a few single requests, then one
unmeasured round of 200 requests of the same mix), reads its RSS, then runs the measured phase:
exactly 200 requests, or with --duration SECONDS as many as 32 clients send until the time is up
(each client sends one request at a time). Raw HTTP, so every status code is seen as sent; a fixed
seeded mix of
  stream       streamed /v1/completions read to `data: [DONE]`,
  plain        non-streamed /v1/completions,
  chat         non-streamed /v1/chat/completions (only if the model file has a chat template),
  disconnect   streamed completion of 256 tokens (ignore_eos) whose client closes the socket after
               1-8 events (counted apart when the stream ends first),
  slow_reader  streamed completion read one line every 50-250 ms, to the end,
  malformed    bad JSON, a missing prompt, top_p 7, bytes that are not UTF-8, a string temperature,
               a stop object, a JSON list, JSON nested 100,000 deep: must be answered 400,
  out_of_range top_k / repeat_last_n 3e9, max_tokens 2**31, seed 2**64, top_p 5e-324: must be 400,
  oversized    a Content-Length over --max-body (the body is not sent) or a chunked body that grows
               past it: must be answered 413,
  fault        a request with "debug_fault" admit or sample, plain or streamed: must be answered 500
               (plain) or end its stream with an error event (streamed) — the only 5xx allowed.
A client retries a 429/503 refusal --retries times after a short random pause; the report counts
every refusal and the requests refused on every try. A poller GETs /health every 0.2 s the whole
time. After the last request it waits (bounded) for /metrics to show no busy slot and an empty
queue, reads the RSS again and stops the server.

Pass criteria (exit 1 otherwise, listing what failed): every well-formed request answered 200 with
a complete body/stream, or refused 429 / 503; every malformed / out-of-range one 400, every oversized
one 413, every injected fault a 500 / stream error, no other 5xx; no request without an answer
within 120 s (no hang); the scheduler's error count grew by exactly the injected faults it ran;
/health answered 200 every time; all slots free at the end; RSS growth from after warm-up to the
end under --rss-tolerance-mib.

    PYTHONPATH=python python3 benchmarks/soak_server.py --model model.gguf [--ctx-size 512] [--threads 2]
    PYTHONPATH=python python3 benchmarks/soak_server.py --model model.gguf --duration 300
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
MAX_BODY = 256 * 1024
KINDS = ("stream", "plain", "chat", "disconnect", "slow_reader", "malformed", "out_of_range", "oversized", "fault")
WEIGHTS = (24, 20, 8, 10, 4, 12, 8, 5, 9)
WELL_FORMED = ("stream", "plain", "chat", "disconnect", "slow_reader")
MALFORMED = (
    b'{"prompt": "hello", "max_tokens": 4',                       # truncated JSON
    b'{"max_tokens": 4}',                                         # no prompt
    b'{"prompt": "hello", "max_tokens": 4, "top_p": 7}',           # top_p out of range
    b'\xff\xfe{"prompt": "hello"}',                                # not UTF-8
    b'{"prompt": "hello", "max_tokens": 4, "temperature": "hot"}',  # wrong type
    b'{"prompt": "hello", "max_tokens": 4, "stop": {"a": 1}}',    # stop must be a string or list
    b'["not", "an", "object"]',                                   # not an object
    b"[" * 100_000 + b"]" * 100_000,                              # nested too deep
)
OUT_OF_RANGE = ({"top_k": 3_000_000_000}, {"repeat_last_n": 3_000_000_000}, {"max_tokens": 2**31},
                {"seed": 2**64}, {"top_p": 5e-324}, {"temperature": -1})


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
               "--ctx-size", str(args.ctx_size), "--threads", str(args.threads), "--max-body", str(MAX_BODY),
               "--debug-fault-injection"]
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


def oversized_request(port, chunked: bool, timeout=120.0) -> int:
    """A body over MAX_BODY: declared by Content-Length (never sent), or chunked and growing past it.
    Returns the status the server answered (0 if it closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
        if chunked:
            s.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
            piece = b'{"prompt": "' + b"a" * 32768
            for _ in range(MAX_BODY // len(piece) + 2):
                try:
                    s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                except OSError:  # the server answered and closed: read what it said
                    break
        else:
            s.sendall(head + b"Content-Length: %d\r\n\r\n" % (MAX_BODY * 4))
        reply = b""
        try:
            while b"\r\n" not in reply:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
        except ConnectionResetError:
            pass
    m = re.match(rb"HTTP/1\.1 (\d{3})", reply)
    return int(m.group(1)) if m else 0


def stream_request(port, body, stop_after=None, timeout=120.0, pause=None):
    """Streams a completion (reading one line per `pause()` seconds if given). Returns (status,
    "done" | "closed" | "truncated" | "refused" | "error-event")."""
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
            if line.startswith(b'data: {"error"'):
                return 200, "error-event"
            events += 1
            if pause is not None:
                time.sleep(pause())
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
        if kind == "out_of_range":
            bad = OUT_OF_RANGE[i % len(OUT_OF_RANGE)]
            body = {"model": "m", "prompt": prompt, "max_tokens": 4, **bad}
            status, raw = request(port, "POST", "/v1/completions", json.dumps(body).encode())
            return "rejected-400" if status == 400 else f"FAIL: {bad}: status {status}: {raw[:200]!r}"
        if kind == "oversized":
            status = oversized_request(port, chunked=bool(i % 2))
            return "rejected-413" if status == 413 else f"FAIL: oversized body answered {status}"
        if kind == "fault":
            fault = r.choice(["admit", "sample"])
            body = {"model": "m", "prompt": prompt, "max_tokens": 8, "ignore_eos": True, "debug_fault": fault}
            if r.random() < 0.5:
                status, how = stream_request(port, {**body, "stream": True})
                if status in (429, 503):
                    return f"refused-{status}"
                return "injected-500" if status == 200 and how == "error-event" else \
                    f"FAIL: injected {fault} stream: status {status}, stream {how}"
            status, raw = request(port, "POST", "/v1/completions", json.dumps(body).encode())
            if status in (429, 503):
                return f"refused-{status}"
            ok = status == 500 and f"fault='{fault}'".encode() in raw
            return "injected-500" if ok else f"FAIL: injected {fault}: status {status}: {raw[:200]!r}"
        if kind in ("stream", "disconnect", "slow_reader"):
            body = {"model": "m", "prompt": prompt, "stream": True, "temperature": r.choice([0, 0.8]), "seed": i}
            if kind == "stream":
                body["max_tokens"] = r.randint(1, 48)
                status, how = stream_request(port, body)
                ok = how == "done"
            elif kind == "slow_reader":
                body["max_tokens"] = r.randint(4, 16)
                status, how = stream_request(port, body, pause=lambda: r.uniform(0.05, 0.25))
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
    except Exception as e:  # a client-side failure (a timeout: a hang) is a soak failure
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
        errors_before = metrics(port).get('bonsai_requests_finished_total{reason="error"}', 0)
        poller = HealthPoller(port)
        poller.start()
        outcomes = collections.Counter()
        refusals = collections.Counter()
        by_kind = collections.Counter()
        lock = threading.Lock()
        counter = iter(range(1 << 40))
        t0 = time.monotonic()
        end = t0 + args.duration if args.duration else None
        rss_mid = None

        def record(i, result):
            kind, outcome, refused = result
            with lock:
                by_kind[kind] += 1
                refusals.update(refused)
                outcomes[(kind, outcome if not outcome.startswith("FAIL") else "FAIL")] += 1
                if outcome.startswith("FAIL"):
                    failures.append(f"request {i} ({kind}): {outcome}")

        def client():  # --duration: one request at a time until the time is up
            while time.monotonic() < end:
                with lock:
                    i = next(counter)
                record(i, one_request(port, i, use_chat, args.retries))

        with ThreadPoolExecutor(N_CLIENTS) as pool:
            if end is not None:
                futures = [pool.submit(client) for _ in range(N_CLIENTS)]
                while time.monotonic() < end and not all(f.done() for f in futures):
                    if rss_mid is None and time.monotonic() > t0 + args.duration / 2:
                        rss_mid = rss_mib(server.proc.pid)
                    time.sleep(0.5)
                for f in futures:
                    f.result(timeout=max(args.timeout - (time.monotonic() - t_start), 1))
            else:
                futures = [pool.submit(one_request, port, i, use_chat, args.retries) for i in range(N_REQUESTS)]
                for i, f in enumerate(futures):
                    if i == N_REQUESTS // 2:
                        rss_mid = rss_mib(server.proc.pid)
                    remaining = args.timeout - (time.monotonic() - t_start)
                    record(i, f.result(timeout=max(remaining, 1)))
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

    wf = list(WELL_FORMED)
    answered = sum(n for (k, o), n in outcomes.items() if k in wf and o.startswith("ok"))
    r429 = sum(n for (k, o), n in outcomes.items() if k in wf and o == "refused-429")
    r503 = sum(n for (k, o), n in outcomes.items() if k in wf and o == "refused-503")
    n_wf = sum(by_kind[k] for k in wf)
    injected = outcomes[("fault", "injected-500")]
    n_requests = sum(by_kind.values())
    print(f"soak: {n_requests} requests from {N_CLIENTS} clients against bonsai serve --parallel {PARALLEL} "
          f"--queue-limit {QUEUE_LIMIT} --max-body {MAX_BODY} in {wall:.1f} s "
          f"({n_requests / wall:.1f} requests/s; mix: {dict(by_kind)})")
    print(f"  well-formed {n_wf}: answered {answered} (of which {outcomes[('disconnect', 'ok')]} disconnected "
          f"mid-stream by the client, {outcomes[('disconnect', 'ok-ended-first')]} ended before the client "
          f"could, {outcomes[('slow_reader', 'ok')]} read slowly to the end), refused on every try 429 {r429} / "
          f"503 {r503}, failed {n_wf - answered - r429 - r503}; refusals seen (incl. retried) 429 {refusals[429]}, "
          f"503 {refusals[503]}")
    print(f"  malformed {by_kind['malformed']}: answered 400 {outcomes[('malformed', 'rejected-400')]}; "
          f"out-of-range {by_kind['out_of_range']}: answered 400 {outcomes[('out_of_range', 'rejected-400')]}; "
          f"oversized {by_kind['oversized']}: answered 413 {outcomes[('oversized', 'rejected-413')]}")
    print(f"  injected faults {by_kind['fault']}: answered 500 / stream error {injected}, refused 429 "
          f"{outcomes[('fault', 'refused-429')]}; other 5xx: "
          f"{sum(n for (k, o), n in outcomes.items() if o == 'FAIL')} failed requests (see below)")
    print(f"  /health: {poller.ok} OK, {len(poller.bad)} not OK, slowest {poller.worst_ms:.0f} ms")
    cancelled = m.get('bonsai_requests_finished_total{reason="cancelled"}', 0)
    errors = m.get('bonsai_requests_finished_total{reason="error"}', 0) - errors_before
    print(f"  metrics at the end: slots_busy {m.get('bonsai_slots_busy'):.0f} of {m.get('bonsai_slots_total'):.0f}, "
          f"queue_depth {m.get('bonsai_queue_depth'):.0f}, accepted {m.get('bonsai_requests_total'):.0f}, "
          f"rejected {m.get('bonsai_requests_rejected_total'):.0f}, cancelled {cancelled:.0f}, "
          f"errors in the measured phase {errors:.0f} (injected {injected})")
    growth = rss_after - rss_before
    mid = f"{rss_mid:.1f} MiB at half time" if rss_mid is not None else "no mid-point reading"
    print(f"  server RSS: {rss_before:.1f} MiB after warm-up, {mid}, {rss_after:.1f} MiB at the end "
          f"({growth:+.1f} MiB; tolerance {args.rss_tolerance_mib:.0f} MiB)")
    if poller.bad:
        failures.append(f"/health failed {len(poller.bad)} times: {poller.bad[:3]}")
    if growth > args.rss_tolerance_mib:
        failures.append(f"server RSS grew by {growth:.1f} MiB")
    if errors != injected:
        failures.append(f"the scheduler finished {errors:.0f} requests with an error, {injected} were injected")
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
    p.add_argument("--duration", type=float, default=None,
                   help="run the measured phase for this many seconds (32 clients sending until then) instead "
                   "of exactly 200 requests")
    p.add_argument("--timeout", type=float, default=None,
                   help="bound on the whole soak in seconds (default 600, or --duration + 600)")
    add_soak_arguments(p)
    args = p.parse_args(argv)
    if args.timeout is None:
        args.timeout = 600.0 + (args.duration or 0)
    if not os.path.isfile(args.model):
        p.error(f"no model file at {args.model}")
    return run_soak(args)


if __name__ == "__main__":
    sys.exit(main())
