"""Tool calls: OpenAI's `tools` / `tool_choice` over the model's own tool-call syntax.

The chat template decides how a model calls tools, so the syntax is detected from the template text
(as llama.cpp's built-in chat formats are):
- **hermes**: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5, Qwen3, Hermes;
  an output that is only such an object naming a tool, without the tags, counts too: small models
  drop them), or with the XML body `<function=NAME><parameter=KEY>VALUE</parameter></function>` when the template
  shows it (Qwen3-Coder, Qwen3.5);
- **llama3**: a bare JSON object `{"name": ..., "parameters": {...}}` naming a tool, optionally after
  `<|python_tag|>`, several separated by `;` (Llama 3.1 / 3.2 / 3.3);
- **mistral**: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` objects, or the newer
  `[TOOL_CALLS]name[ARGS]{...}` form.
A template that does not mention tools (or the ChatML fallback) gets the hermes syntax, with the
tools described in a system message the plan adds to the conversation.

`ToolPlan` holds one request's tools and choice:
- `auto`: the tools are rendered into the prompt, the output is parsed; calls found come back as
  OpenAI `tool_calls` (finish_reason "tool_calls"), the rest of the text as the content;
- `none`: the tools are left out of the prompt and nothing is parsed;
- `required` / `{"type": "function", "function": {"name": N}}`: a grammar (constrained.py) forces
  the output to be one call (one or more with `parallel_tool_calls=True`) in the model's syntax, whose
  arguments follow the tool's JSON schema.
Assistant messages with `tool_calls` and `tool` messages render back through the template; JSON-text
`arguments` are decoded to objects first, as templates expect (Transformers passes them so).
`ToolCallStream` does the same parsing incrementally for streamed responses: content is passed on
as it comes, except from the first call marker on, which is held back and parsed at the end.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .constrained import Constraint, ConstraintError, checked_lark
from .errors import BonsaiError

__all__ = ["ToolCallError", "ToolPlan", "ToolCallStream", "ChunkFilter", "apply_to_response", "plan_tools",
           "detect_syntax"]


class ToolCallError(BonsaiError):
    """Malformed `tools` / `tool_choice`; `param` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class _Syntax:
    name: str            # hermes, hermes-xml, llama3, mistral
    markers: tuple       # output text that opens a tool call
    bare_json: bool      # a call may also start the output as a bare JSON object


HERMES = _Syntax("hermes", ("<tool_call>",), True)
HERMES_XML = _Syntax("hermes-xml", ("<tool_call>",), False)
LLAMA3 = _Syntax("llama3", ("<|python_tag|>",), True)
MISTRAL = _Syntax("mistral", ("[TOOL_CALLS]",), False)


def detect_syntax(template: Optional[str]) -> tuple[_Syntax, bool]:
    """(the tool-call syntax of a chat template, whether the template renders `tools` itself)."""
    text = template or ""
    renders_tools = "tools" in text
    if "[TOOL_CALLS]" in text:
        return MISTRAL, renders_tools
    if "<tool_call>" in text:
        return (HERMES_XML if "<function=" in text else HERMES), renders_tools
    if "<|python_tag|>" in text or ("ipython" in text and "parameters" in text):
        return LLAMA3, renders_tools
    return HERMES, False


