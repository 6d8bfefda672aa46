"""Server parity with llama-server / the OpenAI API (bonsai_runner.server): logprobs on completions
and chat (streamed and not), /v1/models/{id}, /tokenize, /detokenize, /props, /slots, CORS, the
access log, Retry-After on 429, multi-part text content, and the refusal of known generation
fields the server does not implement. On the tiny random llama GGUF of test_llama_api_e2e, with the
in-process uvicorn server of test_server."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from test_llama_api_e2e import engine
from test_server import KEY, MESSAGES, N_CTX, PROMPTS, _free_port, _Server, tiny  # noqa: F401 (tiny: fixture)

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

ORIGIN = "http://app.example:3000"


@pytest.fixture(scope="module")
def llama(tiny):  # noqa: F811
    from bonsai_runner import Llama

    llm = Llama(tiny, n_ctx=N_CTX, verbose=False, logits_all=True)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def server(tiny):  # noqa: F811
    from bonsai_runner.server import ServingEngine

    s = _Server(ServingEngine(tiny, n_parallel=4, n_ctx_slot=N_CTX, n_batch=64, n_threads=2),
                cors_origins=[ORIGIN])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict(tiny):  # noqa: F811
    """One slot, no waiting room, an API key."""
    from bonsai_runner.server import ServingEngine

    s = _Server(ServingEngine(tiny, n_parallel=1, n_ctx_slot=4096, queue_limit=0, n_threads=2), api_key=KEY)
    yield s
    s.stop()


def _request(server, path, body=None, method=None, headers=None, key=None):
    """(status, headers, parsed JSON body or text) of one request."""
    data = None if body is None else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    if key:
        h["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(server.url + path, data=data, method=method or ("POST" if data else "GET"),
                                 headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, hdrs, raw = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, e.headers, e.read().decode()
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw


def _log_softmax(row):
    x = np.asarray(row, dtype=np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


# ---- logprobs -------------------------------------------------------------------------------

def test_token_logprob_is_the_log_softmax_of_the_raw_row():
    from bonsai_runner.scheduler import token_logprob

    rng = np.random.default_rng(3)
    row = rng.normal(size=1000).astype(np.float32) * 4
    row[17] = row[18] = row.max() + 1  # a tie: the lower id first
    lp = _log_softmax(row)
    e = token_logprob(row, 400, 5)
    assert e.token == 400 and e.logprob == pytest.approx(lp[400], abs=1e-12)
    assert [t for t, _ in e.top] == list(np.lexsort((np.arange(1000), -lp))[:5])
    assert [v for _, v in e.top] == pytest.approx(sorted(lp, reverse=True)[:5], abs=1e-12)
    assert token_logprob(row, 3, 0).top == [] and len(token_logprob(row, 3, 5000).top) == 1000


@engine
def test_completion_logprobs_are_the_log_softmax_of_the_logits(server, llama):
    c = server.client()
    p = PROMPTS[0]
    r = c.completions.create(model="x", prompt=p, max_tokens=12, temperature=0, logprobs=3)
    want = llama(p, max_tokens=12, temperature=0, logprobs=3)
    assert r.choices[0].text == want["choices"][0]["text"]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 12
    assert lp.tokens == want["choices"][0]["logprobs"]["tokens"]
    assert lp.text_offset == want["choices"][0]["logprobs"]["text_offset"]
    assert lp.text_offset[0] == len(p)
    # the same values computed here: greedy decoding by hand, log-softmax of each raw logits row
    llama.reset()
    llama.eval(llama.tokenize(p.encode()))
    for i in range(12):
        ref = _log_softmax(llama.scores[llama.n_tokens - 1])
        tok = int(np.argmax(ref))
        assert lp.tokens[i] == llama._piece(tok).decode("utf-8", "ignore")
        assert lp.token_logprobs[i] == pytest.approx(ref[tok], abs=2e-3)
        top = lp.top_logprobs[i]
        assert 1 <= len(top) <= 3 and list(top.values()) == sorted(top.values(), reverse=True)
        assert max(top.values()) == pytest.approx(lp.token_logprobs[i], abs=1e-9)  # greedy: the sampled one
        best3 = sorted(ref, reverse=True)[:3]
        assert all(min(abs(v - b) for b in best3) < 2e-3 for v in top.values())
        llama.eval([tok])
    # logprobs=0: the sampled token only
    r0 = c.completions.create(model="x", prompt=p, max_tokens=4, temperature=0, logprobs=0)
    assert [list(t.values()) for t in r0.choices[0].logprobs.top_logprobs] == \
        [[v] for v in r0.choices[0].logprobs.token_logprobs]
    assert r0.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[:4], abs=1e-9)


@engine
def test_completion_logprobs_streamed_equal_non_streamed(server):
    c = server.client()
    p = PROMPTS[2]  # multi-byte characters: text held back over several tokens
    r = c.completions.create(model="x", prompt=p, max_tokens=20, temperature=0, logprobs=2)
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    text = []
    for chunk in c.completions.create(model="x", prompt=p, max_tokens=20, temperature=0, logprobs=2, stream=True):
        ch = chunk.choices[0]
        text.append(ch.text)
        if ch.logprobs is not None:
            assert ch.text or ch.finish_reason is None
            for k in merged:
                merged[k].extend(getattr(ch.logprobs, k))
    assert "".join(text) == r.choices[0].text
    want = r.choices[0].logprobs.model_dump()
    # the same tokens and offsets; values equal up to float noise (the second run reuses the cached
    # prompt and evaluates a batch of another size, which may take another kernel path)
    assert merged["tokens"] == want["tokens"] and merged["text_offset"] == want["text_offset"]
    assert merged["token_logprobs"] == pytest.approx(want["token_logprobs"], abs=1e-4)
    for got_top, want_top in zip(merged["top_logprobs"], want["top_logprobs"], strict=True):
        assert got_top.keys() == want_top.keys()
        assert list(got_top.values()) == pytest.approx(list(want_top.values()), abs=1e-4)
    plain = c.completions.create(model="x", prompt=p, max_tokens=20, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].text == r.choices[0].text


@engine
def test_chat_logprobs_plain_and_streamed(server, llama):
    c = server.client()
    r = c.chat.completions.create(model="x", messages=MESSAGES, temperature=0, max_tokens=10, logprobs=True,
                                  top_logprobs=4)
    want = llama.create_chat_completion(MESSAGES, temperature=0, max_tokens=10, logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert len(content) == r.usage.completion_tokens
    assert [t.logprob for t in content] == pytest.approx(
        [t["logprob"] for t in want["choices"][0]["logprobs"]["content"]], abs=2e-3)
    for t in content:
        assert len(t.top_logprobs) == 4
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] == pytest.approx(t.logprob, abs=1e-9)
        assert t.bytes is not None and bytes(t.bytes).decode("utf-8", "ignore") == t.token
        assert math.fsum(math.exp(v) for v in values) <= 1 + 1e-9
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace") == r.choices[0].message.content
    streamed = []
    for chunk in c.chat.completions.create(model="x", messages=MESSAGES, temperature=0, max_tokens=10,
                                           logprobs=True, top_logprobs=4, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.content)
    assert [(t.token, t.bytes, [a.token for a in t.top_logprobs]) for t in streamed] == \
        [(t.token, t.bytes, [a.token for a in t.top_logprobs]) for t in content]
    assert [v for t in streamed for v in [t.logprob] + [a.logprob for a in t.top_logprobs]] == pytest.approx(
        [v for t in content for v in [t.logprob] + [a.logprob for a in t.top_logprobs]], abs=1e-4)
    r0 = c.chat.completions.create(model="x", messages=MESSAGES, temperature=0, max_tokens=3, logprobs=True)
    assert all(t.top_logprobs == [] for t in r0.choices[0].logprobs.content)
    off = c.chat.completions.create(model="x", messages=MESSAGES, temperature=0, max_tokens=3)
    assert off.choices[0].logprobs is None


@engine
@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": 1, "echo": True}, "logprobs"),
])
def test_bad_logprobs_are_400(server, path, body, param):
    full = {**body, **({"messages": MESSAGES} if "chat" in path else {"prompt": "Hello"})}
    status, _, err = _request(server, path, full)
    assert status == 400 and err["error"]["param"] == param, err


# ---- llama-server endpoints -----------------------------------------------------------------

@engine
def test_model_by_id(server):
    c = server.client()
    m = c.models.retrieve("tiny.gguf")
    assert m.id == "tiny.gguf" and m.owned_by == "bonsai-runner"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found" and "tiny.gguf" in e.value.body["message"]


@engine
def test_tokenize_and_detokenize(server, llama):
    text = PROMPTS[2] + " <unk>"
    status, _, r = _request(server, "/tokenize", {"content": text})
    assert status == 200 and r["tokens"] == llama.tokenize(text.encode(), add_bos=False, special=True)
    _, _, with_bos = _request(server, "/tokenize", {"content": text, "add_special": True})
    assert with_bos["tokens"] == llama.tokenize(text.encode(), add_bos=True, special=True)
    _, _, plain = _request(server, "/tokenize", {"content": text, "parse_special": False})
    assert plain["tokens"] == llama.tokenize(text.encode(), add_bos=False, special=False)
    _, _, pieces = _request(server, "/tokenize", {"content": text, "with_pieces": True})
    assert [p["id"] for p in pieces["tokens"]] == r["tokens"]
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                      for p in pieces["tokens"])
    assert joined.decode() == text
    status, _, back = _request(server, "/detokenize", {"tokens": r["tokens"]})
    assert status == 200 and back == {"content": text}
    assert _request(server, "/detokenize", {"tokens": []})[2] == {"content": ""}
    for path, body, param in (("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
                              ("/detokenize", {"tokens": [-1]}, "tokens"),
                              ("/detokenize", {"tokens": "1 2"}, "tokens"), ("/detokenize", {}, "tokens"),
                              ("/tokenize", {}, "content"), ("/tokenize", {"content": 5}, "content"),
                              ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces")):
        status, _, err = _request(server, path, body)
        assert status == 400 and err["error"]["param"] == param, (path, body, err)


@engine
def test_props(server, tiny):  # noqa: F811
    status, _, p = _request(server, "/props")
    assert status == 200
    assert p["total_slots"] == 4 and p["model_path"] == tiny and p["build_info"].startswith("bonsai-runner ")
    assert p["default_generation_settings"]["n_ctx"] == N_CTX
    assert p["default_generation_settings"]["params"]["temperature"] == 0.8
    assert "<|im_start|>" in p["chat_template"]  # the tiny model has no template: ChatML
    assert p["modalities"] == {"vision": False, "audio": False}
    assert all(v is not None for v in p.values())


@engine
def test_slots_show_the_running_request(strict):
    status, _, idle = _request(strict, "/slots", key=KEY)
    assert status == 200 and len(idle) == 1 and idle[0]["is_processing"] is False and idle[0]["n_ctx"] == 4096
    assert "id_task" not in idle[0]
    assert _request(strict, "/slots")[0] == 401
    c = strict.client(KEY)
    stream = c.completions.create(model="x", prompt=PROMPTS[0], max_tokens=4000, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True})
    it = iter(stream)
    for _ in range(3):
        next(it)
    _, _, busy = _request(strict, "/slots", key=KEY)
    stream.close()
    s = busy[0]
    assert s["is_processing"] is True and s["id_task"] >= 1 and s["n_decoded"] >= 2
    n_prompt = _request(strict, "/tokenize", {"content": PROMPTS[0], "add_special": True}, key=KEY)[2]["tokens"]
    assert s["n_prompt_tokens"] == len(n_prompt)
    assert strict.wait_metric("bonsai_slots_busy", 0) == 0


# ---- CORS, access log, Retry-After --------------------------------------------------------------

@engine
def test_cors(server, strict):
    status, h, _ = _request(server, "/v1/chat/completions", method="OPTIONS",
                            headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Headers": "authorization,content-type"})
    assert status == 200 and h["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in h["Access-Control-Allow-Methods"]
    assert "authorization" in h["Access-Control-Allow-Headers"].lower()
    status, h, _ = _request(server, "/v1/models", headers={"Origin": ORIGIN})
    assert status == 200 and h["Access-Control-Allow-Origin"] == ORIGIN
    status, h, _ = _request(server, "/v1/models", headers={"Origin": "http://evil.example"})
    assert status == 200 and "Access-Control-Allow-Origin" not in h
    # without --cors-origins: no CORS headers, and a preflight is not answered as one
    status, h, _ = _request(strict, "/v1/models", headers={"Origin": ORIGIN}, key=KEY)
    assert status == 200 and "Access-Control-Allow-Origin" not in h
    status, h, _ = _request(strict, "/v1/models", method="OPTIONS",
                            headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"})
    assert status == 405 and "Access-Control-Allow-Origin" not in h


def _access_lines(caplog, path):
    return [r.getMessage() for r in caplog.records if r.name == "bonsai_runner.server" and f" {path} " in
            r.getMessage()]


def _wait_lines(caplog, path, n, timeout=10):
    deadline = time.monotonic() + timeout
    while len(_access_lines(caplog, path)) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return _access_lines(caplog, path)


@engine
def test_access_log(server, caplog):
    caplog.set_level(logging.INFO, logger="bonsai_runner.server")
    c = server.client()
    c.completions.create(model="x", prompt="Hello", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    n = len(server.engine.completion_tokens("Hello")[0])
    line, = _wait_lines(caplog, "/v1/completions", 1)
    assert line.startswith(f"POST /v1/completions 200 prompt_tokens={n} completion_tokens=3 finish=length ")
    assert line.endswith(" ms") and float(line.split()[-2]) > 0
    list(c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=2, temperature=0, stream=True,
                                   extra_body={"ignore_eos": True}))
    line, = _wait_lines(caplog, "/v1/chat/completions", 1)  # the stream has ended when it is logged
    assert " 200 prompt_tokens=" in line and " completion_tokens=2 finish=length " in line
    _request(server, "/v1/completions", {"prompt": "Hello", "top_k": "x"})
    _request(server, "/v1/nothing")
    assert _wait_lines(caplog, "/v1/completions", 2)[-1].startswith("POST /v1/completions 400 ")
    line, = _wait_lines(caplog, "/v1/nothing", 1)
    assert line.startswith("GET /v1/nothing 404 ") and "prompt_tokens" not in line


@engine
def test_access_log_of_a_failed_request(tiny, caplog):  # noqa: F811
    from bonsai_runner.server import ServingEngine

    caplog.set_level(logging.INFO, logger="bonsai_runner.server")
    s = _Server(ServingEngine(tiny, n_parallel=1, n_ctx_slot=N_CTX, n_threads=2, fault_injection=True))
    try:
        status, _, _ = _request(s, "/v1/completions", {"prompt": "Hello", "debug_fault": "admit"})
        assert status == 500
        line, = _wait_lines(caplog, "/v1/completions", 1)
        assert line.startswith("POST /v1/completions 500 prompt_tokens=") and "finish=error" in line
        s.engine.scheduler.slots = lambda: 1 / 0  # an unexpected exception in a handler
        status, _, body = _request(s, "/slots")
        assert status == 500 and "ZeroDivisionError" in body["error"]["message"]
        line, = _wait_lines(caplog, "/slots", 1)
        assert line.startswith("GET /slots 500 ")
    finally:
        s.stop()


@engine
def test_retry_after_on_429(strict):
    c = strict.client(KEY)
    c.completions.create(model="x", prompt="Hello", max_tokens=3)  # one served request: a mean to go by
    stream = c.completions.create(model="x", prompt=PROMPTS[0], max_tokens=4000, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it)
    try:
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model="x", prompt="Hello", max_tokens=2)
        stats = strict.engine.scheduler.stats()
    finally:
        stream.close()
    retry = e.value.response.headers["retry-after"]
    mean = stats["served_seconds_sum"] / stats["served_count"]
    assert retry == str(min(max(math.ceil(mean / 1), 1), 60))
    assert strict.wait_metric("bonsai_slots_busy", 0) == 0


def test_retry_after_rule():
    """The documented rule on the scheduler's counters, without an engine: ceil(mean seconds per
    served request / slots), within 1..60, and 1 before anything was served."""
    from bonsai_runner.scheduler import Scheduler

    s = Scheduler.__new__(Scheduler)
    s.n_parallel = 4
    s._metrics = {"served_count": 0, "served_seconds_sum": 0.0}
    assert s._retry_after() == 1
    s._metrics = {"served_count": 2, "served_seconds_sum": 20.0}  # 10 s each over 4 slots: 2.5 s
    assert s._retry_after() == 3
    s._metrics = {"served_count": 1, "served_seconds_sum": 1e6}
    assert s._retry_after() == 60


# ---- chat content parts -----------------------------------------------------------------------

PARTS = [{"role": "system", "content": [{"type": "text", "text": "You add "}, {"type": "text", "text": "numbers."}]},
         {"role": "user", "content": [{"type": "text", "text": "What is 40 + 2?"}]}]


def test_content_parts_render_as_their_text():
    from bonsai_runner.chat_template import ChatTemplate
    from bonsai_runner.errors import BonsaiError

    t = ChatTemplate()
    assert t.render(PARTS, text_only=True) == t.render(MESSAGES)
    # without text_only the parts reach the template as they are (a template may render them itself)
    assert ChatTemplate("{{ messages[0]['content'][1]['text'] }}").render(PARTS) == "numbers."
    for part, word in (({"type": "image_url", "image_url": {"url": "http://x/y.png"}}, "'image_url'"),
                       ({"type": "input_audio", "input_audio": {}}, "'input_audio'"),
                       ({"text": "no type"}, "without a string 'type'"), ({"type": "text"}, "string 'text'"),
                       ("just a string", "a str")):
        with pytest.raises(BonsaiError) as e:
            t.render([{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}], text_only=True)
        assert word in str(e.value) and "messages[0]['content'][1]" in str(e.value)
        assert isinstance(e.value, ValueError)


@engine
def test_content_parts_in_the_server_and_llama(server, llama):
    c = server.client()
    want = c.chat.completions.create(model="x", messages=MESSAGES, temperature=0, max_tokens=8)
    got = c.chat.completions.create(model="x", messages=PARTS, temperature=0, max_tokens=8)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    local = llama.create_chat_completion(PARTS, temperature=0, max_tokens=8)
    assert local["choices"][0]["message"]["content"] == want.choices[0].message.content
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=image)
    assert e.value.body["param"] == "messages" and "image_url" in e.value.body["message"]
    with pytest.raises(ValueError, match="image_url"):
        llama.create_chat_completion(image)


# ---- fields the server does not implement -----------------------------------------------------

@engine
@pytest.mark.parametrize("path,field,value", [
    ("/v1/completions", "typical_p", 0.5), ("/v1/completions", "mirostat", 2), ("/v1/completions", "n_probs", 3),
    ("/v1/completions", "grammar", "root ::= no_such_rule"), ("/v1/completions", "json_schema", {"type": "no"}),
    ("/v1/completions", "n_predict", 5), ("/v1/completions", "dry_multiplier", 0.8),
    ("/v1/completions", "xtc_probability", 0.5), ("/v1/completions", "samplers", ["top_k"]),
    ("/v1/completions", "typical_p", True),
    ("/v1/chat/completions", "modalities", ["text", "audio"]), ("/v1/chat/completions", "audio", {"voice": "x"}),
    ("/v1/chat/completions", "functions", [{"name": "f"}]), ("/v1/chat/completions", "reasoning_effort", "low"),
    ("/v1/chat/completions", "response_format", {"type": "xml"}),
    ("/v1/chat/completions", "chat_template_kwargs", {"messages": []}),
    ("/v1/chat/completions", "chat_template_kwargs", "enable_thinking"),
])
def test_unhonoured_fields_are_400(server, path, field, value):
    base = {"messages": MESSAGES} if "chat" in path else {"prompt": "Hello"}
    status, _, err = _request(server, path, {**base, "max_tokens": 2, field: value})
    assert status == 400 and err["error"]["param"] == field and field in err["error"]["message"], err


@engine
@pytest.mark.parametrize("path,field,value", [
    ("/v1/completions", "typical_p", 1), ("/v1/completions", "mirostat", 0), ("/v1/completions", "grammar", ""),
    ("/v1/completions", "samplers", None), ("/v1/completions", "some_vendor_extension", {"x": 1}),
    ("/v1/chat/completions", "tool_choice", "auto"), ("/v1/chat/completions", "modalities", ["text"]),
    ("/v1/chat/completions", "user", "u-1"), ("/v1/chat/completions", "store", False),
])
def test_off_values_and_unknown_fields_are_accepted(server, path, field, value):
    base = {"messages": MESSAGES} if "chat" in path else {"prompt": "Hello"}
    status, _, r = _request(server, path, {**base, "max_tokens": 2, field: value})
    assert status == 200 and r["usage"]["completion_tokens"] <= 2, r


@engine
def test_chat_template_kwargs_reach_the_template(tiny):  # noqa: F811
    from bonsai_runner.server import ServingEngine

    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if greeting is defined %}{{ greeting }}\n{% endif %}assistant:")
    s = _Server(ServingEngine(tiny, n_parallel=1, n_ctx_slot=N_CTX, n_threads=2, chat_template=template))
    try:
        c = s.client()
        plain = c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=1)
        more = c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=1,
                                         extra_body={"chat_template_kwargs": {"greeting": "Hello there friend"}})
        extra = len(s.engine._vocab.tokenize(b"Hello there friend\n", add_special=False, parse_special=True))
        assert more.usage.prompt_tokens - plain.usage.prompt_tokens in (extra - 1, extra, extra + 1)
    finally:
        s.stop()


# ---- the command line -------------------------------------------------------------------------

@engine
def test_serve_flags_cors_and_access_log(tiny):  # noqa: F811
    def serve(*extra):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "bonsai_runner", "serve", "--model", tiny, "--port",
                                 str(port), "--parallel", "1", "--ctx-size", "128", "--threads", "1", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        try:
            while True:
                assert proc.poll() is None, proc.communicate()[1]
                try:
                    urllib.request.urlopen(url + "/health", timeout=2).close()
                    break
                except (urllib.error.URLError, ConnectionError):
                    assert time.monotonic() < deadline, "bonsai serve did not come up"
                    time.sleep(0.1)
            req = urllib.request.Request(url + "/v1/completions", method="POST", headers={
                "Content-Type": "application/json", "Origin": "http://any.example"},
                data=json.dumps({"prompt": "Hello", "max_tokens": 2, "ignore_eos": True}).encode())
            with urllib.request.urlopen(req, timeout=30) as r:
                allow = r.headers.get("Access-Control-Allow-Origin")
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=20)
        return allow, err

    allow, err = serve("--cors-origins", "*")
    assert allow == "*"
    lines = [ln for ln in err.splitlines() if "POST /v1/completions 200" in ln]
    assert len(lines) == 1 and "completion_tokens=2" in lines[0] and lines[0].endswith(" ms"), err
    assert "GET /health 200" in err
    allow, err = serve("--no-access-log")
    assert allow is None and "/v1/completions" not in err and "/health" not in err, err


def test_cors_origins_flag_parsing():
    from bonsai_runner.commands.serve import _origins

    assert _origins("*") == ["*"]
    assert _origins("http://a.example:3000, https://b.example/") == ["http://a.example:3000", "https://b.example"]
    import argparse

    for bad in ("", "a.example", "ftp://a.example", "*,http://a.example", "http://a.example/path"):
        with pytest.raises(argparse.ArgumentTypeError):
            _origins(bad)


@engine
def test_openapi_describes_the_new_routes_and_fields(server):
    status, _, doc = _request(server, "/openapi.json")
    assert status == 200
    assert {"/v1/models/{model_id}", "/tokenize", "/detokenize", "/props", "/slots"} <= set(doc["paths"])
    assert "404" in doc["paths"]["/v1/models/{model_id}"]["get"]["responses"]
    assert "Retry-After" in doc["paths"]["/v1/completions"]["post"]["responses"]["429"]["headers"]
    schemas = doc["components"]["schemas"]
    assert schemas["CompletionRequest"]["properties"]["logprobs"]["maximum"] == 20
    assert schemas["ChatCompletionRequest"]["properties"]["top_logprobs"]["maximum"] == 20
    assert schemas["CompletionRequest"]["properties"]["typical_p"]["enum"] == [1]
    assert "tool_choice" in schemas["ChatCompletionRequest"]["properties"]
    assert "tool_choice" not in schemas["CompletionRequest"]["properties"]
