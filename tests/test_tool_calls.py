"""Tool calls (tool_calls.py): parsing per template family, streaming, forced calls by grammar, and
the OpenAI shapes through `Llama` and the server (official `openai` client), on tiny random models
(their free output is noise, so a call whose arguments validate can only come from the grammar).
The real-model test asks Qwen2.5-Coder-0.5B-Instruct for the weather with tool_choice "auto"."""

from __future__ import annotations

import json
import random

import pytest

from bonsai_runner.tool_calls import ToolCallError, detect_syntax, plan_tools
from test_llama_api_e2e import engine, write_tiny_gguf

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
                                                                                 "maximum": 14}},
                                       "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]

# A hermes-style template of this test's own: tools in a system turn, calls and results rendered back.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant"
    "{% for c in m.tool_calls %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _check_calls(calls, names=None):
    assert calls, "no tool call came back"
    for c in calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        name = c["function"]["name"]
        assert names is None or name in names
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])


# ---- parsing ----------------------------------------------------------------------------------

CASES = [
    ("<tool_call> tools", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
     '"unit": "celsius"}}\n</tool_call>', "Let me check.", [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("<tool_call> tools", '<tool_call>\n{"name": "get_time", "arguments": {"zone": 1}}\n</tool_call>\n<tool_call>\n'
     '{"name": "get_time", "arguments": "{\\"zone\\": 2}"}\n</tool_call>', None,
     [("get_time", {"zone": 1}), ("get_time", {"zone": 2})]),
    ("<tool_call><function= tools", "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
     "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>", None,
     [("get_weather", {"city": "New York", "unit": "celsius"})]),
    ("<|python_tag|> tools", '{"name": "get_time", "parameters": {"zone": 3}}; {"name": "get_time", '
     '"parameters": {"zone": 4}}', None, [("get_time", {"zone": 3}), ("get_time", {"zone": 4})]),
    ("[TOOL_CALLS] tools", '[TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": 5}}]', None,
     [("get_time", {"zone": 5})]),
    ("[TOOL_CALLS] tools", '[TOOL_CALLS]get_time[ARGS]{"zone": 6}', None, [("get_time", {"zone": 6})]),
    ("<tool_call> tools", "No call here, only <b>text</b>.", "No call here, only <b>text</b>.", []),
    ("<tool_call> tools", "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ("<|python_tag|> tools", '{"a": 1} is a JSON object', '{"a": 1} is a JSON object', []),
    ("<tool_call> tools", ' {"name": "get_time", "arguments": {"zone": 7}}', None, [("get_time", {"zone": 7})]),
    ("<tool_call> tools", '{"name": "other", "arguments": {}}', '{"name": "other", "arguments": {}}', []),
    ("<|python_tag|> tools", '{"name": "other", "parameters": {}}', '{"name": "other", "parameters": {}}', []),
]


@pytest.mark.parametrize("template,text,content,calls", CASES)
def test_parse_each_family(template, text, content, calls):
    plan = plan_tools(TOOLS, "auto", template)
    got_content, got = plan.parse(text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    # streamed in random pieces, the content sent plus the content held equal the whole parse
    rng = random.Random(len(text))
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), min(6, len(text) - 1)))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        s = plan.stream()
        sent = "".join(s.feed(p) for p in pieces)
        tail, streamed = s.finish()
        assert (sent + tail).strip() == (content or "").strip()
        assert [c["function"] for c in streamed] == [c["function"] for c in got]


def test_detect_syntax():
    assert detect_syntax("... <tool_call> ... tools")[0].name == "hermes"
    assert detect_syntax("... <tool_call> <function=x> ... tools")[0].name == "hermes-xml"
    assert detect_syntax("[TOOL_CALLS] tools")[0].name == "mistral"
    assert detect_syntax("<|python_tag|> tools")[0].name == "llama3"
    assert detect_syntax(None) == (detect_syntax("")[0], False)


def test_bad_tools_and_choices_name_the_field():
    bad = [(dict(tools="x"), "tools"), (dict(tools=[{"type": "function"}]), "tools"),
           (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools"),
           (dict(tools=[WEATHER, WEATHER]), "tools"), (dict(tools=TOOLS, tool_choice="always"), "tool_choice"),
           (dict(tools=[], tool_choice="required"), "tool_choice"),
           (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
           (dict(tools=TOOLS, tool_choice={"type": "function"}), "tool_choice"),
           (dict(tools=TOOLS, parallel_tool_calls="yes"), "parallel_tool_calls")]
    for kwargs, param in bad:
        with pytest.raises(ToolCallError) as e:
            plan_tools(kwargs.get("tools"), kwargs.get("tool_choice"), "<tool_call> tools",
                       kwargs.get("parallel_tool_calls"))
        assert e.value.param == param, kwargs


@pytest.mark.parametrize("template", ["<tool_call> tools", "<tool_call><function= tools", "<|python_tag|> tools",
                                      "[TOOL_CALLS] tools", None])
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_grammars_compile(template, parallel):
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        plan = plan_tools(TOOLS, choice, template, parallel)
        c = plan.constraint(lambda text: 7 if text == "<tool_call>" else None)
        assert llguidance.LLMatcher.validate_grammar(c.grammar) == ""
    assert plan_tools(TOOLS, "auto", template).constraint(lambda t: None) is None
    assert plan_tools(TOOLS, "none", template).template_tools() is None


def test_messages_decode_arguments_and_fallback_adds_tools():
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_time", "arguments": "{\"zone\": 1}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    plan = plan_tools(TOOLS, "auto", HERMES_TEMPLATE)
    out = plan.messages(history)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"zone": 1}
    assert history[1]["tool_calls"][0]["function"]["arguments"] == "{\"zone\": 1}"  # the caller's list is kept
    assert plan.template_tools() == TOOLS
    fallback = plan_tools(TOOLS, "auto", None)  # ChatML: no tools in the template, so a system turn says them
    assert fallback.template_tools() is None
    msgs = fallback.messages(history)
    assert msgs[0]["role"] == "system" and "get_weather" in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]


# ---- Llama and the server on a tiny random model ------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "tiny.gguf"
    write_tiny_gguf(path, user_tokens=("<tool_call>", "</tool_call>"), chat_template=HERMES_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def llm(tiny):
    from bonsai_runner import Llama

    llama = Llama(tiny, n_ctx=2048, verbose=False)
    yield llama
    llama.close()


@engine
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_llama_required_and_named(llm, seed):
    r = llm.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0.9,
                                   seed=seed)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    _check_calls(choice["message"]["tool_calls"])
    assert len(choice["message"]["tool_calls"]) == 1
    named = {"type": "function", "function": {"name": "get_time"}}
    r = llm.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=120, temperature=0.9,
                                   seed=seed)
    _check_calls(r["choices"][0]["message"]["tool_calls"], {"get_time"})


@engine
def test_llama_forced_call_uses_the_special_token(llm):
    r = llm.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0,
                                   logprobs=True, top_logprobs=1)
    tokens = [t["token"] for t in r["choices"][0]["logprobs"]["content"]]
    assert tokens[0] == "<tool_call>" and tokens[-1] == "</tool_call>"


