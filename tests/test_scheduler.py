"""The continuous-batching scheduler alone (bonsai_runner.scheduler), on the tiny random llama GGUF
of test_llama_api_e2e: batched greedy output equals `Llama`'s one-request-at-a-time output, prefix
reuse (own slot and seq_cp from a busy slot) changes nothing but the work done, stop strings, EOG,
max_tokens and the slot context end requests, cancellation frees the slot and its KV at once, the
queue is bounded, bad parameters name themselves. Every wait is bounded."""

from __future__ import annotations

import pytest

from test_llama_api_e2e import engine, write_tiny_gguf

from bonsai_runner.errors import BonsaiError
from bonsai_runner.scheduler import (GenerationRequest, InvalidRequestError, QueueFullError, Scheduler,
                                     SchedulerUnavailableError)

PROMPTS = ["The answer is 42. Hello world, hello there!", "def add(a, b): return a + b", "你好世界 🙂",
           "Hello", "hello there! The answer", "return a + b. The answer is", "42", "world, hello there 你好"]
N_CTX = 96
TIMEOUT = 30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("scheduler") / "tiny.gguf"
    write_tiny_gguf(path)
    return str(path)


@pytest.fixture(scope="module")
def model(tiny):
    from bonsai_runner import _core

    m = _core.Model(tiny)
    yield m
    m.close()


@pytest.fixture(scope="module")
def eog(model):
    from bonsai_runner import _core
    from bonsai_runner.vocab_facts import end_of_generation_ids

    return end_of_generation_ids(_core, model, model.metadata, model.n_vocab, False)


@pytest.fixture(scope="module")
def reference(tiny):
    """Greedy texts of `Llama` (one request at a time, its own single-sequence context)."""
    from bonsai_runner import Llama

    with Llama(tiny, n_ctx=N_CTX, verbose=False) as llm:
        return {p: llm(p, max_tokens=24, temperature=0)["choices"][0]["text"] for p in PROMPTS}


@pytest.fixture
def make(model, eog):
    made = []

    def mk(**kw):
        kw.setdefault("n_ctx_slot", N_CTX)
        kw.setdefault("n_threads", 2)
        s = Scheduler(model, eog_ids=eog, **kw)
        made.append(s)
        return s

    yield mk
    for s in made:
        s.close()


def toks(model, text):
    return list(model.tokenize(text.encode(), add_special=True, parse_special=True))


def greedy(model, text, **kw):
    kw.setdefault("max_tokens", 24)
    return GenerationRequest(toks(model, text), temperature=0, **kw)


@engine
@pytest.mark.parametrize("cache_prompt", [True, False])
def test_batched_greedy_equals_sequential_llama(model, make, reference, cache_prompt):
    # n_batch 8 < the longer prompts: prefill chunks share steps with other slots' generated tokens
    s = make(n_parallel=4, n_batch=8, cache_prompt=cache_prompt)
    reqs = [s.submit(greedy(model, p)) for p in PROMPTS]
    got = {p: r.result(TIMEOUT)[0] for p, r in zip(PROMPTS, reqs)}
    assert got == reference
    st = s.stats()
    assert st["decode_steps_total"] < sum(len(r.completion_tokens) for r in reqs)  # tokens were batched
    assert st["slots_busy"] == 0 and st["queue_depth"] == 0
    if not cache_prompt:
        assert all(t == [] for t in s.slot_tokens())


@engine
def test_prefix_reuse_same_output(model, make, reference):
    s = make(n_parallel=2, cache_prompt=True)
    p = PROMPTS[0]
    a = s.submit(greedy(model, p))
    assert a.result(TIMEOUT)[0] == reference[p] and a.n_reused == 0
    b = s.submit(greedy(model, p))
    assert b.result(TIMEOUT)[0] == reference[p]
    assert b.n_reused == len(toks(model, p)) - 1  # all but the last prompt token came from the cache
    assert s.stats()["prompt_tokens_reused_total"] == b.n_reused


