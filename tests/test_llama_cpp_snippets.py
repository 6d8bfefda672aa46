"""Usage snippets written for llama-cpp-python, run unchanged against `bonsai_runner.Llama` (issue
#18): each snippet takes the `Llama` class and a model path and uses only llama-cpp-python's API
(constructor keywords, completion, chat, streaming, JSON mode, a named tool, embeddings,
save/load state). Each runs against llama-cpp-python itself too, when it is installed, so the
snippets are checked to be llama-cpp-python code and not written to fit this project."""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_llama_api_e2e import engine, write_tiny_gguf

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")


def snippet_constructor_and_completion(Llama, path):
    llm = Llama(model_path=path, n_ctx=1024, n_threads=2, n_threads_batch=2, n_batch=256, n_ubatch=256,
                n_gpu_layers=0, seed=1337, use_mmap=True, use_mlock=False, offload_kqv=True, verbose=False)
    output = llm("Q: Name the planets in the solar system? A: ", max_tokens=16, stop=["Q:"], echo=True)
    assert output["object"] == "text_completion"
    assert output["choices"][0]["text"].startswith("Q: Name the planets")
    assert output["choices"][0]["finish_reason"] in ("stop", "length")
    assert output["usage"]["prompt_tokens"] > 0
    tokens = llm.tokenize(b"Hello world")
    assert llm.detokenize(tokens) == b"Hello world"
    assert llm.n_ctx() == 1024 and llm.n_vocab() > 0


def snippet_chat_and_streaming(Llama, path):
    llm = Llama(model_path=path, n_ctx=1024, verbose=False)
    messages = [{"role": "system", "content": "You are an assistant who perfectly describes images."},
                {"role": "user", "content": "Describe this image in detail please."}]
    r = llm.create_chat_completion(messages=messages, max_tokens=12, temperature=0.7, seed=1)
    assert r["object"] == "chat.completion"
    assert r["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(r["choices"][0]["message"]["content"], str)
    text = ""
    for chunk in llm.create_completion("The capital of France is", max_tokens=8, stream=True):
        text += chunk["choices"][0]["text"]
    deltas = [c["choices"][0]["delta"] for c in llm.create_chat_completion(messages=messages, max_tokens=8,
                                                                          stream=True)]
    assert deltas[0].get("role") == "assistant"
    assert all(isinstance(d.get("content", ""), str) for d in deltas)


# (enums, not integer bounds: llama-cpp-python's schema grammar does not enforce minimum / maximum)
PERSON = {"type": "object", "properties": {"team": {"enum": ["red", "blue"]}, "score": {"enum": [1, 2, 3]}},
          "required": ["team", "score"], "additionalProperties": False}


def snippet_json_mode(Llama, path):
    llm = Llama(model_path=path, n_ctx=1024, verbose=False)
    r = llm.create_chat_completion(
        messages=[{"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
                  {"role": "user", "content": "Who won the world series in 2020"}],
        response_format={"type": "json_object", "schema": PERSON}, temperature=0.7, max_tokens=100)
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), PERSON)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                    "days": {"enum": [1, 3, 7]}},
                   "required": ["city", "days"], "additionalProperties": False}}}


def snippet_named_tool(Llama, path):
    llm = Llama(model_path=path, n_ctx=2048, verbose=False)
    r = llm.create_chat_completion(
        messages=[{"role": "user", "content": "What's the weather in Paris this week?"}],
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0.7, max_tokens=100)
    call = r["choices"][0]["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])


def snippet_embeddings(Llama, path):
    llm = Llama(model_path=path, embedding=True, pooling_type=1, verbose=False)  # 1 = LLAMA_POOLING_TYPE_MEAN
    vec = llm.embed("Hello, world!")
    assert isinstance(vec, list) and len(vec) == llm.n_embd() and all(isinstance(x, float) for x in vec)
    r = llm.create_embedding(["first text", "second text"])
    assert [d["index"] for d in r["data"]] == [0, 1]
    assert all(len(d["embedding"]) == llm.n_embd() for d in r["data"])


def snippet_save_and_load_state(Llama, path):
    # logits_all: without it llama-cpp-python 0.3 leaves `scores` unwritten (uninitialised memory)
    llm = Llama(model_path=path, n_ctx=256, logits_all=True, verbose=False)
    prompt = llm.tokenize(b"Once upon a time")
    llm.eval(prompt)
    state = llm.save_state()
    next_token = llm.tokenize(b" there", add_bos=False)[0]
    llm.eval([next_token])
    before = np.array(llm.scores[llm.n_tokens - 1])
    assert np.isfinite(before).all() and np.ptp(before) > 0
    llm.eval(llm.tokenize(b" was a story", add_bos=False))
    llm.load_state(state)
    assert llm.n_tokens == len(prompt)
    llm.eval([next_token])
    assert np.allclose(np.array(llm.scores[llm.n_tokens - 1]), before, atol=1e-4)


SNIPPETS = [snippet_constructor_and_completion, snippet_chat_and_streaming, snippet_json_mode, snippet_named_tool,
            snippet_embeddings, snippet_save_and_load_state]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("snippets") / "tiny.gguf"
    write_tiny_gguf(path)
    return str(path)


def _implementation(name):
    if name == "llama_cpp":
        return pytest.importorskip("llama_cpp").Llama
    from bonsai_runner import Llama

    return Llama


@engine
@pytest.mark.filterwarnings("ignore:.*has no effect here")  # bonsai's one warning for n_ubatch
@pytest.mark.parametrize("impl", ["bonsai", "llama_cpp"])
@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda f: f.__name__.removeprefix("snippet_"))
def test_snippet(snippet, impl, tiny):
    snippet(_implementation(impl), tiny)
