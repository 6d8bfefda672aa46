"""Constrained decoding (constrained.py): JSON mode, JSON schemas and GBNF grammars, through
`Llama` and through the server with the official `openai` client, on a tiny random model (its
unconstrained output is noise, so valid JSON can only come from the mask)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_llama_api_e2e import engine, write_tiny_gguf
from test_server import MESSAGES, _Server

pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "color": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "age", "color"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
N_CTX = 256


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("constrained") / "tiny.gguf"
    write_tiny_gguf(path)
    return str(path)


@pytest.fixture(scope="module")
def llm(tiny):
    from bonsai_runner import Llama

    llama = Llama(tiny, n_ctx=N_CTX, verbose=False)
    yield llama
    llama.close()


@pytest.fixture(scope="module")
def server(tiny):
    from bonsai_runner.server import ServingEngine

    s = _Server(ServingEngine(tiny, n_parallel=4, n_ctx_slot=N_CTX, n_batch=64, n_threads=2))
    yield s
    s.stop()


# ---- compiling --------------------------------------------------------------------------------

def test_compile_errors_name_the_field():
    from bonsai_runner import constrained as C

    assert C.from_response_format({"type": "text"}) is None and C.from_response_format(None) is None
    assert C.from_response_format({"type": "json_object"}).kind == "json_object"
    assert C.from_response_format(RESPONSE_FORMAT).kind == "json_schema"
    assert C.from_grammar("") is None
    cases = [(lambda: C.from_response_format({"type": "xml"}), "response_format", "unknown type"),
             (lambda: C.from_response_format({"type": "json_schema"}), "response_format", "json_schema"),
             (lambda: C.from_response_format({"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}),
              "response_format", "foo"),
             (lambda: C.from_json_schema({"type": "string", "pattern": "("}), "json_schema", "regex"),
             (lambda: C.from_json_schema("{not json"), "json_schema", "not valid JSON"),
             (lambda: C.from_json_schema({"not": {"type": "string"}}), "json_schema", "not"),
             (lambda: C.from_grammar("root ::= undefined_rule"), "grammar", "undefined_rule"),
             (lambda: C.from_grammar(42), "grammar", "GBNF"),
             (lambda: C.request_constraint({"type": "json_object"}, 'root ::= "a"'), "grammar", "only one")]
    for make, param, words in cases:
        with pytest.raises(C.ConstraintError, match=words) as e:
            make()
        assert e.value.param == param and isinstance(e.value, ValueError) and param in str(e.value)


# ---- Llama ------------------------------------------------------------------------------------

class _LlamaGrammarLike:  # llama-cpp-python's LlamaGrammar keeps its GBNF text in _grammar
    def __init__(self, text):
        self._grammar = text


@engine
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gbnf_grammar_constrains_llama(llm, seed):
    out = llm.create_completion("Answer:", max_tokens=20, temperature=1.0, seed=seed, grammar='root ::= "yes" | "no"')
    choice = out["choices"][0]
    assert choice["text"] in ("yes", "no") and choice["finish_reason"] == "stop", choice
    free = llm.create_completion("Answer:", max_tokens=20, temperature=1.0, seed=seed)["choices"][0]["text"]
    assert free not in ("yes", "no")  # the random model does not say it on its own
    chunks = list(llm.create_completion("Answer:", max_tokens=20, temperature=1.0, seed=seed, stream=True,
                                        grammar=_LlamaGrammarLike('root ::= "yes" | "no"')))
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@engine
def test_llama_chat_response_format(llm):
    r = llm.create_chat_completion(MESSAGES, max_tokens=200, temperature=0.8, seed=3, response_format=RESPONSE_FORMAT)
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), SCHEMA)
    assert r["choices"][0]["finish_reason"] == "stop"
    parts = [c["choices"][0]["delta"].get("content") or "" for c in
             llm.create_chat_completion(MESSAGES, max_tokens=200, temperature=0.8, seed=3, stream=True,
                                        response_format={"type": "json_object", "schema": SCHEMA})]
    jsonschema.validate(json.loads("".join(parts)), SCHEMA)
    r = llm.create_chat_completion(MESSAGES, max_tokens=40, temperature=0, grammar='root ::= [0-9]+ "!"')
    assert r["choices"][0]["message"]["content"][:-1].isdigit() and r["choices"][0]["message"]["content"][-1] == "!"
    with pytest.raises(ValueError, match="response_format"):
        llm.create_chat_completion(MESSAGES, max_tokens=2, response_format={"type": "json_schema",
                                                                            "json_schema": {"schema": {"type": "x"}}})
    with pytest.raises(ValueError, match="generate"):  # the token-level API takes no grammar
        next(llm.generate([1, 2], grammar='root ::= "a"'))


# ---- server -----------------------------------------------------------------------------------

@engine
def test_server_json_schema(server):
    c = server.client()
    r = c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=200, temperature=0.8, seed=5,
                                  response_format=RESPONSE_FORMAT)
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert r.choices[0].finish_reason == "stop"
    stream = c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=200, temperature=0.8, seed=6,
                                       response_format=RESPONSE_FORMAT, stream=True)
    chunks = list(stream)
    jsonschema.validate(json.loads("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)),
                        SCHEMA)
    assert chunks[-1].choices[0].finish_reason == "stop"
    r = c.completions.create(model="x", prompt="Person:", max_tokens=200, temperature=0.8, seed=7,
                             extra_body={"response_format": RESPONSE_FORMAT})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)


@engine
def test_server_json_object_and_llama_server_fields(server):
    c = server.client()
    r = c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=200, temperature=0, seed=1,
                                  response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = c.completions.create(model="x", prompt="Person:", max_tokens=200, temperature=0.8, seed=2,
                             extra_body={"json_schema": SCHEMA})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)
    r = c.completions.create(model="x", prompt="Answer:", max_tokens=20, temperature=1.0, seed=2,
                             extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"


@engine
def test_server_concurrent_constrained_and_free(server):
    c = server.client()

    def constrained(i):
        r = c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=200, temperature=0.8, seed=100 + i,
                                      response_format=RESPONSE_FORMAT)
        return json.loads(r.choices[0].message.content)

    def free(i):
        r = c.completions.create(model="x", prompt="Hello", max_tokens=24, temperature=0.8, seed=200 + i,
                                 extra_body={"ignore_eos": True})
        return r.choices[0].text, r.usage.completion_tokens

    with ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(constrained if i % 2 == 0 else free, i) for i in range(8)]
        results = [j.result() for j in jobs]
    for i, res in enumerate(results):
        if i % 2 == 0:
            jsonschema.validate(res, SCHEMA)
        else:
            assert res[1] == 24  # the unconstrained ones ran free, unmasked, to their length
    # the same unconstrained request alone gives the same text: the constrained neighbours did not touch it
    alone = c.completions.create(model="x", prompt="Hello", max_tokens=24, temperature=0.8, seed=201,
                                 extra_body={"ignore_eos": True})
    assert alone.choices[0].text == results[1][0]


@engine
def test_server_bad_constraints_are_400(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        bad = {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}
        c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": bad}})
    assert e.value.body["param"] == "response_format" and "response_format" in e.value.body["message"]
    for field, value in (("grammar", "root ::= missing"), ("json_schema", {"type": "integer", "minimum": "x"}),
                         ("response_format", {"type": "json_object", "schema": 3})):
        status, body = server.post_raw("/v1/completions", json.dumps({"prompt": "x", field: value}).encode())
        err = json.loads(body)["error"]
        assert status == 400 and err["param"] == field, (field, err)
    status, body = server.post_raw("/v1/completions", json.dumps(
        {"prompt": "x", "grammar": 'root ::= "a"', "json_schema": SCHEMA}).encode())
    assert status == 400 and "only one" in json.loads(body)["error"]["message"]
    status, body = server.post_raw("/v1/completions", json.dumps(
        {"prompt": "x", "grammar": 'root ::= "a"', "ignore_eos": True}).encode())
    assert status == 400 and json.loads(body)["error"]["param"] == "ignore_eos"


@engine
def test_llama_cpp_python_grammar_object(llm):
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    grammar = llama_grammar.LlamaGrammar.from_string('root ::= "red" | "green" | "blue"', verbose=False)
    out = llm.create_completion("Color:", max_tokens=10, temperature=1.0, seed=4, grammar=grammar)["choices"][0]
    assert out["text"] in ("red", "green", "blue") and out["finish_reason"] == "stop"


@engine
def test_compute_masks_matches_one_by_one(llm):
    import numpy as np

    from bonsai_runner import constrained as C

    vocab = llm._constraint_vocab.get()
    schema, grammar = C.from_response_format(RESPONSE_FORMAT), C.from_grammar('root ::= "yes" | "no"')
    prefix = llm.tokenize(b'{"name":"Al', add_bos=False)

    def matchers():
        a, b, c = schema.matcher(vocab), schema.matcher(vocab), grammar.matcher(vocab)
        for t in prefix:
            b.advance(t)
        return [a, b, c]

    one_by_one = [m.allowed().copy() for m in matchers()]
    together = matchers()
    C.compute_masks(together)
    for want, m in zip(one_by_one, together):
        assert np.array_equal(m.allowed(), want)
    assert not np.array_equal(one_by_one[0], one_by_one[1])  # different states, different masks
    row = np.arange(vocab.n_vocab, dtype=np.float32)
    for want, m in zip(one_by_one, together):
        out = m.allowed_mask(row)
        assert np.array_equal(out[want], row[want]) and np.all(np.isneginf(out[~want]))


@engine
def test_grammar_on_a_space_prefix_sentencepiece_vocabulary(tmp_path):
    """A SentencePiece vocabulary that adds U+2581 before any text: the forced grammar strings are
    split into exact pieces (not tokenized with the prefix, which llguidance would refuse)."""
    import re

    from model_factory import make_hf_model

    from bonsai_runner import Llama
    from bonsai_runner.convert import convert

    m = make_hf_model(tmp_path / "m", arch="llama", tokenizer="spm", seed=3)
    convert(str(m["dir"]), str(tmp_path / "spm.gguf"), "f16", progress=False, log=lambda s: None)
    with Llama(str(tmp_path / "spm.gguf"), n_ctx=128, verbose=False) as llm:
        assert llm.metadata.get("tokenizer.ggml.model") == "llama"
        for seed in (0, 1):
            text = llm.create_completion("Number:", max_tokens=12, temperature=1.0, seed=seed,
                                         grammar='root ::= "{" [0-9]+ "}"')["choices"][0]["text"]
            assert re.fullmatch(r"\{[0-9]+\}?", text), text
