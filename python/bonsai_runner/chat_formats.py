"""Built-in chat formats selected by name (`Llama(chat_format="llama-3")`), as llama-cpp-python's
`chat_format=` names them. Each is a Jinja2 template rendered by `ChatTemplate` (chat_template.py)
instead of the template stored in the model file, plus the strings that end an assistant turn.

A system message is kept where the format has a place for one (chatml, llama-2, llama-3, vicuna,
alpaca, zephyr); formats without a system role (mistral-instruct, gemma) put it in front of the
first user message. `qwen` is ChatML with Qwen's default system prompt when the messages have none.
"""

from __future__ import annotations

from dataclasses import dataclass

from .chat_template import CHATML_TEMPLATE
from .errors import BonsaiError

__all__ = ["ChatFormat", "CHAT_FORMATS", "chat_format"]


@dataclass(frozen=True)
class ChatFormat:
    template: str  # Jinja2, with messages / add_generation_prompt / bos_token / eos_token
    stop: tuple[str, ...]  # text that ends the assistant's turn


# Every literal is written as a {{ '...' }} expression and every tag strips the white space around
# it ({%- -%}), so the output is exactly the expressions' text whatever trim_blocks does.

# ns.system: the system messages' text followed by a blank line (formats without a system role
# put it in front of the first user message).
_FOLD_SYSTEM = (
    "{%- set ns = namespace(system='', first=true) -%}"
    "{%- for m in messages if m['role'] == 'system' -%}{%- set ns.system = ns.system + m['content'] + '\n\n' -%}"
    "{%- endfor -%}"
)

_LLAMA2 = (
    "{%- set ns = namespace(system='', first=true) -%}"
    "{%- for m in messages if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}{%- endfor -%}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{%- if m['role'] == 'user' -%}"
    "{{ bos_token + '[INST] ' }}"
    "{%- if ns.first and ns.system -%}{{ '<<SYS>>\n' + ns.system + '\n<</SYS>>\n\n' }}{%- endif -%}"
    "{{ m['content'] + ' [/INST]' }}"
    "{%- set ns.first = false -%}"
    "{%- else -%}{{ ' ' + m['content'] + ' ' + eos_token }}{%- endif -%}"
    "{%- endfor -%}"
)

_LLAMA3 = (
    "{{ bos_token }}"
    "{%- for m in messages -%}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif -%}"
)

_MISTRAL = (
    _FOLD_SYSTEM + "{{ bos_token }}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{%- if m['role'] == 'user' -%}"
    "{{ '[INST] ' + (ns.system if ns.first else '') + m['content'] + ' [/INST]' }}"
    "{%- set ns.first = false -%}"
    "{%- else -%}{{ m['content'] + eos_token }}{%- endif -%}"
    "{%- endfor -%}"
)

_GEMMA = (
    _FOLD_SYSTEM + "{{ bos_token }}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{%- set prefix = ns.system if m['role'] == 'user' and ns.first else '' -%}"
    "{%- if m['role'] == 'user' -%}{%- set ns.first = false -%}{%- endif -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + prefix + "
    "m['content'] + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_QWEN = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{%- endif -%}" + CHATML_TEMPLATE
)

_VICUNA = (
    "{%- set ns = namespace(system='A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user\\'s questions.') -%}"
    "{%- for m in messages if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}{%- endfor -%}"
    "{{ ns.system }}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{%- if m['role'] == 'user' -%}{{ ' USER: ' + m['content'] }}"
    "{%- else -%}{{ ' ASSISTANT: ' + m['content'] + eos_token }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ ' ASSISTANT:' }}{%- endif -%}"
)

_ALPACA = (
    "{%- set ns = namespace(system='Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.') -%}"
    "{%- for m in messages if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}{%- endfor -%}"
    "{{ ns.system + '\n\n' }}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{%- if m['role'] == 'user' -%}{{ '### Instruction:\n' + m['content'] + '\n\n' }}"
    "{%- else -%}{{ '### Response:\n' + m['content'] + '\n\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '### Response:\n' }}{%- endif -%}"
)

_ZEPHYR = (
    "{%- for m in messages -%}"
    "{{ '<|' + m['role'] + '|>\n' + m['content'] + eos_token + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)

CHAT_FORMATS: dict[str, ChatFormat] = {
    "chatml": ChatFormat(CHATML_TEMPLATE, ("<|im_end|>",)),
    "qwen": ChatFormat(_QWEN, ("<|im_end|>", "<|endoftext|>")),
    "llama-2": ChatFormat(_LLAMA2, ("</s>",)),
    "llama-3": ChatFormat(_LLAMA3, ("<|eot_id|>",)),
    "mistral-instruct": ChatFormat(_MISTRAL, ("</s>",)),
    "gemma": ChatFormat(_GEMMA, ("<end_of_turn>",)),
    "vicuna": ChatFormat(_VICUNA, ("</s>", "USER:")),
    "alpaca": ChatFormat(_ALPACA, ("###",)),
    "zephyr": ChatFormat(_ZEPHYR, ("</s>",)),
}


def chat_format(name: str) -> ChatFormat:
    """The built-in format called `name`; a BonsaiError (ValueError) listing the known names otherwise."""
    if not isinstance(name, str) or name not in CHAT_FORMATS:
        raise BonsaiError(f"unknown chat_format={name!r}; use one of {', '.join(sorted(CHAT_FORMATS))}, "
                          "or chat_template=... with a Jinja2 template")
    return CHAT_FORMATS[name]
