"""Embeddings end to end: the engine's embeddings mode (`_core.Context.embed`), `Llama.embed` /
`Llama.create_embedding`, and the server's POST /v1/embeddings driven by the official `openai` client.

Oracle: the float64 numpy forward of the tiny random models with the LM head replaced by an identity
(engine_fixtures.reference_logits for llama / qwen2 / qwen3, qwen35_hf_forward.qwen35_forward for the
hybrid), whose "logits" are then exactly the hidden state after the output norm. Checked: every
pooling (none, mean, cls, last) against it, whole and in chunks of n_batch; the pooling from the file's
`<arch>.pooling_type` key and its override; unit L2 norm; a batch of inputs equal to the inputs one
at a time; embeddings leaving other sequences' KV (and qwen35's recurrent state) untouched, so
generation after embedding is unchanged; the GPU path equal to the CPU (`cuda`, skipped without a
GPU); base64 equal to float; the bad inputs refused with one
clear error (400 naming the field in the server). The `real_model` case: on Qwen2.5-Coder-0.5B two
similar sentences are closer (cosine) than an unrelated one.
"""

from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pytest

import engine_fixtures
from engine_fixtures import Cfg, reference_logits, write_model
from real_model import real_model_path  # noqa: F401 (fixture)
from test_llama_api_e2e import engine, write_tiny_gguf

_core = pytest.importorskip("bonsai_runner._core")
pytestmark = engine

TOKENS = [int(t) for t in np.random.default_rng(7).integers(3, 300, 40)]


def reference_hidden(cfg: Cfg, tokens) -> np.ndarray:
    """float64 hidden states [n, n_embd] after output_norm: the reference forward with an identity head."""
    weights = dict(cfg.weights)
    weights["output.weight"] = np.eye(cfg.n_vocab, cfg.n_embd)
    return reference_logits(dataclasses.replace(cfg, tied=False, weights=weights), tokens)[:, :cfg.n_embd]


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - b).max() / np.abs(b).max())


def pool(rows: np.ndarray, how: str) -> np.ndarray:
    return {"none": rows, "mean": rows.mean(0, keepdims=True), "cls": rows[:1], "last": rows[-1:]}[how]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """models(arch, tied=False, pooling_type=None) -> (cfg, path); each written once."""
    cache: dict = {}
    d = tmp_path_factory.mktemp("embd_models")

    def get(arch="llama", tied=False, pooling_type=None):
        key = (arch, tied, pooling_type)
        if key not in cache:
            path = d / f"{arch}_{tied}_{pooling_type}.gguf"
            cfg = Cfg(arch=arch, tied=tied)
            if arch == "qwen3":
                cfg.head_dim = 32
            if pooling_type is None:
                cfg = write_model(path, cfg, seed=3)
            else:  # the same writer, plus the key llama.cpp reads
                class Writer(engine_fixtures.GGUFWriter):
                    def __init__(self, *args, **kw):
                        super().__init__(*args, **kw)
                        self.add_uint32(f"{arch}.pooling_type", pooling_type)

                mp = pytest.MonkeyPatch()
                mp.setattr(engine_fixtures, "GGUFWriter", Writer)
                try:
                    cfg = write_model(path, cfg, seed=3)
                finally:
                    mp.undo()
            cache[key] = (cfg, str(path))
        return cache[key]

    return get


def context(model, **kw):
    kw.setdefault("n_ctx", 128)
    kw.setdefault("n_batch", 64)
    kw.setdefault("n_threads", 2)
    kw.setdefault("act_mode", "float")
    return _core.Context(model, **kw)


# ---------------------------------------------------------------- the engine's embeddings mode

