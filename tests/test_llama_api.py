"""Tests of the Python `Llama` facade without the native engine: chat-template rendering, streamed
text assembly, and the facade's own logic (prefix reuse, batching, streaming, stop strings, logprobs,
chat, bad input) over tests/fake_core.py. End-to-end tests on the engine: test_llama_api_e2e.py."""

from __future__ import annotations

import fake_core
import numpy as np
import pytest

from bonsai_runner import llama as llama_mod
from bonsai_runner.chat_template import CHATML_TEMPLATE, ChatTemplate, validate_messages
from bonsai_runner.completion_format import log_softmax
from bonsai_runner.errors import BonsaiError
from bonsai_runner.text_stream import TextStream, normalize_stop


# ---------------------------------------------------------------------------------------------
# text_stream


def _stream(pieces, stop=None):
    ts = TextStream(stop)
    chunks = [ts.push(p) for p in pieces]
    chunks.append(ts.finish())
    return ts, chunks


def test_stream_plain_text_passes_through_per_piece():
    ts, chunks = _stream([b"Hello", b",", b" world"])
    assert chunks == ["Hello", ",", " world", ""]
    assert ts.text == "Hello, world" and not ts.stopped


def test_stream_holds_partial_utf8_until_complete():
    data = "né 你好 🙂".encode()
    pieces = [data[i:i + 1] for i in range(len(data))]  # one byte per token
    ts, chunks = _stream(pieces)
    assert "".join(chunks) == "né 你好 🙂"
    for c in chunks:
        assert "\ufffd" not in c
    # the four bytes of the emoji produce exactly one non-empty chunk, on the last byte
    assert chunks[-5:-1] == ["", "", "", "🙂"]


def test_stream_drops_incomplete_utf8_tail_at_end():
    ts, chunks = _stream([b"ok", "你".encode()[:2]])
    assert "".join(chunks) == "ok" and ts.text == "ok"


def test_stream_invalid_utf8_becomes_replacement_char():
    ts, chunks = _stream([b"a\xff", b"b"])
    assert ts.text == "a\ufffdb"


def test_stream_stop_string_split_across_pieces_is_never_leaked():
    ts, chunks = _stream([b"The answer", b" is 4", b"\n\n", b"Q: next"], stop=["\n\nQ:"])
    assert ts.stopped and ts.stop_hit == "\n\nQ:"
    assert ts.text == "The answer is 4"
    assert "".join(chunks) == "The answer is 4"
    assert all("\n" not in c for c in chunks)


def test_stream_holdback_released_when_not_a_stop():
    ts = TextStream(["STOP"])
    assert ts.push(b"abc ST") == "abc "
    assert ts.push(b"ART") == "START"
    assert ts.push(b" S") == " "
    assert ts.finish() == "S"
    assert ts.text == "abc START S" and not ts.stopped


def test_stream_earliest_of_several_stops_wins_and_later_pushes_are_ignored():
    ts = TextStream(["xyz", "b"])
    assert ts.push(b"a") == "a"
    assert ts.push(b"xbyz") == "x"
    assert ts.stopped and ts.stop_hit == "b"
    assert ts.push(b"more") == "" and ts.finish() == ""
    assert ts.text == "ax"


def test_stream_stop_at_very_start_and_unicode_stop():
    ts, _ = _stream([b"###"], stop="###")
    assert ts.text == "" and ts.stopped
    data = "数: 42。答".encode()
    ts, chunks = _stream([data[i:i + 2] for i in range(0, len(data), 2)], stop=["。"])
    assert ts.text == "数: 42" and ts.stopped
    assert "".join(chunks) == "数: 42"


def test_stream_stop_equal_to_held_prefix_overlap():
    # "aab" with stop "ab": the held "a" must be re-examined together with the next piece
    ts, chunks = _stream([b"a", b"a", b"b", b"c"], stop="ab")
    assert ts.text == "a" and ts.stopped