@engine
def test_prefix_shared_from_a_busy_slot(model, make, tiny):
    """A newcomer takes the prefix KV of a slot that is still generating (seq_cp)."""
    from bonsai_runner import Llama

    s = make(n_parallel=2, n_ctx_slot=2048, cache_prompt=True)
    base = PROMPTS[0]
    extended = base + " def add"
    long_run = s.submit(greedy(model, base, max_tokens=0, ignore_eos=True))  # runs until its slot context is full
    next(long_run.events(TIMEOUT))  # it is generating now
    b = s.submit(greedy(model, extended))
    text, _ = b.result(TIMEOUT)
    assert not long_run.done
    shared = len(toks(model, base))
    assert b.n_reused >= shared - 1
    long_run.cancel()
    assert long_run.wait(TIMEOUT) and long_run.finish_reason == "cancelled"
    with Llama(tiny, n_ctx=N_CTX, verbose=False) as llm:
        assert text == llm(extended, max_tokens=24, temperature=0)["choices"][0]["text"]


@engine
def test_stop_string_max_tokens_and_eog(model, make, reference, eog):
    p = PROMPTS[1]
    ref = reference[p]
    s = make(n_parallel=2)
    cut = ref[3:6]
    r = s.submit(greedy(model, p, stop=["zzzz-never", cut]))
    text, reason = r.result(TIMEOUT)
    assert reason == "stop" and text == ref[: ref.index(cut)]
    r = s.submit(greedy(model, p, max_tokens=5))
    assert r.result(TIMEOUT)[1] == "length" and len(r.completion_tokens) == 5
    # make the 4th greedy token an end-of-generation token: the request ends before it
    third = r.completion_tokens[3]
    s2 = Scheduler(model, eog_ids=set(eog) | {third}, n_parallel=1, n_ctx_slot=N_CTX, n_threads=2)
    try:
        r2 = s2.submit(greedy(model, p))
        assert r2.result(TIMEOUT)[1] == "stop" and r2.completion_tokens == r.completion_tokens[:3]
        r3 = s2.submit(greedy(model, p, ignore_eos=True))  # the EOG token is masked out of sampling
        assert r3.result(TIMEOUT)[1] == "length" and len(r3.completion_tokens) == 24
        assert r3.completion_tokens[:3] == r.completion_tokens[:3] and third not in r3.completion_tokens
    finally:
        s2.close()


@engine
def test_slot_context_limits_generation(model, make, eog):
    s = make(n_parallel=1, n_ctx_slot=32)
    prompt = toks(model, PROMPTS[0])
    r = s.submit(GenerationRequest(prompt, max_tokens=None, temperature=0, ignore_eos=True))
    assert r.result(TIMEOUT)[1] == "length"
    assert len(r.completion_tokens) == 32 - len(prompt)
    assert not set(r.completion_tokens) & set(eog)
    with pytest.raises(InvalidRequestError, match="slot holds 32") as e:
        s.submit(GenerationRequest(list(range(3, 40)), temperature=0))
    assert e.value.param == "prompt"


@engine
def test_cancel_frees_slot_and_kv(model, make):
    s = make(n_parallel=1, n_ctx_slot=4096, cache_prompt=True)
    r = s.submit(greedy(model, PROMPTS[0], max_tokens=0, ignore_eos=True))
    waiting = s.submit(greedy(model, PROMPTS[1]))
    next(r.events(TIMEOUT))
    waiting.cancel()
    r.cancel()
    assert r.wait(TIMEOUT) and waiting.wait(TIMEOUT)
    assert r.finish_reason == "cancelled" and waiting.finish_reason == "cancelled"
    assert len(r.completion_tokens) < 4096 - len(toks(model, PROMPTS[0]))
    assert s.slot_tokens() == [[]]  # the cancelled request's KV is gone, even with cache_prompt
    st = s.stats()
    assert st["slots_busy"] == 0 and st["queue_depth"] == 0 and st["finished"]["cancelled"] == 2
    ok = s.submit(greedy(model, PROMPTS[3], max_tokens=3))
    assert ok.result(TIMEOUT)[1] == "length"


