"""logit_bias and the frequency / presence penalties (sampling.h), end to end:

- the C++ sampler's adjusted logits (`_core.Sampler.adjust`) against a float64 numpy reference of
  the arithmetic on fixed logits and histories, for several parameter sets;
- on the tiny llama GGUF through `Llama`: a banned token never appears (greedy and sampled), a large
  positive bias forces a token, zero penalties leave greedy output unchanged, and every greedy token
  of a penalized run is the argmax of the reference-adjusted logits of its position;
- the server (/v1/completions and /v1/chat/completions): the same fields, and their 400s;
- bonsai_run's --logit-bias / --frequency-penalty / --presence-penalty, single and --parallel.
"""

from __future__ import annotations

import codecs
import json
import subprocess

import numpy as np
import pytest

from conftest import bonsai_run_path
from test_llama_api_e2e import engine, write_tiny_gguf

openai = pytest.importorskip("openai")


def reference_adjust(logits, history, repeat_last_n, repeat_penalty=1.0, frequency_penalty=0.0,
                     presence_penalty=0.0, logit_bias=None):
    """The adjustment of sampling.h in float64: bias (<= -100 bans), then per token of the last
    repeat_last_n accepted ones: repeat penalty, minus count * frequency, minus presence."""
    out = np.asarray(logits, dtype=np.float64).copy()
    for t, b in (logit_bias or {}).items():
        out[t] = -np.inf if b <= -100 else out[t] + b
    window = [] if repeat_last_n == 0 else history if repeat_last_n < 0 else history[-repeat_last_n:]
    tokens, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    for t, c in zip(tokens, counts):
        x = out[t]
        x = x / repeat_penalty if x > 0 else x * repeat_penalty
        out[t] = x - c * frequency_penalty - presence_penalty
    return out


CASES = [
    dict(repeat_last_n=64, frequency_penalty=0.5, presence_penalty=0.25),
    dict(repeat_last_n=8, frequency_penalty=-0.75, presence_penalty=1.5, repeat_penalty=1.2),
    dict(repeat_last_n=-1, frequency_penalty=2.0, presence_penalty=-2.0, logit_bias={3: 7.5, 4: -100.0, 9: -3.0}),
    dict(repeat_last_n=0, frequency_penalty=1.0, presence_penalty=1.0, logit_bias={0: -np.inf, 11: 0.125}),
]


@pytest.mark.parametrize("case", CASES)
def test_adjust_matches_float64_reference(case):
    core = pytest.importorskip("bonsai_runner._core")
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal(97) * 4).astype(np.float32)
    history = rng.integers(0, 30, size=50).tolist()
    s = core.Sampler(temp=0.7, seed=1, **case)
    for t in history:
        s.accept(t)
    got = s.adjust(logits).astype(np.float64)
    want = reference_adjust(logits, history, **case)
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-5)
    assert not np.allclose(got[finite], logits.astype(np.float64)[finite]) or case["repeat_last_n"] == 0


def test_sampler_parameter_errors():
    core = pytest.importorskip("bonsai_runner._core")
    with pytest.raises(ValueError, match="frequency_penalty"):
        core.Sampler(frequency_penalty=float("nan"))
    with pytest.raises(ValueError, match="logit_bias: token id -3 is negative"):
        core.Sampler(logit_bias={-3: 1.0})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        core.Sampler(logit_bias={500: 1.0}).sample(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="every token is banned"):
        core.Sampler(temp=0, logit_bias={i: -100.0 for i in range(4)}).sample(np.zeros(4, np.float32))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("penalties") / "tiny.gguf"
    write_tiny_gguf(path)
    return str(path)


@pytest.fixture(scope="module")
def llm(tiny):
    from bonsai_runner import Llama

    m = Llama(tiny, n_ctx=256, verbose=False, logits_all=True)
    yield m
    m.close()


PROMPT = "The answer is 42. Hello world, hello"


