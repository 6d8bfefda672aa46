"""The OpenAI-compatible server (bonsai_runner.server) driven by the official `openai` client over
loopback, on the tiny random llama GGUF of test_llama_api_e2e. Servers run in-process (uvicorn in a
thread on a socket bound to a free port) and are always stopped; every wait is bounded.

Checked: completions and chat, streamed and not (streamed text == non-streamed text == `Llama`'s
text), stop strings and max_tokens, errors mapped to the client's exceptions (400, 401, 429) with
OpenAI-style bodies, 8 concurrent greedy requests == 8 sequential ones, prefix reuse leaves greedy
output unchanged, a client disconnect (streaming or not) cancels the request and frees its slot,
/health and /metrics."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_llama_api_e2e import engine, write_tiny_gguf

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

PROMPTS = ["The answer is 42. Hello world, hello there!", "def add(a, b): return a + b", "你好世界 🙂",
           "Hello", "hello there! The answer", "return a + b. The answer is", "42", "world, hello there 你好"]
MESSAGES = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 40 + 2?"}]
KEY = "sekret"
N_CTX = 256


class _Server:
    """uvicorn serving `engine` in a thread, on a socket bound to a free loopback port."""

    def __init__(self, serving_engine, api_key=None, **app_options):
        from bonsai_runner.server import create_app

        self.engine = serving_engine
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(serving_engine, api_key, **app_options),
                                                    log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def client(self, api_key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=30)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(20)
        self.engine.close()

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return r.status, r.read().decode()

    def post_raw(self, path, data: bytes, headers=None):
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name):
        _, text = self.get("/metrics")
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")

    def wait_metric(self, name, want, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            v = self.metric(name)
            if v == want or time.monotonic() > deadline:
                return v
            time.sleep(0.05)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("server") / "tiny.gguf"
    write_tiny_gguf(path)
    return str(path)


@pytest.fixture(scope="module")
def llama(tiny):
    from bonsai_runner import Llama

    llm = Llama(tiny, n_ctx=N_CTX, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def server(tiny):
    from bonsai_runner.server import ServingEngine

    s = _Server(ServingEngine(tiny, n_parallel=8, n_ctx_slot=N_CTX, n_batch=64, n_threads=2))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict(tiny):
    """One slot of 4096 tokens, no waiting room, an API key."""
    from bonsai_runner.server import ServingEngine

    s = _Server(ServingEngine(tiny, n_parallel=1, n_ctx_slot=4096, queue_limit=0, n_threads=2), api_key=KEY)
    yield s
    s.stop()


def _ref(llama, prompt, n=24):
    return llama(prompt, max_tokens=n, temperature=0)["choices"][0]["text"]


@engine
def test_models_health_metrics(server):
    ids = [m.id for m in server.client().models.list().data]
    assert ids == ["tiny.gguf"]
    status, body = server.get("/health")
    assert status == 200 and json.loads(body)["status"] == "ok" and json.loads(body)["slots_idle"] == 8
    _, text = server.get("/metrics")
    for name in ("bonsai_requests_total", "bonsai_generated_tokens_total", "bonsai_queue_depth",
                 "bonsai_slots_busy", "bonsai_generated_tokens_per_second", 'reason="cancelled"',
                 "bonsai_time_to_first_token_seconds_count"):
        assert name in text
    assert server.metric("bonsai_slots_total") == 8


@engine
def test_completion_plain_and_streamed(server, llama):
    c = server.client()
    p = PROMPTS[0]
    r = c.completions.create(model="x", prompt=p, max_tokens=24, temperature=0)
    assert r.choices[0].text == _ref(llama, p) and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens == len(llama.tokenize(p.encode()))
    before = server.metric("bonsai_generated_tokens_total")
    firsts = server.metric("bonsai_time_to_first_token_seconds_count")
    parts, reasons = [], []
    for chunk in c.completions.create(model="x", prompt=p, max_tokens=24, temperature=0, stream=True):
        parts.append(chunk.choices[0].text)
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(parts) == r.choices[0].text
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    assert server.metric("bonsai_generated_tokens_total") == before + 24
    assert server.metric("bonsai_time_to_first_token_seconds_count") == firsts + 1
    status, raw = server.post_raw("/v1/completions", json.dumps(
        {"prompt": p, "max_tokens": 3, "temperature": 0, "stream": True}).encode())
    assert status == 200 and raw.rstrip().endswith("data: [DONE]")


@engine
def test_chat_plain_and_streamed(server, llama):
    c = server.client()
    want = llama.create_chat_completion(MESSAGES, temperature=0, max_tokens=20)
    r = c.chat.completions.create(model="x", messages=MESSAGES, temperature=0, max_tokens=20)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert r.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    stream = c.chat.completions.create(model="x", messages=MESSAGES, temperature=0, max_tokens=20, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


@engine
def test_stop_and_max_tokens(server, llama):
    c = server.client()
    p = PROMPTS[1]
    ref = _ref(llama, p)
    cut = ref[4:7]
    r = c.completions.create(model="x", prompt=p, max_tokens=24, temperature=0, stop=["never-seen", cut])
    assert r.choices[0].text == ref[: ref.index(cut)] and r.choices[0].finish_reason == "stop"
    r = c.completions.create(model="x", prompt=p, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    r = c.completions.create(model="x", prompt=p, max_tokens=8, temperature=0.9, seed=11)
    assert c.completions.create(model="x", prompt=p, max_tokens=8, temperature=0.9, seed=11).choices[0].text \
        == r.choices[0].text


@engine
def test_bad_requests_are_400(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="x", prompt="Hello", n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="x", prompt="hello " * 400)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="x", prompt="Hello", extra_body={"top_k": "many"})
    assert e.value.body["param"] == "top_k"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="x", prompt="Hello", temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=[{"content": "no role"}])
    assert e.value.body["param"] == "messages"
    for raw in (b"{not json", b"[1, 2]", b'{"prompt": 5}', b'{"prompt": "x", "max_tokens": "ten"}',
                b'{"prompt": "x", "stream": "yes"}', b'{"max_tokens": 4}', b'{"prompt": "a\\ud800b"}',
                b'{"prompt": [1, 99999]}', b'{"prompt": ["a", "b"]}', b'{"prompt": "x", "stop": 3}',
                b'{"prompt": "x", "logit_bias": {"5": 101}}', b'{"prompt": "x", "logprobs": 21}',
                b'{"prompt": "x", "response_format": {"type": "xml"}}',
                b'{"prompt": "x", "max_tokens": -1}', b'{"prompt": "x", "max_tokens": 0}'):
        status, body = server.post_raw("/v1/completions", raw)
        assert status == 400, raw
        err = json.loads(body)["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
    status, body = server.post_raw("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udc00"}]}')
    assert status == 400 and json.loads(body)["error"]["param"] == "messages"
    status, body = server.post_raw("/v1/completions", b"[" * 100_000 + b"]" * 100_000)  # was a 500
    assert status == 400 and "nested more than" in json.loads(body)["error"]["message"]
    status, body = server.post_raw("/v1/nothing", b"{}")
    assert status == 404 and "error" in json.loads(body)
    assert server.metric('bonsai_requests_finished_total{reason="error"}') == 0


@engine
def test_api_key(strict):
    with pytest.raises(openai.AuthenticationError):
        strict.client("wrong").models.list()
    assert [m.id for m in strict.client(KEY).models.list().data] == ["tiny.gguf"]


@engine
def test_concurrent_greedy_equals_sequential(server, llama):
    c = server.client()

    def one(p):
        return c.completions.create(model="x", prompt=p, max_tokens=24, temperature=0).choices[0].text

    sequential = [one(p) for p in PROMPTS]
    steps = server.metric("bonsai_decode_steps_total")
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent = list(pool.map(one, PROMPTS))
    assert concurrent == sequential
    assert sequential == [_ref(llama, p) for p in PROMPTS]
    # served together: far fewer engine steps than 8 x 24 one-token steps
    assert server.metric("bonsai_decode_steps_total") - steps < len(PROMPTS) * 24


@engine
def test_prefix_reuse_same_greedy_output(server, llama):
    c = server.client()
    base = PROMPTS[5] + " " + PROMPTS[0]
    first = c.completions.create(model="x", prompt=base, max_tokens=16, temperature=0).choices[0].text
    reused = server.metric("bonsai_prompt_tokens_reused_total")
    again = c.completions.create(model="x", prompt=base, max_tokens=16, temperature=0).choices[0].text
    longer = c.completions.create(model="x", prompt=base + " def", max_tokens=16, temperature=0).choices[0].text
    n = len(llama.tokenize(base.encode()))
    assert server.metric("bonsai_prompt_tokens_reused_total") - reused >= 2 * (n - 1)
    assert first == again == _ref(llama, base, 16)
    assert longer == _ref(llama, base + " def", 16)


@engine
def test_queue_full_is_429_and_stream_disconnect_frees_slot(strict):
    c = strict.client(KEY)
    cancelled = strict.metric('bonsai_requests_finished_total{reason="cancelled"}')
    stream = c.completions.create(model="x", prompt=PROMPTS[0], max_tokens=4000, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it)
    next(it)
    assert strict.metric("bonsai_slots_busy") == 1
    with pytest.raises(openai.RateLimitError):
        c.completions.create(model="x", prompt="Hello", max_tokens=2)
    stream.close()
    assert strict.wait_metric('bonsai_requests_finished_total{reason="cancelled"}', cancelled + 1) == cancelled + 1
    assert strict.wait_metric("bonsai_slots_busy", 0) == 0
    assert strict.metric("bonsai_kv_cached_tokens") == 0
    r = c.completions.create(model="x", prompt="Hello", max_tokens=2)
    assert r.usage.completion_tokens == 2


@engine
def test_plain_request_disconnect_frees_slot(strict):
    cancelled = strict.metric('bonsai_requests_finished_total{reason="cancelled"}')
    body = json.dumps({"prompt": PROMPTS[1], "max_tokens": 4000, "temperature": 0, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", strict.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
                  b"\r\n\r\n" + body)
        assert strict.wait_metric("bonsai_slots_busy", 1) == 1
    assert strict.wait_metric('bonsai_requests_finished_total{reason="cancelled"}', cancelled + 1) == cancelled + 1
    assert strict.wait_metric("bonsai_slots_busy", 0) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@engine
def test_bonsai_serve_command(tiny):
    """`bonsai serve` as a subprocess: serves, answers with the key, stops cleanly on SIGTERM."""
    import signal
    import subprocess
    import sys

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bonsai_runner", "serve", "--model", tiny, "--port", str(port),
                             "--parallel", "2", "--ctx-size", "128", "--threads", "2", "--api-key", KEY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    assert json.loads(r.read())["slots_idle"] == 2
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "bonsai serve did not come up"
                time.sleep(0.1)
        c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        assert c.completions.create(model="x", prompt="Hello", max_tokens=3).usage.completion_tokens <= 3
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    # uvicorn shuts down gracefully, then re-raises the signal it caught: exit status 0 or -SIGTERM
    assert proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in err, err


@engine
def test_serve_command_bad_input(tmp_path):
    from conftest import run_cli

    p = run_cli("serve", "--model", str(tmp_path / "missing.gguf"), timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == f"error: model file not found: {tmp_path / 'missing.gguf'}"
    p = run_cli("serve", "--model", "m.gguf", "--parallel", "0", timeout=60)
    assert p.returncode == 2 and "--parallel" in p.stderr
