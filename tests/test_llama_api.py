"""Tests of the Python `Llama` facade: chat-template rendering, streamed text assembly, and (when the
engine is built) completions and chat completions end to end on a tiny generated model."""

from __future__ import annotations

import pytest

from bonsai_runner.chat_template import CHATML_TEMPLATE, ChatTemplate, validate_messages
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
