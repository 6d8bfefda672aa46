"""Chat prompt rendering: the model file's Jinja2 chat template, or ChatML when the file has none.

A GGUF file carries its Hugging Face chat template as the string `tokenizer.chat_template`. It is
rendered the way Transformers renders it, so prompts match what the model was trained on:
- a sandboxed (immutable) Jinja2 environment with `trim_blocks` and `lstrip_blocks`, the
  `loopcontrols` extension and a pass-through for the `{% generation %}` block tag;
- variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, the callables
  `raise_exception(msg)` and `strftime_now(fmt)`, plus any extra keyword (e.g. `tools`);
- a `tojson` filter that keeps non-ASCII characters as they are (`ensure_ascii=False`).

Files without a template fall back to ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n`), the format
most small instruction-tuned models use. With `text_only=True` (what the engine's front ends,
Llama.create_chat_completion and the server, pass) a message whose `content` is a list of OpenAI
content parts (`[{"type": "text", "text": "Hi"}, ...]`) is rendered as its parts' text concatenated
(no separator), and a part of another type (image_url, input_audio, file, ...) is refused by name:
the engine reads text only; without it the parts reach the template as they are (as Transformers
passes them). Every failure — a template that does not parse, a template
that raises, malformed messages — is reported as one BonsaiError naming the problem.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import BonsaiError

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "validate_messages"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_ROLES_HINT = "each message must be a dict with a string 'role' and a 'content' (string, list of parts or None)"


class _TemplateRaised(Exception):
    """Carries the message of the template's own `raise_exception(...)` call out of Jinja2."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; when
    rendering a prompt it only outputs its body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)  # the `generation` name token
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str):
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def validate_messages(messages: Any, text_only: bool = False) -> list[dict]:
    """Checks the OpenAI-style message list; returns it as a list of plain dicts, with list
    contents joined into their text when `text_only`."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise BonsaiError(f"messages must be a list of message dicts, not {type(messages).__name__}")
    if len(messages) == 0:
        raise BonsaiError("messages is empty: give at least one message, e.g. "
                          "[{'role': 'user', 'content': 'Hello'}]")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise BonsaiError(f"messages[{i}] is a {type(m).__name__}; {_ROLES_HINT}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise BonsaiError(f"messages[{i}] has no string 'role'; {_ROLES_HINT}")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BonsaiError(f"messages[{i}]['content'] is a {type(content).__name__}; {_ROLES_HINT}")
        m = dict(m)
        if text_only and isinstance(content, list):
            m["content"] = _parts_text(content, i)
        out.append(m)
    return out


def _parts_text(parts: list, i: int) -> str:
    """The text of a list of content parts, concatenated; only text parts are accepted."""
    texts = []
    for j, part in enumerate(parts):
        where = f"messages[{i}]['content'][{j}]"
        if not isinstance(part, Mapping):
            raise BonsaiError(f"{where} is a {type(part).__name__}; a content part must be a dict such as "
                              "{'type': 'text', 'text': 'Hello'}")
        kind = part.get("type")
        if kind != "text":
            shown = f"a part of type {kind!r}" if isinstance(kind, str) else "a part without a string 'type'"
            raise BonsaiError(f"{where} is {shown}: this engine reads text only (no images, audio or files); "
                              "send only {'type': 'text', 'text': ...} parts")
        text = part.get("text")
        if not isinstance(text, str):
            raise BonsaiError(f"{where} is a text part without a string 'text'; give {{'type': 'text', "
                              "'text': 'Hello'}")
        texts.append(text)
    return "".join(texts)


class ChatTemplate:
    """A compiled chat template. `source` is the Jinja2 text (None or "" selects ChatML)."""

    def __init__(self, source: str | None = None, *, bos_token: str = "", eos_token: str = ""):
        self.is_fallback = not source
        self.source = CHATML_TEMPLATE if self.is_fallback else source
        if not isinstance(self.source, str):
            raise BonsaiError(f"chat template must be a string, not {type(self.source).__name__}")
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
            extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise BonsaiError(f"the chat template does not parse (line {e.lineno}: {e.message}); "
                              "pass chat_template=... with a valid Jinja2 template") from None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], *, bos_token: str = "",
                      eos_token: str = "") -> "ChatTemplate":
        """The template stored in a GGUF file (`tokenizer.chat_template`), or ChatML when absent."""
        source = metadata.get("tokenizer.chat_template")
        if source is not None and not isinstance(source, str):
            raise BonsaiError("metadata key tokenizer.chat_template is not a string; "
                              "pass chat_template=... explicitly")
        return cls(source, bos_token=bos_token, eos_token=eos_token)

    def render(self, messages: Any, *, add_generation_prompt: bool = True, text_only: bool = False,
               **extra: Any) -> str:
        """The prompt text; `text_only` joins content parts into text (see the module docstring)."""
        msgs = validate_messages(messages, text_only)
        variables = {k: v for k, v in extra.items() if v is not None}
        variables.update(
            messages=msgs, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token, eos_token=self.eos_token,
            raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            return self._template.render(**variables)
        except _TemplateRaised as e:
            raise BonsaiError(f"the chat template rejected the messages: {e}") from None
        except jinja2.TemplateError as e:
            raise BonsaiError(f"the chat template failed to render: {e}") from None
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise BonsaiError(f"the chat template failed to render the messages ({type(e).__name__}: "
                              f"{e}); {_ROLES_HINT}") from None