@engine
def test_bounded_queue(model, make):
    s = make(n_parallel=1, n_ctx_slot=4096, queue_limit=1)
    running = s.submit(greedy(model, PROMPTS[0], max_tokens=0, ignore_eos=True))
    queued = s.submit(greedy(model, PROMPTS[1]))
    with pytest.raises(QueueFullError, match="busy"):
        s.submit(greedy(model, PROMPTS[2]))
    assert s.stats()["requests_rejected_total"] == 1
    running.cancel()
    assert queued.result(TIMEOUT)[1] in ("length", "stop")


@engine
def test_seeded_sampling_is_per_request(model, make):
    """Each request has its own sampler: a seeded request gives the same text alone and batched."""
    def req(p, seed):
        return GenerationRequest(toks(model, p), max_tokens=16, temperature=0.9, top_k=0, top_p=1.0,
                                 min_p=0.0, seed=seed)

    alone = make(n_parallel=1)
    solo = alone.submit(req(PROMPTS[2], 1234)).result(TIMEOUT)[0]
    s = make(n_parallel=4)
    reqs = [s.submit(req(p, 1234 if p == PROMPTS[2] else 7)) for p in PROMPTS[:4]]
    assert reqs[2].result(TIMEOUT)[0] == solo
    for r in reqs:
        r.wait(TIMEOUT)