def _text(llm, ids):
    """The text a completion of these tokens returns (TextStream: invalid bytes replaced, an
    incomplete last character held back)."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(llm.detokenize(ids), final=False)


def _gen_ids(llm, n=24, **kw):
    """The completion's token ids (generate() with the same sampler settings as create_completion)."""
    prompt = llm.tokenize(PROMPT.encode(), add_bos=False)
    gen = llm.generate(prompt, **kw)
    ids = [next(gen) for _ in range(n)]
    gen.close()
    return ids


@engine
def test_banned_tokens_never_appear(llm):
    greedy = _gen_ids(llm, temp=0)
    banned = sorted(set(greedy))[:3]
    ids = _gen_ids(llm, temp=0, logit_bias={t: -100 for t in banned})
    assert not set(ids) & set(banned) and ids != greedy
    for seed in range(4):  # sampled at a high temperature over the whole vocabulary
        ids = _gen_ids(llm, n=40, temp=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                       logit_bias={str(t): float("-inf") for t in banned})
        assert not set(ids) & set(banned)
    text = llm(PROMPT, max_tokens=16, temperature=0, logit_bias={t: -100 for t in banned})["choices"][0]["text"]
    assert text == _text(llm, _gen_ids(llm, n=16, temp=0, logit_bias={t: -100 for t in banned}))


@engine
def test_large_positive_bias_forces_a_token(llm):
    target = llm.tokenize(b" world", add_bos=False)[-1]
    for kw in (dict(temp=0), dict(temp=1.0, seed=3)):
        assert _gen_ids(llm, n=10, logit_bias={target: 100}, **kw) == [target] * 10
    r = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0.9,
                                   logit_bias={str(target): 100})
    assert r["choices"][0]["message"]["content"] == _text(llm, [target] * 5)


@engine
def test_zero_penalties_leave_greedy_unchanged(llm):
    base = _gen_ids(llm, temp=0)
    assert _gen_ids(llm, temp=0, frequency_penalty=0.0, presence_penalty=0.0, logit_bias={}) == base
    assert llm(PROMPT, max_tokens=24, temperature=0, frequency_penalty=0, presence_penalty=0)["choices"][0]["text"] \
        == _text(llm, base)


@engine
@pytest.mark.parametrize("case", [dict(frequency_penalty=2.0, presence_penalty=2.0, repeat_last_n=64),
                                  dict(frequency_penalty=-0.5, presence_penalty=1.0, repeat_last_n=-1,
                                       logit_bias="from greedy")])
def test_penalized_greedy_follows_the_reference(llm, case):
    prompt = llm.tokenize(PROMPT.encode(), add_bos=False)
    if case.get("logit_bias") == "from greedy":  # ban the 6th greedy token, favour the last other one
        greedy = _gen_ids(llm, n=20, temp=0)
        favoured = next(t for t in reversed(greedy) if t != greedy[5])
        case = {**case, "logit_bias": {greedy[5]: -100.0, favoured: 2.5}}
    ids = _gen_ids(llm, n=20, temp=0, **case)
    assert ids != _gen_ids(llm, n=20, temp=0)  # the penalties change this greedy path
    # the logits of every position of prompt + ids, then each step's reference adjustment
    llm.reset()
    llm.eval(prompt + ids)
    kw = {k: v for k, v in case.items()}
    for i, t in enumerate(ids):
        history = prompt + ids[:i]
        row = llm.scores[len(history) - 1]
        assert int(np.argmax(reference_adjust(row, history, **kw))) == t, i


@engine
def test_llama_refuses_bad_values(llm):
    for kw, msg in ((dict(frequency_penalty=2.5), "frequency_penalty must be a number in"),
                    (dict(presence_penalty=-3), "presence_penalty must be a number in"),
                    (dict(logit_bias={300000: 1}), "not a token id of this model"),
                    (dict(logit_bias={"x": 1}), "not a token id"),
                    (dict(logit_bias={1: 101}), r"logit_bias\[1\] must be a number in \[-100.0, 100.0\]"),
                    (dict(logit_bias=[1, 2]), "logit_bias must be an object")):
        with pytest.raises(ValueError, match=msg):
            llm("Hi", max_tokens=2, **kw)