def _check_tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        raise ToolCallError(f"tools must be a list of {{\"type\": \"function\", \"function\": {{...}}}} objects, "
                            f"not {type(tools).__name__}", "tools")
    seen = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ToolCallError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                f"\"parameters\": {{...}}}}}}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ToolCallError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-', "
                                f"got {name!r}", "tools")
        if name in seen:
            raise ToolCallError(f"tools[{i}]: the function name {name!r} is given twice", "tools")
        seen.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolCallError(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
    return tools


def _check_choice(choice: Any, tools: list[dict]) -> str:
    """"auto", "none", "required" or the forced function's name."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise ToolCallError(f"tool_choice must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
                                f"\"function\": {{\"name\": ...}}}}, got {choice!r}", "tool_choice")
        if choice == "required" and not tools:
            raise ToolCallError("tool_choice \"required\" needs at least one tool in tools", "tool_choice")
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise ToolCallError("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                            "tool_choice")
    if name not in {t["function"]["name"] for t in tools}:
        raise ToolCallError(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
    return name


def _decoded_arguments(messages: Any) -> Any:
    """Messages with each assistant tool call's JSON-text `arguments` decoded to an object."""
    if not isinstance(messages, list):
        return messages
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(calls, list):
            m = {**m, "tool_calls": [_decode_call(c) for c in calls]}
        out.append(m)
    return out


def _decode_call(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            return call
        if isinstance(args, dict):
            return {**call, "function": {**fn, "arguments": args}}
    return call


def _tools_system_text(tools: list[dict]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou can call these functions, described as JSON inside <tools></tools>:\n<tools>\n"
            f"{lines}\n</tools>\n\nTo call a function, answer with a JSON object holding its name and its "
            "arguments inside <tool_call></tool_call> tags:\n<tool_call>\n"
            "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")


def _with_tools_system(messages: list, tools: list[dict]) -> list:
    text = _tools_system_text(tools)
    if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" and \
            isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + text}] + list(messages[1:])
    return [{"role": "system", "content": text}] + list(messages)


def _call_schema(tool: dict, args_key: str) -> dict:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False}


def _lark_string(text: str) -> str:
    return json.dumps(text)


# JSON in forced calls is written the way json.dumps (and so most training data) writes it.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _lark_json(schema: dict) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_STYLE})


class ToolPlan:
    """One request's tools, tool_choice and the model's tool-call syntax (see the module docstring)."""

    def __init__(self, tools: list[dict], choice: str, template: Optional[str], parallel: bool):
        self.tools = tools
        self.choice = choice
        self.syntax, self._template_renders = detect_syntax(template)
        self.parallel = parallel
        self.parse_output = True  # False: calls stay in the content (llama-server's parse_tool_calls)

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.active and self.choice != "auto"

    def template_tools(self) -> Optional[list[dict]]:
        """The `tools` variable for the chat template (None: leave it unset)."""
        return self.tools if self.active and self._template_renders else None

    def messages(self, messages: Any) -> Any:
        """The conversation as the template should see it."""
        messages = _decoded_arguments(messages)
        if self.active and not self._template_renders and isinstance(messages, list):
            messages = _with_tools_system(messages, self.tools)
        return messages

    def constraint(self, special_id: Callable[[str], Optional[int]]) -> Optional[Constraint]:
        """The grammar of a forced call; `special_id(text)` is the id of the special token spelled
        `text` (so the grammar emits the token the model was trained on), or None."""
        if not self.forced:
            return None
        tools = self.tools if self.choice == "required" else \
            [t for t in self.tools if t["function"]["name"] == self.choice]

        def lit(text: str) -> str:
            tid = special_id(text)
            return f"<[{tid}]>" if tid is not None else _lark_string(text)

        s = self.syntax
        if s is MISTRAL:
            one = {"anyOf": [_call_schema(t, "arguments") for t in tools]}
            items = {"type": "array", "items": one, "minItems": 1}
            if not self.parallel:
                items["maxItems"] = 1
            rules = [f"start: {lit('[TOOL_CALLS]')} calls", f"calls: {_lark_json(items)}"]
        elif s is LLAMA3:
            one = {"anyOf": [_call_schema(t, "parameters") for t in tools]}
            rules = ["start: call (\"; \" call)*" if self.parallel else "start: call", f"call: {_lark_json(one)}"]
        elif s is HERMES_XML:
            rules = ["start: tc (\"\\n\" tc)*" if self.parallel else "start: tc",
                     f"tc: {lit('<tool_call>')} \"\\n\" fn \"\\n\" {lit('</tool_call>')}",
                     "fn: " + " | ".join(f"fn{i}" for i in range(len(tools)))]
            for i, t in enumerate(tools):
                rules += _xml_rules(i, t)
        else:
            one = {"anyOf": [_call_schema(t, "arguments") for t in tools]}
            rules = ["start: tc (\"\\n\" tc)*" if self.parallel else "start: tc",
                     f"tc: {lit('<tool_call>')} \"\\n\" call \"\\n\" {lit('</tool_call>')}",
                     f"call: {_lark_json(one)}"]
        try:
            return checked_lark("\n".join(rules) + "\n", "tool_choice", "tool_choice")
        except ConstraintError as e:
            raise ToolCallError(f"the tools' parameters do not compile into a grammar: {e}", "tools") from None

    def parse(self, text: str) -> tuple[Optional[str], list[dict]]:
        """(content, OpenAI tool_calls) of a finished output; content None when only calls were found."""
        if not self.active or not self.parse_output:
            return text, []
        content, calls = _parse(self.syntax, text, {t["function"]["name"] for t in self.tools})
        tool_calls = [{"id": "call_" + secrets.token_hex(12), "type": "function",
                       "function": {"name": name, "arguments": args}} for name, args in calls]
        if tool_calls and not content.strip():
            return None, tool_calls
        return content, tool_calls

    def stream(self) -> "ToolCallStream":
        return ToolCallStream(self)


def _xml_rules(i: int, tool: dict) -> list[str]:
    """Lark rules for one function in the XML body: its parameters in schema order, the required
    ones always, the others optionally; string values as plain text, the rest as JSON."""
    fn = tool["function"]
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    parts = []
    for j, (key, schema) in enumerate(props.items()):
        value = "/[^<]*/" if isinstance(schema, dict) and schema.get("type") == "string" else \
            _lark_json(schema if isinstance(schema, dict) else {})
        item = f"\"<parameter={key}>\\n\" {value} \"\\n</parameter>\\n\""
        parts.append(item if key in required else f"({item})?")
    body = " ".join(parts)
    return [f"fn{i}: \"<function={fn['name']}>\\n\" {body} \"</function>\""]


_XML_FN = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_XML_PARAM = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)