@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", False)])
@pytest.mark.parametrize("n_batch", [64, 7])
def test_hidden_state_matches_reference_every_pooling(models, arch, tied, n_batch):
    cfg, path = models(arch, tied)
    want = reference_hidden(cfg, TOKENS)
    with _core.Model(path) as m, context(m, n_batch=n_batch) as ctx:
        for how in ("none", "mean", "cls", "last"):
            got = ctx.embed(TOKENS, pooling=how)
            assert got.dtype == np.float32 and got.shape == pool(want, how).shape, how
            assert rel_err(got, pool(want, how)) < 1e-3, how


def test_pooling_from_the_file_and_its_override(models):
    cfg, path = models("llama", pooling_type=1)
    want = reference_hidden(cfg, TOKENS)
    with _core.Model(path) as m, context(m) as ctx:
        assert m.pooling_type == "mean"
        assert rel_err(ctx.embed(TOKENS), pool(want, "mean")) < 1e-3  # pooling=None: the file's
        assert rel_err(ctx.embed(TOKENS, pooling="last"), pool(want, "last")) < 1e-3
    _, plain = models("llama")
    with _core.Model(plain) as m, context(m) as ctx:
        assert m.pooling_type == "none"  # no key: llama.cpp's default for a generative model
        assert ctx.embed(TOKENS).shape == (len(TOKENS), cfg.n_embd)


def test_engine_refuses_bad_embeddings_calls(models):
    _, path = models("llama")
    with _core.Model(path) as m, context(m, n_ctx=32, n_seq_max=2) as ctx:
        with pytest.raises(_core.BonsaiError, match="rank"):
            ctx.embed(TOKENS[:4], pooling="rank")
        with pytest.raises(_core.BonsaiError, match="unknown pooling 'max'"):
            ctx.embed(TOKENS[:4], pooling="max")
        with pytest.raises(_core.BonsaiError, match="no tokens"):
            ctx.embed([], pooling="mean")
        with pytest.raises(_core.BonsaiError, match="40 tokens but only 32"):
            ctx.embed(TOKENS, pooling="mean")
        with pytest.raises(_core.BonsaiError, match="outside the vocabulary"):
            ctx.embed([1, 2, 10**6], pooling="mean")
        with pytest.raises(_core.BonsaiError, match="outside 0..1"):
            ctx.embed(TOKENS[:4], seq=2, pooling="mean")
        ctx.decode(TOKENS[:3], seq_ids=[0] * 3)
        with pytest.raises(_core.BonsaiError, match="sequence 0 holds tokens"):
            ctx.embed(TOKENS[:4], seq=0, pooling="mean")
        # a failed call leaves its sequence empty and the others as they were
        assert ctx.seq_pos_max(1) == -1 and ctx.seq_pos_max(0) == 2
    _, rank = models("llama", pooling_type=4)
    with _core.Model(rank) as m, context(m) as ctx:
        with pytest.raises(_core.BonsaiError, match="rank"):
            ctx.embed(TOKENS[:4])


def _continue(ctx, prompt, rest, embed_between):
    """Logits of `rest` decoded on sequence 0 after `prompt`, with an embedding on sequence 1 between."""
    ctx.decode(prompt, seq_ids=[0] * len(prompt))
    if embed_between:
        ctx.embed(TOKENS, seq=1, pooling="mean")
        assert ctx.seq_pos_max(1) == -1 and ctx.seq_pos_max(0) == len(prompt) - 1
    return ctx.decode(rest, seq_ids=[0] * len(rest), logits="all")


def test_embedding_leaves_other_sequences_untouched(models):
    _, path = models("llama")
    with _core.Model(path) as m:
        with context(m, n_seq_max=2) as a, context(m, n_seq_max=2) as b:
            want = _continue(a, TOKENS[:10], TOKENS[10:14], False)
            got = _continue(b, TOKENS[:10], TOKENS[10:14], True)
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- qwen35 (hybrid, recurrent state)

