"""Hardening of the `Llama` API (issue #13): every integer/float parameter checked against the
engine's ranges (one BonsaiError, never a raw pybind11 TypeError), a directory as model_path, and
one Llama shared by several threads (every result equal to the sequential one; a stream left open
by one thread never blocks another forever). Runs on the native engine with a tiny random llama
GGUF (tests/tiny_gguf.py); skips when the engine is not built."""

from __future__ import annotations

import threading
import time

import pytest

from bonsai_runner.errors import BonsaiError


def _has_engine() -> bool:
    try:
        from bonsai_runner import _core
    except ImportError:
        return False
    return all(hasattr(_core, n) for n in ("Model", "Context", "Sampler"))


pytestmark = pytest.mark.skipif(not _has_engine(), reason="needs the native engine (scripts/dev_build.sh)")

PROMPTS = ["Hello world", "abc def", "The answer is", "one two three four", "x y z", "Once upon"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tiny_gguf import make_hf_weights, write_gguf

    cfg, w = make_hf_weights("llama", seed=3)
    path = tmp_path_factory.mktemp("hardening") / "tiny.gguf"
    write_gguf(path, cfg, w, vocab=True)
    return str(path)


@pytest.fixture
def llm(model_path):
    from bonsai_runner import Llama

    m = Llama(model_path, n_ctx=256, verbose=False)
    yield m
    m.close()


# ----- ranges -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, msg", [
    (dict(n_ctx=3_000_000_000), r"n_ctx must be an integer in \[0, 2147483647\], got 3000000000"),
    (dict(n_batch=2**31), r"n_batch must be an integer in \[1, 2147483647\]"),
    (dict(n_threads=2**40), r"n_threads must be an integer in \[0, 2147483647\]"),
    (dict(n_gpu_layers=2**31), r"n_gpu_layers must be an integer in \[-1, 2147483647\]"),
    (dict(n_gpu_layers=-2), r"n_gpu_layers must be an integer in \[-1, 2147483647\]"),
    (dict(seed=2**64), r"seed must be an integer in \[-1, 18446744073709551615\]"),
    (dict(stream_wait_s=float("nan")), r"stream_wait_s must be a number"),
])
def test_constructor_out_of_range_is_a_bonsai_error(model_path, kwargs, msg):
    from bonsai_runner import Llama

    with pytest.raises(BonsaiError, match=msg):
        Llama(model_path, verbose=False, **{"n_ctx": 64, **kwargs})


def test_constructor_accepts_the_range_ends(model_path):
    from bonsai_runner import Llama

    with Llama(model_path, n_ctx=64, seed=2**64 - 1, n_gpu_layers=-1, verbose=False) as m:
        assert m.n_ctx() == 64


SAMPLING_CASES = [
    (dict(top_k=3_000_000_000), r"top_k must be an integer in \[0, 2147483647\], got 3000000000"),
    (dict(top_k=-1), r"top_k must be an integer in \[0, 2147483647\]"),
    (dict(repeat_last_n=2**31), r"repeat_last_n must be an integer in \[-1, 2147483647\]"),
    (dict(repeat_last_n=-2), r"repeat_last_n must be an integer in \[-1, 2147483647\]"),
    (dict(seed=2**64), r"seed must be an integer in \[0, 18446744073709551615\]"),
    (dict(seed=-5), r"seed must be an integer in \[0, 18446744073709551615\]"),
    (dict(temperature=1e39), r"temperature must be a number in \[0\.0, 3\.40282"),  # inf as a C float
    (dict(temperature=float("nan")), r"temperature must be a number"),
    (dict(top_p=float("inf")), r"top_p must be a number in \(0\.0, 1\.0\]"),
    (dict(min_p=1.5), r"min_p must be a number in \[0\.0, 1\.0\]"),
    (dict(repeat_penalty=0.0), r"repeat_penalty must be a number in \(0\.0, .*1 = off"),
    (dict(repeat_penalty=1e300), r"repeat_penalty must be a number in \(0\.0, 3\.40282"),
    (dict(max_tokens=2**70), r"max_tokens must be an integer"),
    (dict(logprobs=2**31), r"logprobs must be an integer in \[0, 2147483647\]"),
]