def test_stream_rejects_non_bytes():
    with pytest.raises(BonsaiError, match="bytes"):
        TextStream().push("text")


def test_normalize_stop():
    assert normalize_stop(None) == []
    assert normalize_stop("x") == ["x"]
    assert normalize_stop(["a", "", "b"]) == ["a", "b"]
    with pytest.raises(BonsaiError, match="stop must"):
        normalize_stop(5)
    with pytest.raises(BonsaiError, match="only strings"):
        normalize_stop(["a", 3])


# ---------------------------------------------------------------------------------------------
# chat_template

_MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
]

_LLAMA3_LIKE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def test_chatml_fallback_renders_exactly():
    t = ChatTemplate(None)
    assert t.is_fallback and t.source == CHATML_TEMPLATE
    out = t.render(_MSGS)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                   "<|im_start|>assistant\n")
    assert not t.render(_MSGS, add_generation_prompt=False).endswith("assistant\n")


def test_template_from_metadata_uses_bos_and_eos():
    md = {"tokenizer.chat_template": _LLAMA3_LIKE}
    t = ChatTemplate.from_metadata(md, bos_token="<s>", eos_token="</s>")
    assert not t.is_fallback
    out = t.render(_MSGS[1:2])
    assert out == ("<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert ChatTemplate.from_metadata({}).is_fallback


def test_template_trim_blocks_lstrip_blocks_and_loopcontrols():
    src = ("{% for m in messages %}\n"
           "    {% if m.role == 'system' %}{% continue %}{% endif %}\n"
           "[{{ m.role }}]{{ m.content }}\n"
           "{% endfor %}")
    out = ChatTemplate(src).render(_MSGS, add_generation_prompt=False)
    assert out == "[user]Hi\n[assistant]Hello!\n[user]2+2?\n"


def test_template_tojson_keeps_unicode_and_extra_variables_pass_through():
    src = "{{ messages[0].content | tojson }}|{{ tools | tojson(indent=None) }}|{{ strftime_now('%Y') | length }}"
    out = ChatTemplate(src).render([{"role": "user", "content": "你好 \"q\""}], tools=[{"name": "f"}])
    assert out == '"你好 \\"q\\""|[{"name": "f"}]|4'


def test_template_generation_tag_outputs_body():
    src = "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}"
    assert ChatTemplate(src).render(_MSGS[:2]) == "<Be brief.><Hi>"


def test_template_raise_exception_becomes_bonsai_error():
    src = ("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}"
           "{% endif %}ok")
    t = ChatTemplate(src)
    assert t.render(_MSGS[1:]) == "ok"
    with pytest.raises(BonsaiError, match="rejected the messages: Conversation must start with user"):
        t.render(_MSGS)


def test_template_is_sandboxed():
    src = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(BonsaiError, match="chat template"):
        ChatTemplate(src).render(_MSGS)
    with pytest.raises(BonsaiError, match="chat template"):
        ChatTemplate("{% set x = messages.append(1) %}").render(_MSGS)


def test_template_syntax_error_is_clear():
    with pytest.raises(BonsaiError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(BonsaiError, match="not a string"):
        ChatTemplate.from_metadata({"tokenizer.chat_template": 5})


@pytest.mark.parametrize("bad, msg", [
    ("hi", "must be a list"),
    ([], "messages is empty"),
    (["hi"], r"messages\[0\] is a str"),
    ([{"content": "x"}], r"messages\[0\] has no string 'role'"),
    ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\] is a int"),
])
def test_bad_messages(bad, msg):
    with pytest.raises(BonsaiError, match=msg):
        validate_messages(bad)
    with pytest.raises(BonsaiError, match=msg):
        ChatTemplate(None).render(bad)


# ---------------------------------------------------------------------------------------------
# Llama facade over a strict pure-numpy stand-in for the engine (tests/fake_core.py)


@pytest.fixture
def make_llama(monkeypatch, tmp_path):
    monkeypatch.setattr(llama_mod, "_core", fake_core)
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGUF")
    made = []

    def make(**kw):
        kw.setdefault("n_ctx", 128)
        kw.setdefault("verbose", False)
        m = llama_mod.Llama(str(path), **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def _corpus_after(prefix: str, n: int) -> str:
    c = bytes(t for t in fake_core.CORPUS if t < 256)
    i = c.index(prefix.encode()) + len(prefix.encode())
    return c[i:i + n].decode("utf-8", errors="ignore")


def test_fake_greedy_completion_shape_and_text(make_llama):
    llm = make_llama()
    r = llm("The answer", max_tokens=8, temperature=0)
    assert set(r) == {"id", "object", "created", "model", "choices", "usage"}
    assert r["id"].startswith("cmpl-") and r["object"] == "text_completion"
    assert r["model"] == llm.model_path and isinstance(r["created"], int)
    c = r["choices"][0]
    assert c == {"text": _corpus_after("The answer", 8), "index": 0, "logprobs": None, "finish_reason": "length"}
    assert r["usage"] == {"prompt_tokens": 11, "completion_tokens": 8, "total_tokens": 19}
    assert llm("The answer", max_tokens=8, temperature=0)["choices"][0]["text"] == c["text"]


def test_fake_prefix_reuse_matches_fresh_and_skips_prefill(make_llama):
    llm = make_llama()
    first = llm("The answer is", max_tokens=5, temperature=0)["choices"][0]["text"]
    before = llm._ctx.decoded_tokens
    again = llm("The answer is", max_tokens=5, temperature=0)["choices"][0]["text"]
    assert again == first
    assert llm._ctx.decoded_tokens - before == 1 + 4  # one prompt token re-evaluated + 4 generated
    # a prompt sharing a prefix: only the differing tail is evaluated, and the result equals a fresh model's
    before = llm._ctx.decoded_tokens
    shared = llm("The answer is 4", max_tokens=6, temperature=0)["choices"][0]["text"]
    assert llm._ctx.decoded_tokens - before == 1 + 5  # " 4" was already evaluated as generated text
    fresh = make_llama()("The answer is 4", max_tokens=6, temperature=0)["choices"][0]["text"]
    assert shared == fresh == _corpus_after("The answer is 4", 6)
    before = llm._ctx.decoded_tokens
    diverged = llm("The answer is 5!", max_tokens=6, temperature=0)["choices"][0]["text"]
    assert llm._ctx.decoded_tokens - before == 2 + 5
    assert diverged == make_llama()("The answer is 5!", max_tokens=6, temperature=0)["choices"][0]["text"]
    # a completely different prompt drops the old cache
    llm("Q: what", max_tokens=2, temperature=0)
    assert llm._ctx.kv[:1] == [fake_core.BOS] and llm.n_tokens == len(llm._ctx.kv)


def test_fake_batches_respect_n_batch(make_llama):
    llm = make_llama(n_batch=4)
    llm("The answer is", max_tokens=1, temperature=0)
    assert llm._ctx.batch_sizes == [4, 4, 4, 2]


def test_fake_stream_equals_non_stream_and_chunk_shapes(make_llama):
    llm = make_llama()
    full = llm("Q: what", max_tokens=None, temperature=0)
    chunks = list(llm("Q: what", max_tokens=None, temperature=0, stream=True))
    assert full["choices"][0]["finish_reason"] == "stop"  # the model emitted EOS
    for ch in chunks:
        assert set(ch) == {"id", "object", "created", "model", "choices"}
        assert ch["object"] == "text_completion" and ch["id"] == chunks[0]["id"]
        assert set(ch["choices"][0]) == {"text", "index", "logprobs", "finish_reason"}
        assert "\ufffd" not in ch["choices"][0]["text"]
    assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])
    assert chunks[-1]["choices"][0] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}
    text = "".join(ch["choices"][0]["text"] for ch in chunks)
    assert text == full["choices"][0]["text"] == _corpus_after("Q: what", 100)
    assert "你好" in text and "🙂" in text