@engine
@pytest.mark.parametrize("kw, param", [
    ({"temperature": -0.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": "5"}, "top_k"),
    ({"max_tokens": 1.5}, "max_tokens"), ({"stop": [1]}, "stop"), ({"seed": True}, "seed"),
    ({"repeat_penalty": 0}, "repeat_penalty"), ({"min_p": 2}, "min_p")])
def test_bad_parameters_name_themselves(kw, param):
    with pytest.raises(InvalidRequestError) as e:
        GenerationRequest([1, 2, 3], **kw)
    assert e.value.param == param


@engine
def test_invalid_token_and_empty_prompt(model, make):
    s = make(n_parallel=1)
    with pytest.raises(InvalidRequestError, match="invalid token id"):
        s.submit(GenerationRequest([1, model.n_vocab + 5]))
    with pytest.raises(InvalidRequestError, match="empty"):
        GenerationRequest([])


@engine
@pytest.mark.parametrize("kw, param", [
    ({"top_k": 3_000_000_000}, "top_k"), ({"repeat_last_n": 3_000_000_000}, "repeat_last_n"),
    ({"max_tokens": 2**31}, "max_tokens"), ({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"),
    ({"temperature": float("nan")}, "temperature"), ({"top_p": 10**400}, "top_p"),
    ({"fault": "explode"}, "fault"),
    # found by schemathesis: > 0 in Python, 0 as the sampler's C float (a 500 from _core.Sampler)
    ({"top_p": 5e-324}, "top_p"), ({"repeat_penalty": 5e-324}, "repeat_penalty")])
def test_out_of_range_parameters_name_their_range(kw, param):
    """Values the binding's C int / uint64 cannot hold are refused before they reach _core.Sampler
    (top_k 3e9 used to kill the scheduler thread with a pybind11 TypeError)."""
    with pytest.raises(InvalidRequestError) as e:
        GenerationRequest([1, 2, 3], **kw)
    assert e.value.param == param
    if param in ("top_k", "repeat_last_n", "max_tokens"):
        assert "2147483647" in str(e.value)


@engine
def test_huge_parameters_are_refused_and_scheduler_keeps_serving(model, make):
    s = make(n_parallel=1)
    for kw in ({"top_k": 3_000_000_000}, {"repeat_last_n": 3_000_000_000}):
        with pytest.raises(InvalidRequestError):
            s.submit(greedy(model, PROMPTS[3], max_tokens=2, **kw))
    assert s.submit(greedy(model, PROMPTS[3], max_tokens=2)).result(TIMEOUT)[1] == "length"


@engine
def test_failure_placing_one_request_fails_it_alone(model, make, reference):
    """A request whose _core.Sampler cannot be built (here: a top_k set after validation) ends with
    an error; its slot is freed, the thread lives on and serves the next request."""
    s = make(n_parallel=1)
    bad = greedy(model, PROMPTS[0])
    bad.top_k = 3_000_000_000  # bypasses GenerationRequest's check: the binding raises TypeError
    s.submit(bad)
    assert bad.wait(TIMEOUT) and bad.finish_reason == "error"
    with pytest.raises(BonsaiError, match="could not be started"):
        bad.result(0)
    assert s.health()["state"] == "ok" and s.stats()["slots_busy"] == 0
    assert s.submit(greedy(model, PROMPTS[0])).result(TIMEOUT)[0] == reference[PROMPTS[0]]
    assert s.stats()["finished"]["error"] == 1


@engine
def test_injected_faults_fail_one_request(model, make, reference):
    s = make(n_parallel=2, fault_injection=True)
    admit = s.submit(greedy(model, PROMPTS[1], fault="admit"))
    sample = s.submit(greedy(model, PROMPTS[2], fault="sample"))
    good = s.submit(greedy(model, PROMPTS[0]))
    assert admit.wait(TIMEOUT) and admit.finish_reason == "error"
    events = list(sample.events(TIMEOUT))
    assert events[-1].finish_reason == "error" and "fault='sample'" in events[-1].error
    assert len(sample.completion_tokens) == 1  # it had started: one token before the fault
    assert good.result(TIMEOUT)[0] == reference[PROMPTS[0]]  # batched with the failing one, unharmed
    st = s.stats()
    assert st["slots_busy"] == 0 and st["finished"]["error"] == 2
    assert s.submit(greedy(model, PROMPTS[1])).result(TIMEOUT)[0] == reference[PROMPTS[1]]


@engine
def test_fault_needs_fault_injection(model, make):
    s = make(n_parallel=1)
    with pytest.raises(InvalidRequestError, match="fault injection is disabled"):
        s.submit(greedy(model, PROMPTS[0], fault="admit"))


@engine
def test_health_reports_stall_then_recovery(model, make):
    import time

    s = make(n_parallel=1, fault_injection=True, stall_timeout=0.3)
    assert s.health()["state"] == "ok"
    r = s.submit(greedy(model, PROMPTS[0], max_tokens=3, fault="stall:1.5"))
    deadline = time.monotonic() + 5
    while s.health()["state"] != "stalled":
        assert time.monotonic() < deadline and not r.done, "the stall was never reported"
        time.sleep(0.05)
    assert "no scheduler progress" in s.health()["detail"]
    assert r.result(TIMEOUT)[1] == "length"
    assert s.health()["state"] == "ok"


@engine
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_thread_fails_requests_and_reports_stopped(model, make):
    s = make(n_parallel=1, n_ctx_slot=8192)  # room for ~8k tokens: it cannot finish before _step is replaced
    r = s.submit(greedy(model, PROMPTS[0], max_tokens=0, ignore_eos=True))
    next(r.events(TIMEOUT))

    def die():
        raise SystemExit("simulated thread death")

    s._step = die  # not a request's failure: the thread ends
    assert r.wait(TIMEOUT) and r.finish_reason == "error"
    s._thread.join(TIMEOUT)
    h = s.health()
    assert h["state"] == "stopped" and "simulated thread death" in h["detail"]
    with pytest.raises(SchedulerUnavailableError, match="stopped"):
        s.submit(greedy(model, PROMPTS[1]))


@engine
def test_slots_times_context_must_fit_the_engine(model, eog):
    with pytest.raises(BonsaiError, match="2147483647"):
        Scheduler(model, eog_ids=eog, n_parallel=4, n_ctx_slot=2_000_000_000)
