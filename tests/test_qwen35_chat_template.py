"""bonsai_runner.chat_template renders Qwen3.5's chat template as transformers renders it.

The template (tests/qwen35_factory.py, a shortened Qwen3.5-style one: a content macro, a
namespace walked over the reversed messages, <think> handling from reasoning_content or inline,
XML tool calls over `|items`, grouped tool responses with loop.previtem / nextitem, enable_thinking)
is taken from the converted GGUF's tokenizer.chat_template and rendered for conversations that
exercise each branch; transformers' apply_chat_template on the Hugging Face directory is the
oracle. The `slow` case renders the published Qwen3.5-4B template that upstream llama.cpp ships
(models/templates/Qwen3.5-4B.jinja in the llama-cpp-python 0.3.36 sdist) the same way.
"""

from __future__ import annotations

import pytest

from gguf_readback import read_gguf
from test_qwen35_convert import convert_ours, qwen35, upstream_vendor  # noqa: F401 (fixtures)

from bonsai_runner.chat_template import ChatTemplate
from bonsai_runner.errors import BonsaiError

pytest.importorskip("transformers")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]

CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "2+2?"}],
    "multi_turn_reasoning": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "<think>\nsmall ones\n</think>\n\n2"},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "3", "reasoning_content": "next one"},
        {"role": "user", "content": "And one more?"}],
    "parts": [{"role": "user", "content": [{"type": "text", "text": "Describe "},
                                           {"type": "image"},
                                           {"type": "text", "text": " please."}]}],
    "tools": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Paris", "days": 2}}},
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Rome",
                                                            "opts": {"unit": "C"}}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rainy"}],
}


@pytest.fixture(scope="module")
def template(qwen35, tmp_path_factory):  # noqa: F811
    m = qwen35()
    out = tmp_path_factory.mktemp("qwen35_tmpl") / "m.gguf"
    convert_ours(m, out, "f16")
    md = read_gguf(out).metadata
    from transformers import AutoTokenizer

    return ChatTemplate.from_metadata(md, eos_token="<|im_end|>"), AutoTokenizer.from_pretrained(
        m["dir"])


def _hf(tok, messages, **kw) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kw)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("thinking", [None, False])
def test_renders_as_transformers(template, name, thinking):
    ours, tok = template
    messages = CONVERSATIONS[name]
    kw = {"add_generation_prompt": True}
    if name == "tools":
        kw["tools"] = TOOLS
    if thinking is not None:
        kw["enable_thinking"] = thinking
    got = ours.render(messages, **kw)
    assert got == _hf(tok, messages, **kw)
    assert got.endswith("<think>\n" if thinking is None else "<think>\n\n</think>\n\n")


def test_reasoning_is_kept_only_after_the_last_query(template):
    ours, _ = template
    text = ours.render(CONVERSATIONS["multi_turn_reasoning"], add_generation_prompt=False)
    assert "small ones" not in text and "next one" not in text   # before the last user query
    follow = CONVERSATIONS["multi_turn_reasoning"] + [
        {"role": "assistant", "content": "5", "reasoning_content": "keep me"}]
    assert "<think>\nkeep me\n</think>\n\n5<|im_end|>" in ours.render(follow,
                                                                      add_generation_prompt=False)


def test_tool_calls_and_responses(template):
    ours, _ = template
    text = ours.render(CONVERSATIONS["tools"], tools=TOOLS, add_generation_prompt=True)
    assert "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" in text
    assert '<parameter=opts>\n{"unit": "C"}\n</parameter>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrainy" \
           "\n</tool_response><|im_end|>\n" in text
    assert text.count('"name": "get_weather"') == 1          # the tools block, as JSON


def test_template_errors_are_one_bonsai_error(template):
    ours, _ = template
    with pytest.raises(BonsaiError, match="No user query found"):
        ours.render([{"role": "system", "content": "only a system prompt"}])
    with pytest.raises(BonsaiError, match="Unexpected message role"):
        ours.render([{"role": "user", "content": "hi"}, {"role": "narrator", "content": "x"}])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_published_qwen35_template_renders_as_transformers(template, upstream_vendor, name):
    """The real Qwen3.5-4B template (7.7 kB), rendered by ChatTemplate and by transformers."""
    _, tok = template
    path = upstream_vendor / "models" / "templates" / "Qwen3.5-4B.jinja"
    if not path.is_file():
        pytest.skip(f"{path} is not in the fetched tree")
    source = path.read_text(encoding="utf-8")
    kw = {"add_generation_prompt": True, "tools": TOOLS if name == "tools" else None}
    got = ChatTemplate(source, eos_token="<|im_end|>").render(CONVERSATIONS[name], **kw)
    want = tok.apply_chat_template(CONVERSATIONS[name], chat_template=source, tokenize=False,
                                   **{k: v for k, v in kw.items() if v is not None})
    assert got == want
