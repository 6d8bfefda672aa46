"""bonsai_run's llama-cli conveniences (issue #18 item 6): chat mode in the file's chat template
(-i / -cnv, -sys), prompt escapes (-e / --no-escape), --version, --ignore-eos and -r.

Chat formats are checked against jinja2: for each family the reference template (the text the
model family ships as `tokenizer.chat_template`; the Gemma 3 one without its image-content branch)
is written into a tiny model, bonsai_run chats two turns with --verbose-prompt, and every text it
evaluates must be exactly what jinja2 renders (python/bonsai_runner/chat_template.py) for the same
conversation: the first turn whole, the next one only what it adds after the first reply (the
reply's end, the user turn, the generation prompt), so the cache is extended, never re-filled.

The model is the tiny random llama of tests/engine_fixtures.py with the output rows of the
special and byte tokens zeroed, so greedy decoding picks word tokens (" ab", " cd", ...) and the
output is plain text that -r can match.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from unittest import mock

import pytest
from gguf import GGUFWriter

import engine_fixtures
from conftest import bonsai_run_path
from engine_fixtures import Cfg, write_model
from qwen35_factory import QWEN35_CHAT_TEMPLATE

from bonsai_runner.chat_template import ChatTemplate

N_SPECIAL = 259  # <unk>, <s>, </s> and the 256 byte tokens of engine_fixtures' vocabulary
BOS, EOS = "<s>", "</s>"

# ----- reference chat templates (as the model families ship them) -----

QWEN2 = (r"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         r"{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
         r"{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
         r"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

LLAMA3 = (r"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          r"'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          r"'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          r"{{ content }}{% endfor %}{% if add_generation_prompt %}"
          r"{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Llama 3.1 / 3.2 without their tool-calling branches (the text is the same when no tools are given)
LLAMA31 = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

LLAMA32 = LLAMA31.replace(
    '    {%- set date_string = "26 Jul 2024" %}',
    '    {%- if strftime_now is defined %}\n'
    '        {%- set date_string = strftime_now("%d %b %Y") %}\n'
    '    {%- else %}\n'
    '        {%- set date_string = "26 Jul 2024" %}\n'
    '    {%- endif %}')

LLAMA2 = (r"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          r"{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          r"{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          r"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
          r"{% endif %}{% if loop.index0 == 0 and system_message != false %}"
          r"{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}"
          r"{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          r"{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          r"{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

MISTRAL = (r"{{ bos_token }}{% for message in messages %}"
           r"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
           r"{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           r"{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
           r"{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

GEMMA = (r"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
         r"supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
         r"(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/"
         r"user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
         r"{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
         r"message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
         r"{{'<start_of_turn>model\n'}}{% endif %}")

GEMMA3 = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

PHI3 = (r"{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
        r"message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
        r"message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + "
        r"message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
        r"{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

DEEPSEEK2 = (r"{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
             r"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
             r"{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}"
             r"{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
             r"{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
             r"{{ 'Assistant:' }}{% endif %}")

# DeepSeek R1 without its tool-calling branches; V3 the same without the open <think>
DEEPSEEK_R1 = ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
               "{% set ns = namespace(system_prompt='') %}{%- for message in messages %}"
               "{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}"
               "{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}"
               "{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}"
               "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
               "{% set content = message['content'] %}{% if '</think>' in content %}"
               "{% set content = content.split('</think>')[-1] %}{% endif %}"
               "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}"
               "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}")
DEEPSEEK_V3 = DEEPSEEK_R1.replace("<｜Assistant｜><think>\\n", "<｜Assistant｜>")

VICUNA = (r"{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
          r"{% elif message['role'] == 'user' %}{{ 'USER: ' + message['content'] + '\n' }}"
          r"{% elif message['role'] == 'assistant' %}{{ 'ASSISTANT: ' + message['content'] + '</s>\n' }}"
          r"{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")

VICUNA_ORCA = VICUNA.replace(r"{{ message['content'] + '\n\n' }}", r"{{ 'SYSTEM: ' + message['content'] + '\n' }}")

# (id, template, the name bonsai_run reports, whether the template takes a system message)
FAMILIES = [
    ("qwen2", QWEN2, "ChatML", True),
    ("qwen35", QWEN35_CHAT_TEMPLATE, "ChatML", True),
    ("llama3", LLAMA3, "Llama 3", True),
    ("llama31", LLAMA31, "Llama 3", True),
    ("llama32", LLAMA32, "Llama 3", True),
    ("llama2", LLAMA2, "Llama 2", True),
    ("mistral", MISTRAL, "Mistral", False),
    ("gemma", GEMMA, "Gemma", False),
    ("gemma3", GEMMA3, "Gemma", True),
    ("phi3", PHI3, "Phi-3", True),
    ("zephyr", ZEPHYR, "Zephyr", True),
    ("deepseek2", DEEPSEEK2, "DeepSeek 2", True),
    ("deepseek_r1", DEEPSEEK_R1, "DeepSeek 3", True),
    ("deepseek_v3", DEEPSEEK_V3, "DeepSeek 3", True),
    ("vicuna", VICUNA, "Vicuna", True),
    ("vicuna_orca", VICUNA_ORCA, "Vicuna", True),
]


def _write(path: Path, template: str | None = None, eos_id: int | None = None) -> Path:
    """The tiny llama with `template` as tokenizer.chat_template and `eos_id` as EOS."""

    class Writer(GGUFWriter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if template is not None:
                self.add_chat_template(template)

        def add_eos_token_id(self, token_id):
            super().add_eos_token_id(token_id if eos_id is None else eos_id)

        def add_tensor(self, name, tensor, *args, **kwargs):
            if name == "output.weight":
                tensor = tensor.copy()
                tensor[:N_SPECIAL] = 0.0  # never the likeliest: greedy output is word tokens
            super().add_tensor(name, tensor, *args, **kwargs)

    with mock.patch.object(engine_fixtures, "GGUFWriter", Writer):
        write_model(path, Cfg(), seed=3)
    return path


def _run(*args, stdin: bytes = b"", timeout=120):
    p = subprocess.run([bonsai_run_path(), *map(str, args)], input=stdin, capture_output=True, timeout=timeout)
    p.stderr = p.stderr.decode("utf-8", "replace")
    return p


COMMON = ("-t", "1", "-c", "512", "--temp", "0")
BLOCK = re.compile(r"\n--- prompt \((\d+) tokens\) ---\n(.*?)\n--- end prompt ---\n", re.S)


def _blocks(stderr: str) -> list[tuple[int, str]]:
    return [(int(n), text) for n, text in BLOCK.findall(stderr)]


def _jinja(template: str, messages: list[dict], add_generation_prompt: bool) -> str:
    return ChatTemplate(template, bos_token=BOS, eos_token=EOS).render(
        messages, add_generation_prompt=add_generation_prompt)


def _prompt_tokens(stderr: str) -> int:
    return int(re.search(r"prompt (\d+) tokens in", stderr).group(1))


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("cli") / "plain.gguf")


# ----- chat mode renders the file's template, as jinja2 does -----

@pytest.mark.parametrize("family,template,name,system", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_chat_turns_match_jinja(tmp_path, family, template, name, system):
    model = _write(tmp_path / f"{family}.gguf", template)
    sys_args = ("-sys", "You are terse.") if system else ()
    p = _run("-m", model, "-i", *sys_args, "-n", "3", "--ignore-eos", "--verbose-prompt", *COMMON,
             stdin=b"  Hello there \nAnd now?\n")
    assert p.returncode == 0, p.stderr
    assert f"chat mode ({name} turns)" in p.stderr
    assert "not one of the formats" not in p.stderr
    blocks = _blocks(p.stderr)
    assert len(blocks) == 4, p.stderr  # turn 1, end of reply 1, turn 2, end of reply 2

    history = [{"role": "system", "content": "You are terse."}] if system else []
    history.append({"role": "user", "content": "  Hello there "})  # the templates that trim do so
    first = _jinja(template, history, True)
    assert blocks[0][1] == first

    # whatever the reply, the template renders it between the first turn and the rest; the second
    # step must evaluate exactly that rest: the end of the reply, the user turn, the prompt
    reply = "Sure thing."
    second = _jinja(template, history + [{"role": "assistant", "content": reply},
                                         {"role": "user", "content": "And now?"}], True)
    if not first.endswith("<think>\n"):  # Qwen 3.5, R1 re-render earlier replies without the open <think>
        assert second.startswith(first)
    at = second.index(reply) + len(reply)
    assert blocks[1][1] + blocks[2][1] == second[at:]
    assert "Hello there" not in blocks[2][1]  # the cache is extended, not re-filled
    assert _prompt_tokens(p.stderr) == sum(n for n, _ in blocks)


def test_system_prompt_refused_where_the_template_has_no_system_role(tmp_path):
    model = _write(tmp_path / "gemma.gguf", GEMMA)
    p = _run("-m", model, "-i", "-sys", "Be terse.", "-n", "2", *COMMON, stdin=b"hi\n")
    assert p.returncode == 1
    err = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and "has no system role" in err[0] and "-sys" in err[0], p.stderr


def test_prompt_is_the_first_user_message(tmp_path):
    model = _write(tmp_path / "llama3.gguf", LLAMA3)
    p = _run("-m", model, "-i", "-p", "Hi\\tyou", "-n", "2", "--verbose-prompt", *COMMON, stdin=b"")
    assert p.returncode == 0, p.stderr
    blocks = _blocks(p.stderr)
    assert blocks[0][1] == _jinja(LLAMA3, [{"role": "user", "content": "Hi\tyou"}], True)


def test_unrecognised_template_falls_back_to_plain_turns_said_once(tmp_path):
    model = _write(tmp_path / "odd.gguf", "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n"
                                          "{% endfor %}### assistant:")
    p = _run("-m", model, "-i", "-n", "2", "--verbose-prompt", *COMMON, stdin=b"one\ntwo\n")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("not one of the formats bonsai_run knows") == 1
    assert "chat mode (plain turns)" in p.stderr
    assert _blocks(p.stderr)[0][1] == "User: one\nAssistant:"


def test_no_template_gives_plain_turns_with_a_note(plain_model):
    p = _run("-m", plain_model, "-i", "-n", "2", *COMMON, stdin=b"one\n")
    assert p.returncode == 0, p.stderr
    assert "has no chat template" in p.stderr and "chat mode (plain turns)" in p.stderr


def test_cnv_and_conversation_are_aliases_of_interactive(plain_model):
    for flag in ("-cnv", "--conversation"):
        p = _run("-m", plain_model, flag, "-n", "2", *COMMON, stdin=b"one\n")
        assert p.returncode == 0, p.stderr
        assert "chat mode (plain turns)" in p.stderr


# ----- escapes -----

def _generated(p, prompt: bytes) -> bytes:
    assert p.stdout.startswith(prompt), (p.stdout, prompt)
    return p.stdout[len(prompt):]


@pytest.mark.parametrize("raw,expected", [
    ("ab\\nabc", b"ab\nabc"), ("a\\tb\\rc", b"a\tb\rc"), ("q\\'\\\"\\\\", b"q'\"\\"), ("x\\x41\\x7a", b"xAz"),
    ("keep \\q and \\x4", b"keep \\q and \\x4"), ("end\\", b"end\\"),
])
def test_escapes_are_processed_by_default(plain_model, raw, expected):
    p = _run("-m", plain_model, "-p", raw, "-n", "1", *COMMON)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(expected), p.stdout
    same = _run("-m", plain_model, "-p", raw, "-e", "-n", "1", *COMMON)
    assert same.stdout == p.stdout


def test_no_escape_keeps_the_text(plain_model, tmp_path):
    p = _run("-m", plain_model, "-p", "ab\\nabc", "--no-escape", "-n", "1", *COMMON)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(b"ab\\nabc")
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"escape": false}')
    assert _run("-m", plain_model, "--config", cfg, "-p", "ab\\nabc", "-n", "1", *COMMON).stdout == p.stdout


def test_prompt_file_is_escaped_too(plain_model, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_bytes(b"ab\\tabc")
    p = _run("-m", plain_model, "-f", f, "-n", "1", *COMMON)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(b"ab\tabc")
    assert _run("-m", plain_model, "-f", f, "--no-escape", "-n", "1", *COMMON).stdout.startswith(b"ab\\tabc")


def test_typed_chat_lines_are_escaped_the_system_prompt_is_not(tmp_path):
    model = _write(tmp_path / "chatml.gguf", QWEN2)
    args = ("-m", model, "-i", "-sys", "S\\n", "-n", "1", "--verbose-prompt", *COMMON)
    p = _run(*args, stdin=b"a\\tb\\x41\n")
    assert p.returncode == 0, p.stderr
    assert _blocks(p.stderr)[0][1] == _jinja(QWEN2, [{"role": "system", "content": "S\\n"},
                                                     {"role": "user", "content": "a\tbA"}], True)
    raw = _run(*args, "--no-escape", stdin=b"a\\tb\\x41\n")
    assert "<|im_start|>user\na\\tb\\x41<|im_end|>" in _blocks(raw.stderr)[0][1]


# ----- --version -----

def test_version_prints_package_version_and_build():
    p = _run("--version")
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    version = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert out.splitlines()[0] == f"bonsai_run (bonsai-runner) {version}"
    assert re.search(r"^built with (gcc|clang) \S+", out, re.M), out
    assert re.search(r"^CPU features: \S", out, re.M), out
    assert re.search(r"^CUDA: (on|off)$", out, re.M), out


def test_version_takes_no_value():
    p = _run("--version=1")
    assert p.returncode == 2 and "--version takes no value" in p.stderr


# ----- --ignore-eos and -r -----

PROMPT = "ab abc"


def _pieces(text: bytes) -> list[str]:
    """The word pieces of a greedy output: ' ab', ' cd', ..."""
    words = text.decode().split(" ")
    assert words[0] == "", text
    return [" " + w for w in words[1:]]


def _stop_after(pieces: list[str], target: str) -> int:
    """How many pieces a run stopped by -r target prints: up to the first that completes it."""
    return next(i + 1 for i in range(len(pieces)) if target in "".join(pieces[:i + 1]))


@pytest.fixture(scope="module")
def greedy(plain_model):
    p = _run("-m", plain_model, "-p", PROMPT, "-n", "8", *COMMON)
    assert p.returncode == 0, p.stderr
    pieces = _pieces(_generated(p, PROMPT.encode()))
    assert len(pieces) == 8
    return pieces


def test_ignore_eos_neither_stops_nor_samples_end_tokens(tmp_path, greedy):
    # make the second greedy token the end of text: a normal run stops there
    toks, _, _ = engine_fixtures._vocab(Cfg().n_vocab)
    eos = toks.index("\u2581" + greedy[1][1:])
    assert greedy[0] != greedy[1], greedy
    model = _write(tmp_path / "eos.gguf", eos_id=eos)
    stopped = _run("-m", model, "-p", PROMPT, "-n", "8", *COMMON)
    assert stopped.returncode == 0, stopped.stderr
    assert _pieces(_generated(stopped, PROMPT.encode())) == greedy[:1]

    p = _run("-m", model, "-p", PROMPT, "-n", "8", "--ignore-eos", *COMMON)
    assert p.returncode == 0, p.stderr
    pieces = _pieces(_generated(p, PROMPT.encode()))
    assert len(pieces) == 8 and "generation 8 tokens" in p.stderr
    assert pieces[0] == greedy[0]
    assert greedy[1] not in pieces  # banned from sampling, not only ignored

    f = tmp_path / "prompts.txt"
    f.write_text(PROMPT + "\n" + PROMPT + "\n")
    for flag, expected in (((), greedy[:1]), (("--ignore-eos",), pieces)):
        par = _run("-m", model, "-f", f, "--parallel", "2", "-n", "8", *flag, *COMMON)
        assert par.returncode == 0, par.stderr
        lines = par.stdout.decode().splitlines()
        assert len(lines) == 2
        for line in lines:
            assert _pieces(re.match(r"^\[\d\] (.*)$", line).group(1)[len(PROMPT):].encode()) == expected


def test_reverse_prompt_stops_generation(plain_model, greedy):
    target = greedy[2]
    stop_at = _stop_after(greedy, target)
    p = _run("-m", plain_model, "-p", PROMPT, "-n", "8", "-r", "never-there", "-r", target, *COMMON)
    assert p.returncode == 0, p.stderr
    assert _pieces(_generated(p, PROMPT.encode())) == greedy[:stop_at]
    assert f"generation {stop_at} tokens" in p.stderr


def test_reverse_prompt_hands_the_turn_back_in_chat(tmp_path):
    model = _write(tmp_path / "chatml.gguf", QWEN2)
    free = _run("-m", model, "-i", "-n", "8", *COMMON, stdin=b"Hello\n")
    assert free.returncode == 0, free.stderr
    reply = _pieces(free.stdout)
    target = reply[1]
    stop_at = _stop_after(reply, target)
    one = _run("-m", model, "-i", "-n", "8", "-r", target, *COMMON, stdin=b"Hello\n")
    assert one.returncode == 0, one.stderr
    assert _pieces(one.stdout) == reply[:stop_at]

    p = _run("-m", model, "-i", "-n", "8", "-r", target, "--verbose-prompt", *COMMON, stdin=b"Hello\nAgain\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("".join(reply[:stop_at]).encode())
    assert p.stderr.count("\n> ") == 3  # both turns were asked for, then end of input
    blocks = _blocks(p.stderr)
    assert blocks[1][1] == "<|im_end|>\n"  # the stopped reply is closed by the template's end of turn
    assert blocks[2][1] == "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"


def test_chat_ends_cleanly_when_the_context_fills(tmp_path):
    model = _write(tmp_path / "chatml.gguf", QWEN2)
    p = _run("-m", model, "-i", "--ignore-eos", "-t", "1", "-c", "160", "--temp", "0", stdin=b"Hello\nAgain\n")
    assert p.returncode == 0, p.stderr
    assert "[context full after 160 tokens" in p.stderr
    assert "error" not in p.stderr


def test_verbose_prompt_with_parallel(plain_model, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("ab abc\n\nabc ab\n")
    p = _run("-m", plain_model, "-f", f, "--parallel", "2", "-n", "2", "--verbose-prompt", *COMMON)
    assert p.returncode == 0, p.stderr
    assert [text for _, text in _blocks(p.stderr)] == ["ab abc", "abc ab"]


def test_reverse_prompt_with_parallel(plain_model, tmp_path, greedy):
    f = tmp_path / "prompts.txt"
    f.write_text(PROMPT + "\n" + PROMPT + "\n")
    p = _run("-m", plain_model, "-f", f, "--parallel", "2", "-n", "8", "-r", greedy[2], *COMMON)
    assert p.returncode == 0, p.stderr
    for line in p.stdout.decode().splitlines():
        text = re.match(r"^\[\d\] (.*)$", line).group(1)
        assert _pieces(text[len(PROMPT):].encode()) == greedy[:_stop_after(greedy, greedy[2])]


# ----- bad values -----

@pytest.mark.parametrize("args,status,needle", [
    (("-r", ""), 2, "invalid value '' for -r (--reverse-prompt): expected a non-empty text"),
    (("-sys", "x"), 2, "-sys/--system-prompt is the system message of a chat; add -i"),
    (("--ignore-eos=yes",), 2, "--ignore-eos takes no value"),
    (("--no-escape=1",), 2, "--no-escape takes no value"),
    (("-r",), 2, "-r needs a value (TEXT)"),
])
def test_bad_values(plain_model, args, status, needle):
    p = _run("-m", plain_model, "-p", "ab", *args)
    assert p.returncode == status, p.stderr
    err = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and needle in err[0], p.stderr
    assert p.stdout == b""


def test_help_lists_every_new_flag():
    out = _run("--help").stdout.decode()
    for flag in ("-cnv, --conversation, --interactive", "-sys, --system-prompt TEXT", "-r, --reverse-prompt TEXT",
                 "-e, --escape", "--no-escape", "--ignore-eos", "--verbose-prompt", "--version"):
        assert flag in out, flag