@pytest.mark.parametrize("kwargs, msg", SAMPLING_CASES)
def test_completion_out_of_range_is_a_bonsai_error(llm, kwargs, msg):
    with pytest.raises(BonsaiError, match=msg):
        llm("Hi", **kwargs)
    with pytest.raises(BonsaiError, match=msg):  # streams check before the first chunk
        llm("Hi", stream=True, **kwargs)
    assert llm("Hi", max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2  # still usable


@pytest.mark.parametrize("kwargs, msg", [c for c in SAMPLING_CASES  # chat has no repeat_last_n
                                         if not {"max_tokens", "logprobs", "repeat_last_n"} & set(c[0])])
def test_chat_out_of_range_is_a_bonsai_error(llm, kwargs, msg):
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(BonsaiError, match=msg):
        llm.create_chat_completion(messages, **kwargs)
    with pytest.raises(BonsaiError, match=msg):
        llm.create_chat_completion(messages, stream=True, **kwargs)


def test_chat_top_logprobs_out_of_range(llm):
    with pytest.raises(BonsaiError, match=r"top_logprobs must be an integer in \[0, 2147483647\]"):
        llm.create_chat_completion([{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=2**40)


@pytest.mark.parametrize("kwargs, msg", [
    (dict(top_k=3_000_000_000), r"top_k must be an integer in \[0, 2147483647\]"),
    (dict(repeat_last_n=2**31), r"repeat_last_n must be an integer in \[-1, 2147483647\]"),
    (dict(seed=2**64), r"seed must be an integer in \[0, 18446744073709551615\]"),
    (dict(temp=1e39), r"temperature must be a number in \[0\.0, 3\.40282"),
])
def test_generate_checks_its_arguments_when_called(llm, kwargs, msg):
    tokens = llm.tokenize(b"Hi")
    with pytest.raises(BonsaiError, match=msg):
        llm.generate(tokens, **kwargs)  # at the call, not at the first next()


def test_repeat_last_n_minus_one_means_the_whole_history(llm):
    r = llm("Hello world", max_tokens=4, temperature=0, repeat_last_n=-1, repeat_penalty=1.3)
    assert r["usage"]["completion_tokens"] == 4


def test_seed_up_to_uint64_is_accepted_and_deterministic(llm):
    a = llm("Hello", max_tokens=6, temperature=1.0, seed=2**64 - 1)["choices"][0]["text"]
    b = llm("Hello", max_tokens=6, temperature=1.0, seed=2**64 - 1)["choices"][0]["text"]
    assert a == b


def test_lone_surrogate_in_prompt_is_a_bonsai_error(llm):
    with pytest.raises(BonsaiError, match="not valid Unicode text"):
        llm("a\ud800b", max_tokens=1)
    with pytest.raises(BonsaiError, match="not valid Unicode text"):
        llm.tokenize("\udcff")


# ----- model_path ---------------------------------------------------------------------------

def test_directory_as_model_path_says_it_is_a_directory(tmp_path):
    from bonsai_runner import Llama

    with pytest.raises(BonsaiError, match="is a directory, not a model file"):
        Llama(str(tmp_path))
    with pytest.raises(BonsaiError, match="model file not found"):
        Llama(str(tmp_path / "missing.gguf"))
    with pytest.raises(BonsaiError, match="model_path must be a path"):
        Llama(42)


# ----- threads ------------------------------------------------------------------------------

def _complete(llm, prompt, stream, chat):
    kw = dict(max_tokens=10, temperature=0)
    if chat:
        messages = [{"role": "user", "content": prompt}]
        if stream:
            return "".join(c["choices"][0]["delta"].get("content", "")
                           for c in llm.create_chat_completion(messages, stream=True, **kw))
        return llm.create_chat_completion(messages, **kw)["choices"][0]["message"]["content"]
    if stream:
        return "".join(c["choices"][0]["text"] for c in llm(prompt, stream=True, **kw))
    return llm(prompt, **kw)["choices"][0]["text"]


def test_three_threads_sharing_one_llama_get_the_sequential_results(llm):
    jobs = [(p, stream, chat) for p in PROMPTS for stream in (False, True) for chat in (False, True)]
    expected = {j: _complete(llm, *j) for j in jobs}
    assert len(set(expected.values())) > 1  # distinct prompts give distinct texts
    got: dict = {}
    errors: list = []

    def worker(k):
        try:
            for rnd in range(3):
                for i, j in enumerate(jobs):
                    if (i + k + rnd) % 3 == 0:
                        got.setdefault(j, []).append(_complete(llm, *j))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sum(len(v) for v in got.values()) == 3 * len(jobs)
    for j, texts in got.items():
        assert all(t == expected[j] for t in texts), (j, texts, expected[j])


def test_stream_consumed_slowly_by_one_thread_waits_for_its_end(llm):
    want_stream = _complete(llm, "Hello world", True, False)
    want_other = _complete(llm, "abc def", False, False)
    stream = llm("Hello world", max_tokens=10, temperature=0, stream=True)
    first = next(stream)["choices"][0]["text"]
    other: list = []
    t = threading.Thread(target=lambda: other.append(_complete(llm, "abc def", False, False)))
    t.start()
    time.sleep(0.3)
    assert not other  # waiting: the stream still holds the Llama
    rest = "".join(c["choices"][0]["text"] for c in stream)
    t.join(timeout=60)
    assert first + rest == want_stream and other == [want_other]


def test_stream_left_open_by_another_thread_is_a_clear_error_not_a_deadlock(model_path):
    from bonsai_runner import Llama

    with Llama(model_path, n_ctx=256, verbose=False, stream_wait_s=0.5) as llm:
        want = _complete(llm, "abc def", False, False)
        held: list = []
        started = threading.Event()

        def opener():
            s = llm("Hello world", max_tokens=10, temperature=0, stream=True)
            next(s)
            held.append(s)  # kept open, never read again by this thread
            started.set()

        threading.Thread(target=opener).start()
        assert started.wait(30)
        t0 = time.monotonic()
        with pytest.raises(BonsaiError, match="held by a stream that another thread opened"):
            llm("abc def", max_tokens=10, temperature=0)
        assert time.monotonic() - t0 < 10
        held[0].close()  # closing it from this thread frees the Llama
        assert _complete(llm, "abc def", False, False) == want


def test_stream_opened_in_one_thread_can_be_read_in_another(llm):
    want = _complete(llm, "Once upon", True, True)
    s = llm.create_chat_completion([{"role": "user", "content": "Once upon"}], max_tokens=10,
                                   temperature=0, stream=True)
    head = next(s)["choices"][0]["delta"].get("content", "")
    out: list = []
    t = threading.Thread(target=lambda: out.append(
        "".join(c["choices"][0]["delta"].get("content", "") for c in s)))
    t.start()
    t.join(timeout=60)
    assert out and head + out[0] == want
    assert _complete(llm, "Once upon", True, True) == want


def test_abandoned_stream_is_released_when_collected(model_path):
    import gc

    from bonsai_runner import Llama

    with Llama(model_path, n_ctx=256, verbose=False, stream_wait_s=30) as llm:
        want = _complete(llm, "x y z", False, False)

        def abandon():
            s = llm("Hello world", max_tokens=10, temperature=0, stream=True)
            next(s)  # dropped without close: collected when the thread's frame ends

        t = threading.Thread(target=abandon)
        t.start()
        t.join()
        gc.collect()
        t0 = time.monotonic()
        assert _complete(llm, "x y z", False, False) == want
        assert time.monotonic() - t0 < 10


def test_same_thread_call_while_its_stream_is_open_interrupts_the_stream(llm):
    s = llm("Hello world", max_tokens=10, temperature=0, stream=True)
    next(s)
    want = _complete(llm, "abc def", False, False)  # same thread: runs at once
    with pytest.raises(BonsaiError, match="interrupted"):
        list(s)
    assert _complete(llm, "abc def", False, False) == want


def test_close_from_another_thread_waits_for_the_call_in_progress(model_path):
    from bonsai_runner import Llama

    llm = Llama(model_path, n_ctx=256, verbose=False)
    result: list = []
    errors: list = []

    def long_call():
        try:
            result.append(llm("Hello world", max_tokens=200, temperature=0))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=long_call)
    t.start()
    time.sleep(0.05)
    llm.close()  # must not free the context under the running decode
    t.join(timeout=60)
    assert not errors and result and result[0]["usage"]["completion_tokens"] > 0
    with pytest.raises(BonsaiError, match="closed"):
        llm("Hi", max_tokens=1)