def _xml_call(body: str) -> Optional[tuple[str, str]]:
    m = _XML_FN.search(body)
    if not m:
        return None
    args = {}
    for key, raw in _XML_PARAM.findall(m.group(2)):
        try:
            args[key] = json.loads(raw)
        except ValueError:
            args[key] = raw
    return m.group(1), json.dumps(args, ensure_ascii=False)


def _json_call(obj: Any, args_keys: Sequence[str]) -> Optional[tuple[str, str]]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in args_keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):  # some models write the arguments as JSON text
                try:
                    args = json.loads(args)
                except ValueError:
                    return None
            return (obj["name"], json.dumps(args, ensure_ascii=False)) if isinstance(args, dict) else None
    return obj["name"], "{}"


def _json_prefix(text: str) -> tuple[Any, int]:
    """The JSON value at the start of `text` (after whitespace) and where it ends; (None, 0) if none."""
    start = len(text) - len(text.lstrip())
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None, 0


def _bare_calls(body: str, keys: Sequence[str], names: set) -> list[tuple[str, str]]:
    """The calls when `body` is nothing but JSON call objects (separated by ';') naming known tools."""
    calls, pos = [], 0
    while True:
        obj, end = _json_prefix(body[pos:])
        call = _json_call(obj, keys) if end else None
        if call is None or call[0] not in names:
            return []
        calls.append(call)
        pos += end
        rest = body[pos:].lstrip()
        if not rest.startswith(";"):
            return calls if not rest.strip() else []
        pos = len(body) - len(rest) + 1


def _parse(s: _Syntax, text: str, names: set) -> tuple[str, list[tuple[str, str]]]:
    if s in (HERMES, HERMES_XML):
        calls, kept, pos = [], [], 0
        for m in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|$)", text, re.S):
            body = m.group(1).strip()
            obj, end = _json_prefix(body)
            call = _json_call(obj, ("arguments", "parameters")) if end else _xml_call(body)
            if call is None:
                continue
            kept.append(text[pos:m.start()])
            pos = m.end()
            calls.append(call)
        kept.append(text[pos:])
        if calls:
            return "".join(kept).strip(), calls
        # small models often drop the tags: a bare call object naming a tool counts
        calls = _bare_calls(text, ("arguments", "parameters"), names)
        return ("", calls) if calls else (text, [])
    if s is MISTRAL:
        at = text.find("[TOOL_CALLS]")
        if at < 0:
            return text, []
        rest = text[at + len("[TOOL_CALLS]"):]
        obj, end = _json_prefix(rest)
        objs = obj if isinstance(obj, list) else [obj] if end else []
        calls = [c for c in (_json_call(o, ("arguments", "parameters")) for o in objs) if c]
        if not calls:  # the newer form: name[ARGS]{...} (optionally [CALL_ID]id before [ARGS])
            for m in re.finditer(r"([A-Za-z0-9_.\-]+)(?:\[CALL_ID\][^\[]*)?\[ARGS\]", rest):
                args, end2 = _json_prefix(rest[m.end():])
                if end2 and isinstance(args, dict):
                    calls.append((m.group(1), json.dumps(args, ensure_ascii=False)))
        return (text[:at].strip(), calls) if calls else (text, [])
    # llama3: optional <|python_tag|>, then JSON objects separated by ';'
    head, tag, body = text.partition("<|python_tag|>")
    calls = _bare_calls(body if tag else text, ("parameters", "arguments"), names)
    return ((head.strip() if tag else ""), calls) if calls else (text, [])