@pytest.fixture(scope="module")
def qwen35_file(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers.models.qwen3_5")
    from qwen35_factory import make_qwen35_model
    from test_qwen35_convert import convert_ours

    d = tmp_path_factory.mktemp("embd_qwen35")
    m = make_qwen35_model(d / "model", tied=False)
    out = d / "m.gguf"
    convert_ours(m, out, "f32")
    return m, str(out)


def qwen35_hidden(m: dict, ids) -> np.ndarray:
    from qwen35_hf_forward import qwen35_forward

    n_embd = m["text_config"]["hidden_size"]
    tensors = dict(m["tensors"])
    tensors["lm_head.weight"] = np.eye(m["n_vocab"], n_embd)
    return qwen35_forward(tensors, m["text_config"], ids)[:, :n_embd]


@pytest.mark.parametrize("n_batch", [64, 5])
def test_qwen35_hidden_state_matches_reference(qwen35_file, n_batch):
    m, path = qwen35_file
    ids = TOKENS[:20]
    want = qwen35_hidden(m, ids)
    with _core.Model(path) as model, context(model, n_batch=n_batch, n_seq_max=2) as ctx:
        for how in ("none", "mean", "cls", "last"):
            assert rel_err(ctx.embed(ids, seq=1, pooling=how), pool(want, how)) < 1e-3, how
        # generation on sequence 0 after embeddings on sequence 1 = a fresh context's
        got = _continue(ctx, ids[:8], ids[8:12], True)
    with _core.Model(path) as model, context(model, n_batch=n_batch, n_seq_max=2) as fresh:
        want_logits = _continue(fresh, ids[:8], ids[8:12], False)
    np.testing.assert_array_equal(got, want_logits)


# ---------------------------------------------------------------- the GPU path (CUDA builds with a GPU)

@pytest.mark.cuda
@pytest.mark.parametrize("n_gpu_layers", [-1, 2])  # the head on the GPU (x copied back for the norm) / partial
def test_gpu_embeddings_match_cpu(tmp_path, n_gpu_layers):
    from synthetic_gguf import write_synthetic_model

    path = str(write_synthetic_model(tmp_path / "m.gguf", "llama", wtype="Q8_0", emb_type="F16", n_layer=4))
    ids = [int(t) for t in np.random.default_rng(5).integers(3, 500, 40)]
    out = {}
    for ngl in (0, n_gpu_layers):
        with _core.Model(path, n_gpu_layers=ngl) as m, context(m, n_batch=16, n_seq_max=2) as ctx:
            rows = {how: ctx.embed(ids, seq=1, pooling=how) for how in ("none", "mean", "last")}
            out[ngl] = rows, _continue(ctx, ids[:10], ids[10:14], True)
    for how, cpu in out[0][0].items():
        assert rel_err(out[n_gpu_layers][0][how], cpu) < 1e-4, how
    assert rel_err(out[n_gpu_layers][1], out[0][1]) < 1e-4  # generation after embedding, on the GPU


# ---------------------------------------------------------------- Llama.embed / create_embedding

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("embd_tiny") / "tiny.gguf"
    write_tiny_gguf(path)
    return str(path)


TEXTS = ["The answer is 42.", "Hello world, hello there!", "def add(a, b): return a + b"]


@pytest.fixture(scope="module")
def llm(tiny):
    from bonsai_runner import Llama

    with Llama(tiny, n_ctx=64, n_batch=16, verbose=False, embedding=True, pooling_type="mean") as m:
        yield m


def test_llama_embed_shapes_norm_and_batching(llm, tiny):
    n_embd = llm.n_embd()
    one = llm.embed(TEXTS[0])
    assert isinstance(one, list) and len(one) == n_embd and all(isinstance(x, float) for x in one)
    assert abs(np.linalg.norm(one) - 1.0) < 1e-6
    many = llm.embed(TEXTS)
    assert len(many) == 3
    for text, vec in zip(TEXTS, many):  # a batch equals its inputs one at a time
        assert vec == llm.embed(text)
    tokens = [llm.tokenize(t.encode()) for t in TEXTS]
    assert llm.embed(tokens[1]) == many[1]  # token ids: the same input
    assert llm.embed(tokens) == many
    raw, n = llm.embed(TEXTS[0], normalize=False, return_count=True)
    assert n == len(tokens[0])
    np.testing.assert_allclose(np.asarray(raw) / np.linalg.norm(raw), one, rtol=0, atol=1e-12)
    with _core.Model(tiny) as m, context(m, n_ctx=64, n_batch=16, act_mode="int8") as ctx:  # the engine's rows
        np.testing.assert_allclose(raw, ctx.embed(tokens[0], pooling="mean")[0], rtol=0, atol=1e-6)
    assert len(set(map(tuple, many))) == 3 and abs(np.dot(many[0], many[1])) < 0.9999


def test_llama_pooling_none_gives_unit_vectors_per_token(tiny):
    from bonsai_runner import Llama

    with Llama(tiny, n_ctx=64, verbose=False, embedding=True) as m:  # no key in the file: none
        assert m.pooling == "none"
        rows = m.embed(TEXTS[1])
        n = len(m.tokenize(TEXTS[1].encode()))
        assert len(rows) == n and all(len(r) == m.n_embd() for r in rows)
        np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-6)
        out = m.create_embedding(TEXTS[1])
        assert out["data"][0]["embedding"] == rows