@engine
def test_llama_stream_deltas(llm):
    chunks = list(llm.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=120,
                                             temperature=0.9, seed=4, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"}
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [tc["index"] for tc in calls] == [0]
    assert not any(d.get("content") for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    _check_calls([{k: v for k, v in tc.items() if k != "index"} for tc in calls])


@engine
def test_llama_history_with_tool_results_renders(llm):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = llm.create_chat_completion(history, tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0)
    assert "tool_calls" not in r["choices"][0]["message"]
    prompt = llm._chat.render(plan_tools(TOOLS, "auto", llm._chat.source).messages(history), text_only=True,
                              tools=TOOLS)
    assert '"arguments": {"city": "Paris", "unit": "celsius"}}' in prompt  # decoded, not JSON text in JSON
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompt
    with pytest.raises(ValueError, match="tool_choice"):
        llm.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})


@pytest.fixture(scope="module")
def server(tiny):
    from bonsai_runner.server import ServingEngine
    from test_server import _Server

    s = _Server(ServingEngine(tiny, n_parallel=2, n_ctx_slot=2048, n_batch=64, n_threads=2))
    yield s
    s.stop()


@engine
def test_server_required_with_openai_client(server):
    c = server.client()
    r = c.chat.completions.create(model="x", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=120,
                                  temperature=0.9, seed=11)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check_calls([tc.model_dump() for tc in choice.message.tool_calls])
    named = c.chat.completions.create(model="x", messages=MESSAGES, tools=TOOLS, max_tokens=120, temperature=0.9,
                                      seed=12, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    _check_calls([tc.model_dump() for tc in named.choices[0].message.tool_calls], {"get_weather"})
    stream = c.chat.completions.create(model="x", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       max_tokens=120, temperature=0.9, seed=13, stream=True,
                                       parallel_tool_calls=False)
    chunks = list(stream)
    calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    _check_calls([{"id": tc.id, "type": tc.type, "function": tc.function.model_dump()} for tc in calls])


@engine
def test_server_auto_and_refusals(server):
    import openai

    c = server.client()
    r = c.chat.completions.create(model="x", messages=MESSAGES, tools=TOOLS, tool_choice="auto", max_tokens=20,
                                  temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    for kwargs, param in ((dict(tool_choice="always"), "tool_choice"),
                          (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
                          (dict(tools=[{"type": "function", "function": {}}]), "tools"),
                          (dict(tool_choice="required", response_format={"type": "json_object"}), "tool_choice")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="x", messages=MESSAGES, max_tokens=4, **{"tools": TOOLS, **kwargs})
        assert e.value.body["param"] == param, kwargs


# ---- the real model -----------------------------------------------------------------------------

@engine
@pytest.mark.real_model
def test_real_model_weather_tool_auto(real_model_path):
    from bonsai_runner import Llama
    from test_engine_real_model import converted

    llm = Llama(str(converted(real_model_path, "q8_0")), n_ctx=1024, verbose=False)
    try:
        weather = {"type": "function", "function": {
            "name": "get_current_weather", "description": "Get the current weather in a given city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
        r = llm.create_chat_completion([{"role": "user", "content": "What's the weather like in Paris today?"}],
                                       tools=[weather], tool_choice="auto", max_tokens=96, temperature=0)
        choice = r["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice["message"]
        call = choice["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_current_weather"
        args = json.loads(call["arguments"])
        jsonschema.validate(args, weather["function"]["parameters"])
        assert "paris" in args["city"].lower()
    finally:
        llm.close()


from real_model import real_model_path  # noqa: E402,F401  (fixture)