class ToolCallStream:
    """Incremental parsing of a streamed output: `feed(text)` returns the content that can be sent
    now; `finish()` returns (the content still held, the OpenAI tool_calls) once the output ends."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self._held = ""       # text not yet passed on
        self._sent = ""       # text passed on as content
        self._in_call = False

    def feed(self, text: str) -> str:
        if not self.plan.active or not self.plan.parse_output:
            return text
        self._held += text
        if self._in_call:
            return ""
        s = self.plan.syntax
        if s.bare_json and not self._sent and self._held.lstrip()[:1] in ("{", ""):
            self._in_call = bool(self._held.strip())
            return ""
        at = min((i for i in (self._held.find(m) for m in s.markers) if i >= 0), default=-1)
        if at >= 0:
            self._in_call = True
            out, self._held = self._held[:at], self._held[at:]
        else:  # keep back a tail that could be the start of a marker
            keep = max((k for m in s.markers for k in range(1, len(m)) if self._held.endswith(m[:k])), default=0)
            out, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        self._sent += out
        return out

    def finish(self) -> tuple[str, list[dict]]:
        if not self.plan.active or not self.plan.parse_output or not self._held:
            return self._held, []
        content, calls = self.plan.parse(self._held)
        return ("" if content is None else content), calls


def apply_to_response(plan: ToolPlan, response: dict) -> dict:
    """A chat.completion response with the tool calls of its message parsed out (in place)."""
    choice = response["choices"][0]
    content, calls = plan.parse(choice["message"]["content"] or "")
    if calls:
        choice["message"]["content"] = content
        choice["message"]["tool_calls"] = calls
        choice["finish_reason"] = "tool_calls"
    return response


class ChunkFilter:
    """Rewrites a stream of chat.completion.chunk objects: content deltas pass through the plan's
    ToolCallStream; at the finishing chunk the held content, then one delta per tool call
    (index, id, type, function name and arguments) come out, and finish_reason becomes "tool_calls"."""

    def __init__(self, plan: ToolPlan):
        self._stream = plan.stream()
        self._index = 0

    def __call__(self, chunk: dict) -> list[dict]:
        if not chunk.get("choices"):
            return [chunk]
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        if delta.get("content"):
            text = self._stream.feed(delta["content"])
            if not text and not choice.get("logprobs"):
                return []
            return [_with_choice(chunk, delta={**delta, "content": text})]
        if choice.get("finish_reason") is None:
            return [chunk]
        content, calls = self._stream.finish()
        out = []
        if content:
            out.append(_with_choice(chunk, delta={"content": content}, finish_reason=None, logprobs=None))
        if calls:
            deltas = [{"index": self._index + i, **c} for i, c in enumerate(calls)]
            self._index += len(calls)
            out.append(_with_choice(chunk, delta={"tool_calls": deltas}, finish_reason=None, logprobs=None))
            chunk = _with_choice(chunk, finish_reason="tool_calls")
        return out + [chunk]


def _with_choice(chunk: dict, **fields) -> dict:
    return {**chunk, "choices": [{**chunk["choices"][0], **fields}]}


def plan_tools(tools: Any, tool_choice: Any, template: Optional[str], parallel_tool_calls: Any = None) -> ToolPlan:
    """Validates a request's tools / tool_choice / parallel_tool_calls against the template's syntax."""
    tools = [] if tools is None else _check_tools(tools)
    choice = _check_choice(tool_choice, tools)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ToolCallError("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    return ToolPlan(tools, choice, template, bool(parallel_tool_calls))