def test_create_embedding_shape(llm):
    out = llm.create_embedding(TEXTS, model="m")
    assert out["object"] == "list" and out["model"] == "m"
    assert [d["index"] for d in out["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == llm.n_embd() for d in out["data"])
    n = sum(len(llm.tokenize(t.encode())) for t in TEXTS)
    assert out["usage"] == {"prompt_tokens": n, "total_tokens": n}
    single = llm.create_embedding(TEXTS[0])
    assert len(single["data"]) == 1 and single["data"][0]["embedding"] == llm.embed(TEXTS[0])
    assert single["model"] == llm.model_path


def test_llama_truncation_and_bad_input(llm, tiny):
    from bonsai_runner import BonsaiError, Llama

    long = [int(t) for t in np.random.default_rng(3).integers(3, 300, 100)]
    assert llm.embed(long) == llm.embed(long[:64])  # truncate=True: the first n_ctx tokens
    with pytest.raises(ValueError, match="100 tokens, more than n_ctx=64"):
        llm.embed(long, truncate=False)
    for bad, msg in [([], "not empty"), (3, "must be a string"), (["a", [1]], "mixes kinds"),
                     ([[1, 2], []], "input 1 is an empty token list"), ([1, 10**6], "token id 1000000"),
                     ([True, 2], "mixes kinds"), ("", "input 0 is empty")]:
        with pytest.raises(BonsaiError, match=msg):
            llm.embed(bad)
    with Llama(tiny, n_ctx=64, verbose=False) as plain:
        with pytest.raises(BonsaiError, match="embedding=True"):
            plain.embed("hello")
        with pytest.raises(BonsaiError, match="embedding=True"):
            plain.create_embedding("hello")
    with pytest.raises(BonsaiError, match="pooling_type applies to embeddings"):
        Llama(tiny, verbose=False, pooling_type="mean")
    for pooling, msg in [("max", "unknown pooling_type 'max'"), (4, "rank"), (9, "pooling_type 9"),
                         (True, "must be a name")]:
        with pytest.raises(BonsaiError, match=msg):
            Llama(tiny, verbose=False, embedding=True, pooling_type=pooling)


def test_llama_pooling_numbers_and_rank_file(models):
    from bonsai_runner import BonsaiError, Llama

    _, path = models("llama", pooling_type=3)
    with Llama(path, n_ctx=64, verbose=False, embedding=True) as m:
        assert m.pooling == "last"
    with Llama(path, n_ctx=64, verbose=False, embedding=True, pooling_type=2) as m:  # llama.cpp's number for cls
        assert m.pooling == "cls" and m.pooling_type() == 2
    _, rank = models("llama", pooling_type=4)
    with pytest.raises(BonsaiError, match="rank"):
        Llama(rank, verbose=False, embedding=True)
    with Llama(rank, n_ctx=64, verbose=False, embedding=True, pooling_type="mean") as m:
        assert m.pooling == "mean"


def test_generation_after_embedding_is_unchanged(tiny):
    from bonsai_runner import Llama

    prompt = "The answer is"
    with Llama(tiny, n_ctx=64, verbose=False) as plain:
        want = plain(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    with Llama(tiny, n_ctx=64, verbose=False, embedding=True, pooling_type="last") as m:
        assert m(prompt, max_tokens=12, temperature=0)["choices"][0]["text"] == want
        cached = m.n_tokens
        m.embed(TEXTS)  # fits beside the cached prompt: the cache stays
        assert m.n_tokens == cached
        assert m(prompt, max_tokens=12, temperature=0)["choices"][0]["text"] == want
        assert m._n_reused > 0
        m.embed(list(range(3, 63)))  # needs the cells of the cache: it is dropped, output unchanged
        assert m.n_tokens == 0
        assert m(prompt, max_tokens=12, temperature=0)["choices"][0]["text"] == want


# ---------------------------------------------------------------- the server

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(tiny):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from bonsai_runner.server import ServingEngine
    from test_server import _Server

    s = _Server(ServingEngine(tiny, n_parallel=2, n_ctx_slot=64, n_batch=32, n_threads=2, pooling="mean"))
    yield s
    s.stop()


def test_server_embeddings_with_the_openai_client(server, llm):
    c = server.client()
    r = c.embeddings.create(model="x", input=TEXTS)
    assert [d.index for d in r.data] == [0, 1, 2]
    for text, d in zip(TEXTS, r.data):
        assert len(d.embedding) == llm.n_embd()
        np.testing.assert_allclose(d.embedding, llm.embed(text), rtol=0, atol=1e-6)  # same model, pooling
    n = sum(len(llm.tokenize(t.encode())) for t in TEXTS)
    assert r.usage.prompt_tokens == n and r.usage.total_tokens == n
    one = c.embeddings.create(model="x", input=TEXTS[0], dimensions=llm.n_embd())
    assert len(one.data) == 1 and one.data[0].embedding == r.data[0].embedding
    tokens = [llm.tokenize(t.encode()) for t in TEXTS[:2]]
    by_ids = c.embeddings.create(model="x", input=tokens)
    assert [d.embedding for d in by_ids.data] == [d.embedding for d in r.data[:2]]


def test_server_base64_equals_float(server):
    import json

    status, text = server.post_raw("/v1/embeddings", json.dumps({"input": TEXTS, "encoding_format": "base64"}).encode())
    assert status == 200
    b64 = json.loads(text)["data"]
    status, text = server.post_raw("/v1/embeddings", json.dumps({"input": TEXTS}).encode())
    floats = json.loads(text)["data"]
    for a, b in zip(b64, floats):
        got = np.frombuffer(base64.b64decode(a["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(got, np.asarray(b["embedding"], dtype=np.float32))
    # the client asks for base64 itself when no format is given and decodes it into floats
    r = server.client().embeddings.create(model="x", input=TEXTS[0])
    np.testing.assert_array_equal(np.asarray(r.data[0].embedding, dtype=np.float32),
                                  np.asarray(floats[0]["embedding"], dtype=np.float32))
    r = server.client().embeddings.create(model="x", input=TEXTS[0], encoding_format="base64")  # left as text
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(r.data[0].embedding), dtype="<f4"),
                                  np.asarray(floats[0]["embedding"], dtype=np.float32))


def test_server_embeddings_bad_requests(server):
    import json

    cases = [({}, "input"), ({"input": []}, "input"), ({"input": 5}, "input"), ({"input": [[1, 2], "a"]}, "input"),
             ({"input": [1, 10**6]}, "input"), ({"input": ""}, "input"), ({"input": list(range(3, 70))}, "input"),
             ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
             ({"input": "a", "dimensions": 8}, "dimensions"),
             ({"input": "a", "dimensions": "64"}, "dimensions"), ({"input": "a", "model": 3}, "model"),
             ({"input": "a", "user": 1}, "user")]
    for body, param in cases:
        status, text = server.post_raw("/v1/embeddings", json.dumps(body).encode())
        err = json.loads(text)["error"]
        assert status == 400 and err["param"] == param, (body, status, text)
        assert err["type"] == "invalid_request_error" and err["message"]
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        server.client().embeddings.create(model="x", input="a", dimensions=3)


def test_server_generation_after_embeddings(server, tiny):
    from bonsai_runner import Llama

    with Llama(tiny, n_ctx=64, verbose=False) as plain:
        want = plain("Hello world", max_tokens=10, temperature=0)["choices"][0]["text"]
    c = server.client()
    assert c.completions.create(model="x", prompt="Hello world", max_tokens=10, temperature=0).choices[0].text == want
    c.embeddings.create(model="x", input=TEXTS * 3)
    assert c.completions.create(model="x", prompt="Hello world", max_tokens=10, temperature=0).choices[0].text == want


def test_server_embeddings_concurrent_with_generation(server, tiny, llm):
    from concurrent.futures import ThreadPoolExecutor

    from bonsai_runner import Llama

    prompts = ["Hello world", "The answer is", "def add(a, b):"]
    with Llama(tiny, n_ctx=64, verbose=False) as plain:
        want = [plain(p, max_tokens=12, temperature=0)["choices"][0]["text"] for p in prompts]
    want_vectors = llm.embed(TEXTS)
    c = server.client()

    def complete(p):
        return c.completions.create(model="x", prompt=p, max_tokens=12, temperature=0).choices[0].text

    def embed(_):
        return [d.embedding for d in c.embeddings.create(model="x", input=TEXTS).data]

    with ThreadPoolExecutor(6) as pool:
        texts = [pool.submit(complete, p) for p in prompts * 2]
        vectors = [pool.submit(embed, i) for i in range(4)]
        assert [t.result(60) for t in texts] == want * 2
        for v in vectors:
            np.testing.assert_allclose(v.result(60), want_vectors, rtol=0, atol=1e-6)


def test_server_pooling_none_is_refused_and_flag_is_parsed(tiny):
    import argparse

    from bonsai_runner.commands import serve
    from bonsai_runner.server import ServingEngine
    from test_server import _Server

    s = _Server(ServingEngine(tiny, n_parallel=1, n_ctx_slot=64, n_threads=2))  # the file's pooling: none
    try:
        with pytest.raises(openai.BadRequestError, match="--pooling"):
            s.client().embeddings.create(model="x", input="hello")
        doc = s.get("/openapi.json")[1]
        assert '"/v1/embeddings"' in doc and "EmbeddingRequest" in doc
    finally:
        s.stop()
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    assert p.parse_args(["-m", "x", "--pooling", "last"]).pooling == "last"
    assert p.parse_args(["-m", "x"]).pooling is None
    with pytest.raises(SystemExit):
        p.parse_args(["-m", "x", "--pooling", "rank"])


# ---------------------------------------------------------------- the real model

@pytest.mark.real_model
def test_real_model_similar_sentences_are_closer(real_model_path):  # noqa: F811
    from bonsai_runner import Llama

    from test_engine_real_model import converted

    # the downloaded Q4_K_M has Q5_0 tensors, which the engine has no kernel for: its Q8_0 conversion
    with Llama(str(converted(real_model_path, "q8_0")), n_ctx=256, verbose=False, embedding=True,
               pooling_type="mean") as m:
        a, b, c = m.embed(["The cat sat on the mat.", "A cat was sitting on the rug.",
                           "Quarterly interest rates rose by two percent."])
    assert np.dot(a, b) > np.dot(a, c) and np.dot(a, b) > np.dot(b, c), (np.dot(a, b), np.dot(a, c), np.dot(b, c))