def test_fake_stop_strings_not_leaked(make_llama):
    llm = make_llama()
    r = llm("The answer", max_tokens=30, temperature=0, stop=["\n\nQ", "zzz"])
    assert r["choices"][0]["text"] == " is 42." and r["choices"][0]["finish_reason"] == "stop"
    chunks = list(llm("The answer", max_tokens=30, temperature=0, stop="\n\nQ", stream=True))
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == " is 42." and not any("\n" in t for t in texts)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # a stop that never completes is released at the end
    r = llm("The answer", max_tokens=5, temperature=0, stop=" is 42!")
    assert r["choices"][0]["text"] == " is 4" and r["choices"][0]["finish_reason"] == "length"


def test_fake_echo_and_suffix(make_llama):
    llm = make_llama()
    r = llm("The answer", max_tokens=3, temperature=0, echo=True)
    assert r["choices"][0]["text"] == "The answer" + _corpus_after("The answer", 3)
    s = "".join(c["choices"][0]["text"] for c in llm("The answer", max_tokens=3, temperature=0, echo=True, stream=True))
    assert s == r["choices"][0]["text"]
    r = llm("The answer", max_tokens=3, temperature=0, suffix="!!")
    assert r["choices"][0]["text"] == _corpus_after("The answer", 3) + "!!"