# ---- server --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tiny):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from bonsai_runner.server import ServingEngine
    from test_server import _Server

    s = _Server(ServingEngine(tiny, n_parallel=2, n_ctx_slot=256, n_batch=64, n_threads=2))
    yield s
    s.stop()


@engine
def test_server_sampler_fields(server, llm):
    c = server.client()
    target = llm.tokenize(b" world", add_bos=False)[-1]
    r = c.completions.create(model="x", prompt=PROMPT, max_tokens=6, temperature=0.8,
                             logit_bias={str(target): 100})
    assert r.choices[0].text == _text(llm, [target] * 6)
    greedy = _gen_ids(llm, n=12, temp=0)
    banned = sorted(set(greedy))[:2]
    r = c.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=0,
                             logit_bias={str(t): -100 for t in banned})
    assert r.choices[0].text == _text(llm, _gen_ids(llm, n=12, temp=0,
                                                        logit_bias={t: -100 for t in banned}))
    pen = dict(frequency_penalty=1.5, presence_penalty=0.5)
    r = c.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=0, **pen)
    assert r.choices[0].text == _text(llm, _gen_ids(llm, n=12, temp=0, **pen))
    r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                  logit_bias={str(target): 100})
    assert r.choices[0].message.content == _text(llm, [target] * 4)

    for body, param in (({"frequency_penalty": 2.5}, "frequency_penalty"),
                        ({"presence_penalty": "high"}, "presence_penalty"),
                        ({"logit_bias": {"99999": 5}}, "logit_bias"), ({"logit_bias": {"abc": 5}}, "logit_bias"),
                        ({"logit_bias": {"5": 150}}, "logit_bias"), ({"logit_bias": [5]}, "logit_bias")):
        for path, base in (("/v1/completions", {"prompt": "Hi"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
            status, text = server.post_raw(path, json.dumps({**base, **body}).encode())
            assert status == 400, (path, body, text)
            assert json.loads(text)["error"]["param"] == param, text


# ---- bonsai_run --------------------------------------------------------------------------------

def _bonsai_run(*args):
    return subprocess.run([bonsai_run_path(), *map(str, args)], capture_output=True, timeout=120)


@engine
def test_bonsai_run_flags(tiny, llm):
    target = llm.tokenize(b" world", add_bos=False)[-1]
    common = ("-m", tiny, "-p", PROMPT, "-n", "16", "--temp", "0", "-t", "1", "-c", "128")
    plain = _bonsai_run(*common)
    assert plain.returncode == 0, plain.stderr
    forced = _bonsai_run(*common, "-l", f"{target}+100")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.endswith(llm.detokenize([target] * 16))
    pen = _bonsai_run(*common, "--frequency-penalty", "2", "--presence-penalty=2")
    want = llm.detokenize(_gen_ids(llm, n=16, temp=0, frequency_penalty=2.0, presence_penalty=2.0))
    assert pen.returncode == 0 and pen.stdout.endswith(want) and pen.stdout != plain.stdout
    bad = _bonsai_run(*common, "-l", "99999+1")
    assert bad.returncode != 0 and b"outside the vocabulary" in bad.stderr
    bad = _bonsai_run(*common, "--logit-bias", "12")
    assert bad.returncode != 0 and b"TOKEN_ID(+|-)BIAS" in bad.stderr


@engine
def test_bonsai_run_parallel_flags(tiny, llm, tmp_path):
    from test_bonsai_run_parallel import _outputs, _prompt_file

    target = llm.tokenize(b" world", add_bos=False)[-1]
    prompts = ["Hello world", "def add(a, b):", "The answer is"]
    f = _prompt_file(tmp_path, prompts)
    p = _bonsai_run("-m", tiny, "-f", f, "--parallel", "2", "-n", "6", "--temp", "0.9", "-t", "1", "-c", "64",
                    "-l", f"{target}+100")
    assert p.returncode == 0, p.stderr
    out = _outputs(p.stdout)
    assert sorted(out) == [0, 1, 2]
    for i in range(len(prompts)):
        assert out[i].endswith(llm.detokenize([target] * 6)), (i, out[i])