def test_fake_token_list_prompt_has_no_implicit_bos(make_llama):
    llm = make_llama()
    toks = llm.tokenize(b"The answer")
    assert toks[0] == llm.token_bos()
    r = llm(toks, max_tokens=3, temperature=0)
    assert r["usage"]["prompt_tokens"] == len(toks)
    assert r["choices"][0]["text"] == _corpus_after("The answer", 3)


def test_fake_logprobs_values(make_llama):
    llm = make_llama()
    r = llm("The answer", max_tokens=4, temperature=0, logprobs=3)
    lp = r["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "text_offset", "token_logprobs", "top_logprobs"}
    history = llm.tokenize(b"The answer")
    assert lp["text_offset"] == [10, 11, 12, 13]
    for i, tok in enumerate(" is "):
        ref = log_softmax(fake_core.reference_logits(history))
        t = ord(tok)
        assert lp["tokens"][i] == tok
        assert lp["token_logprobs"][i] == pytest.approx(ref[t], abs=1e-5)
        top = lp["top_logprobs"][i]  # keyed by text: undecodable byte tokens collapse into ""
        assert 1 <= len(top) <= 4 and max(top.values()) == pytest.approx(ref.max(), abs=1e-5)
        history.append(t)
    # streamed chunks carry the logprobs of their own tokens
    chunks = list(llm("The answer", max_tokens=4, temperature=0, logprobs=3, stream=True))
    streamed = [x for c in chunks[:-1] for x in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == pytest.approx(lp["token_logprobs"])


def test_fake_echo_logprobs_need_logits_all(make_llama):
    with pytest.raises(BonsaiError, match="logits_all=True"):
        make_llama()("The answer", max_tokens=2, logprobs=1, echo=True)
    llm = make_llama(logits_all=True)
    lp = llm("The an", max_tokens=2, temperature=0, logprobs=1, echo=True)["choices"][0]["logprobs"]
    assert lp["tokens"] == ["T", "h", "e", " ", "a", "n", "s", "w"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = log_softmax(fake_core.reference_logits([fake_core.BOS, ord("T")]))
    assert lp["token_logprobs"][1] == pytest.approx(ref[ord("h")], abs=1e-5)
    assert lp["text_offset"] == list(range(8))
    ref = log_softmax(fake_core.reference_logits(llm.tokenize(b"The an")))
    assert lp["token_logprobs"][6] == pytest.approx(ref[ord("s")], abs=1e-5)


def test_fake_logits_all_scores_match_every_position(make_llama):
    llm = make_llama(logits_all=True, n_batch=3)
    toks = llm.tokenize(b"The answer")
    llm.eval(toks)
    assert llm.n_tokens == len(toks) and llm.scores.shape == (128, fake_core.N_VOCAB)
    for i in range(len(toks)):
        np.testing.assert_allclose(llm.scores[i], fake_core.reference_logits(toks[: i + 1]), rtol=0, atol=0)
    assert list(llm.input_ids[: llm.n_tokens]) == toks
    llm.reset()
    assert llm.n_tokens == 0 and llm._ctx.kv == []


def test_fake_sampling_seed_reproducible(make_llama):
    llm = make_llama()
    a = llm("The", max_tokens=12, temperature=1.5, top_p=1.0, seed=7)["choices"][0]["text"]
    b = llm("The", max_tokens=12, temperature=1.5, top_p=1.0, seed=7)["choices"][0]["text"]
    c = llm("The", max_tokens=12, temperature=1.5, top_p=1.0, seed=8)["choices"][0]["text"]
    assert a == b and a != c
    seeded = make_llama(seed=3)
    assert seeded("The", max_tokens=12, temperature=1.5)["choices"][0]["text"] == \
        seeded("The", max_tokens=12, temperature=1.5)["choices"][0]["text"]


def test_fake_max_tokens_until_context_end(make_llama):
    llm = make_llama(n_ctx=16)
    r = llm("The", max_tokens=0, temperature=0)
    assert r["usage"]["total_tokens"] == 16 and r["choices"][0]["finish_reason"] == "length"
    r = llm("The", max_tokens=1000, temperature=0)
    assert r["usage"]["completion_tokens"] == 12


def test_fake_chat_completion(make_llama):
    llm = make_llama()
    msgs = [{"role": "user", "content": "The answer"}]
    r = llm.create_chat_completion(msgs, max_tokens=5, temperature=0)
    assert r["id"].startswith("chatcmpl-") and r["object"] == "chat.completion"
    assert r["choices"][0]["message"]["role"] == "assistant"
    assert r["choices"][0]["finish_reason"] == "length"
    prompt = "<s><|im_start|>user\nThe answer<|im_end|>\n<|im_start|>assistant\n"
    assert r["usage"]["prompt_tokens"] == len(llm.tokenize(prompt.encode(), add_bos=False, special=True))
    chunks = list(llm.create_chat_completion(msgs, max_tokens=5, temperature=0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == r["choices"][0]["message"]["content"]
    lp = llm.create_chat_completion(msgs, max_tokens=2, temperature=0, logprobs=True, top_logprobs=2)
    entry = lp["choices"][0]["logprobs"]["content"][0]
    assert set(entry) == {"token", "bytes", "logprob", "top_logprobs"} and len(entry["top_logprobs"]) == 2


def test_fake_tokens_and_facts(make_llama):
    llm = make_llama()
    assert llm.detokenize(llm.tokenize(b"hi there")) == b"hi there"
    assert llm.tokenize(b"hi", add_bos=False) == [104, 105]
    assert llm.tokenize(b"<|im_end|>", add_bos=False, special=True) == [fake_core.IM_END]
    assert (llm.n_ctx(), llm.n_vocab(), llm.token_bos(), llm.token_eos(), llm.n_embd()) == \
        (128, fake_core.N_VOCAB, fake_core.BOS, fake_core.EOS, 16)


def test_fake_close_and_context_manager(make_llama):
    with make_llama() as llm:
        model, ctx = llm._model, llm._ctx
        llm("The", max_tokens=1)
    assert model.closed and ctx.closed
    with pytest.raises(BonsaiError, match="closed"):
        llm("The", max_tokens=1)
    llm.close()
    llm.__del__()


@pytest.mark.parametrize("kwargs, msg", [
    (dict(prompt=""), "prompt is empty"),
    (dict(prompt=[]), "prompt is empty"),
    (dict(prompt="x" * 200), "does not fit the context"),
    (dict(prompt=[1, 999]), "invalid token id 999"),
    (dict(prompt=3), "prompt must be a string"),
    (dict(prompt="a", temperature=-0.1), r"temperature must be a number in \[0\.0, .*0 = greedy"),
    (dict(prompt="a", top_p=0.0), r"top_p must be a number in \(0\.0, 1\.0\]"),
    (dict(prompt="a", top_p=1.5), r"top_p must be a number in \(0\.0, 1\.0\]"),
    (dict(prompt="a", max_tokens="5"), "max_tokens must be an integer"),
    (dict(prompt="a", max_tokens=2.5), "max_tokens must be an integer"),
    (dict(prompt="a", max_tokens=True), "max_tokens must be an integer"),
    (dict(prompt="a", stop=5), "stop must be"),
    (dict(prompt="a", logprobs=-1), r"logprobs must be an integer in \[0, 2147483647\]"),
    (dict(prompt="a", suffix=3), "suffix must be a string"),
])
def test_fake_bad_completion_input(make_llama, kwargs, msg):
    llm = make_llama()
    with pytest.raises(BonsaiError, match=msg):
        llm.create_completion(**kwargs)
    with pytest.raises(BonsaiError, match=msg):  # streams validate before the first chunk
        llm.create_completion(stream=True, **kwargs)


@pytest.mark.parametrize("kwargs, msg", [
    (dict(type_k="q4_0"), "unknown KV cache type type_k='q4_0'"),
    (dict(type_v="int8"), "unknown KV cache type type_v='int8'"),
    (dict(n_ctx=-1), r"n_ctx must be an integer in \[0, 2147483647\]"),
    (dict(n_batch=0), r"n_batch must be an integer in \[1, 2147483647\]"),
    (dict(n_threads="4"), "n_threads must be an integer"),
    (dict(act_mode="int4"), "unknown act_mode='int4'"),
])
def test_fake_bad_constructor_input(make_llama, kwargs, msg):
    with pytest.raises(BonsaiError, match=msg):
        make_llama(**kwargs)


def test_missing_model_file_is_clear(monkeypatch, tmp_path):
    monkeypatch.setattr(llama_mod, "_core", fake_core)
    with pytest.raises(BonsaiError, match="model file not found"):
        llama_mod.Llama(str(tmp_path / "nope.gguf"))


def test_fake_interleaved_streams_are_refused(make_llama):
    llm = make_llama()
    a = llm("The answer", max_tokens=6, temperature=0, stream=True)
    next(a)
    llm("Q: what", max_tokens=2, temperature=0)  # reuses (and rewrites) the cache
    with pytest.raises(BonsaiError, match="interrupted"):
        list(a)
    # the Llama itself stays usable and correct
    assert llm("The answer", max_tokens=3, temperature=0)["choices"][0]["text"] == _corpus_after("The answer", 3)


def test_fake_end_of_turn_control_tokens_stop_generation(make_llama, monkeypatch):
    llm = make_llama()
    md = dict(llm.metadata)
    md["tokenizer.ggml.token_type"] = [1] * 256 + [3, 3, 3, 3]
    md["tokenizer.ggml.tokens"][fake_core.IM_END] = "<|im_end|>"
    llm.metadata = md
    assert llm._end_of_generation_ids() == {fake_core.EOS, fake_core.IM_END}


def test_fake_suffix_uses_fill_in_the_middle_tokens_when_the_file_has_them(make_llama):
    llm = make_llama()
    llm.metadata = {**llm.metadata, "tokenizer.ggml.fim_pre_token_id": 1, "tokenizer.ggml.fim_suf_token_id": 2,
                    "tokenizer.ggml.fim_mid_token_id": 3}
    toks, placed = llm._prompt_tokens("ab", "cd")
    assert placed and toks == [fake_core.BOS, 1, 97, 98, 2, 99, 100, 3]
    r = llm("ab", suffix="cd", max_tokens=2, temperature=0)
    assert not r["choices"][0]["text"].endswith("cd") and r["usage"]["prompt_tokens"] == 8
    assert llm._prompt_tokens([97, 98], "cd") == ([97, 98], False)
