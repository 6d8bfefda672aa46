"""bonsai_run --grammar / --grammar-file / -j --json-schema / -jf --json-schema-file (issue #18).

The tiny random llama of tests/engine_fixtures.py has byte tokens for every byte and random
weights, so unconstrained it writes byte soup: every valid output below comes from the mask (and
`test_without_the_schema_the_same_run_is_not_json` shows the same seeds give no JSON without it).
Sampling is at temperature 1 over several seeds, so the constraint is tested on many paths.

The GBNF -> Lark translator (cpp/src/gbnf.cpp, run here as `test_gbnf --to-lark FILE`) is compared
with llguidance's own Python converter: on grammars written for this test (arithmetic, a JSON
subset, lists, Unicode classes and repetition counts), every test string must be accepted by both
translations or by neither, and as the test expects.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest

from conftest import bonsai_run_path, run_cli
from engine_fixtures import Cfg, write_model
from model_factory import make_hf_model
from real_model import real_model_path  # noqa: F401 (fixture)

SCHEMA = {"type": "object",
          "properties": {"name": {"enum": ["ann", "bob", "cy"]},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": [1, 2, 3]}, "maxItems": 3}},
          "required": ["name", "age", "ok", "tags"], "additionalProperties": False}
SCHEMA_WITH_STRING = {"type": "object",
                      "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
                                     "note": {"type": "string", "maxLength": 6}},
                      "required": ["id", "note"]}
SEEDS = [1, 2, 3, 4, 5, 6]
COMMON = ("-t", "1", "-c", "512", "--temp", "1")
YES_NO_GBNF = 'root ::= ("yes" | "no") " " [0-9]{2,3}'
YES_NO_RE = re.compile(r"(yes|no) [0-9]{2,3}")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """SentencePiece vocabulary: llguidance tokenizes forced text greedily (see grammar.cpp)."""
    path = tmp_path_factory.mktemp("grammar") / "tiny.gguf"
    write_model(path, Cfg(), seed=3)
    return str(path)


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    """A tiny qwen2 with a byte-level BPE vocabulary (tests/model_factory.py), converted by
    `bonsai convert`: llguidance tokenizes through our tokenizer (the callback) here."""
    d = tmp_path_factory.mktemp("grammar_bpe")
    make_hf_model(d / "model", arch="qwen2", tokenizer="bpe")
    run_cli("convert", d / "model", "--outfile", d / "bpe.gguf", "--no-progress", check=True)
    return str(d / "bpe.gguf")


def _run(*args, env=None, stdin: bytes = b""):
    p = subprocess.run([bonsai_run_path(), *map(str, args)], input=stdin, capture_output=True, timeout=120,
                       env=None if env is None else {**os.environ, **env})
    p.stderr = p.stderr.decode("utf-8", "replace")
    return p


def _generated(model, *args, prompt="x", seed=1) -> str:
    p = _run("-m", model, "-p", prompt, "-s", seed, *COMMON, *args)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(prompt.encode())
    return p.stdout[len(prompt):].decode("utf-8")


def _one_error_line(p, status: int, *needles: str) -> str:
    assert p.returncode == status, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, p.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


# ----- JSON schema -----

@pytest.mark.parametrize("seed", SEEDS)
def test_json_schema_output_validates_and_is_compact(model, seed):
    out = _generated(model, "-n", "200", "-j", json.dumps(SCHEMA), seed=seed)
    obj = json.loads(out)
    jsonschema.validate(obj, SCHEMA)
    assert out == json.dumps(obj, separators=(",", ":"))  # no whitespace, as the server writes it


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_json_schema_with_a_string_field(model, seed):
    obj = json.loads(_generated(model, "-n", "200", "--json-schema", json.dumps(SCHEMA_WITH_STRING), seed=seed))
    jsonschema.validate(obj, SCHEMA_WITH_STRING)


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_json_schema_and_gbnf_on_a_bpe_vocabulary(bpe_model, seed):
    obj = json.loads(_generated(bpe_model, "-n", "200", "-j", json.dumps(SCHEMA), seed=seed))
    jsonschema.validate(obj, SCHEMA)
    assert YES_NO_RE.fullmatch(_generated(bpe_model, "-n", "30", "--grammar", YES_NO_GBNF, seed=seed))


def test_without_the_schema_the_same_run_is_not_json(model):
    for seed in SEEDS:
        out = _run("-m", model, "-p", "x", "-s", seed, "-n", "40", *COMMON).stdout[1:]
        with pytest.raises(ValueError):
            json.loads(out.decode("utf-8", "replace"))


def test_json_schema_file(model, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA, indent=2))
    jsonschema.validate(json.loads(_generated(model, "-n", "200", "-jf", path, seed=7)), SCHEMA)


def test_parallel_sequences_each_follow_the_schema(model, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab\nabc ab\nb\n")
    p = _run("-m", model, "-f", prompts, "--parallel", "2", "-s", "5", "-n", "200", *COMMON, "-j", json.dumps(SCHEMA))
    assert p.returncode == 0, p.stderr
    outputs = dict(re.findall(rb"^\[(\d)\] (.*)$", p.stdout, re.M))
    assert sorted(outputs) == [b"0", b"1", b"2"]
    for i, line in zip(sorted(outputs), ["ab", "abc ab", "b"]):
        text = outputs[i].decode()
        assert text.startswith(line)
        jsonschema.validate(json.loads(text[len(line):]), SCHEMA)


# ----- GBNF and Lark grammars -----

@pytest.mark.parametrize("seed", SEEDS)
def test_gbnf_grammar(model, seed):
    assert YES_NO_RE.fullmatch(_generated(model, "-n", "30", "--grammar", YES_NO_GBNF, seed=seed))


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_lark_grammar_file(model, tmp_path, seed):
    path = tmp_path / "ids.lark"
    path.write_text('start: "id-" NUM ("," NUM){0,3} ";"\nNUM: /[1-9][0-9]{0,2}/\n')
    out = _generated(model, "-n", "60", "--grammar-file", path, seed=seed)
    assert re.fullmatch(r"id-[1-9][0-9]{0,2}(,[1-9][0-9]{0,2}){0,3};", out), out


def test_gbnf_grammar_file_with_comments_and_rules(model, tmp_path):
    path = tmp_path / "sum.gbnf"
    path.write_text("# a sum of small numbers\nroot ::= num (\" + \" num){1,2} \" = ?\"\n"
                    "num ::= [1-9] [0-9]?  # one or two digits\n")
    for seed in SEEDS[:3]:
        out = _generated(model, "-n", "40", "--grammar-file", path, seed=seed)
        assert re.fullmatch(r"[1-9][0-9]?( \+ [1-9][0-9]?){1,2} = \?", out), out


def test_interactive_grammar_applies_to_each_reply(model):
    p = _run("-m", model, "-i", "-n", "30", "-s", "2", *COMMON, "--grammar", 'root ::= ("yes" | "no") "!"',
             stdin=b"hello\nagain\nthird\n")
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(rb"((yes|no)!){3}", p.stdout), p.stdout


def test_ignore_eos_ends_where_the_grammar_is_complete(model, tmp_path):
    for seed in SEEDS[:3]:
        out = _generated(model, "-n", "30", "--ignore-eos", "--grammar", 'root ::= "yes" | "no"', seed=seed)
        assert out in ("yes", "no")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab\nb\nabc\n")
    p = _run("-m", model, "-f", prompts, "--parallel", "2", "-n", "30", *COMMON, "--ignore-eos",
             "--grammar", 'root ::= "yes" | "no"')
    assert p.returncode == 0, p.stderr
    assert sorted(re.findall(rb"^\[(\d)\] (?:ab|b|abc)(?:yes|no)$", p.stdout, re.M)) == [b"0", b"1", b"2"], p.stdout
    assert p.stderr.count("| grammar complete") == 3, p.stderr


# ----- bad input -----

@pytest.mark.parametrize("args,needle", [
    (("--grammar", "root ::= \"a\"", "-j", "{}"), "--grammar and -j/--json-schema cannot be used together"),
    (("-jf", "a.json", "--grammar-file", "b.gbnf"),
     "--grammar-file and -jf/--json-schema-file cannot be used together"),
    (("-j", ""), "invalid value '' for -j (--json-schema)"),
])
def test_conflicting_or_empty_flags_are_usage_errors(model, args, needle):
    p = _run("-m", model, "-p", "x", *args)
    _one_error_line(p, 2, needle)
    assert p.stdout == b""


@pytest.mark.parametrize("args,needles", [
    (("-j", '{"type": "objekt"}'), ("-j/--json-schema: the JSON schema does not compile", "objekt")),
    (("-j", '{"type": "object",'), ("-j/--json-schema: the JSON schema does not compile", "column")),
    (("-j", "[1, 2]"), ("-j/--json-schema: a JSON schema must be an object",)),
    (("--grammar", "root ::= item"), ("--grammar: the GBNF grammar does not parse: line 1, column 10: "
                                      "undefined rule 'item'",)),
    (("--grammar", 'root ::= "a" | ['), ("--grammar: the GBNF grammar does not parse", "character class")),
    (("--grammar", "start: missing"), ("--grammar: the grammar does not compile", "missing")),
    (("--grammar-file", "/nonexistent/g.gbnf"), ("--grammar-file", "/nonexistent/g.gbnf")),
    (("-jf", "/nonexistent/s.json"), ("--json-schema-file", "/nonexistent/s.json")),
])
def test_bad_grammar_or_schema_is_one_error_line(model, args, needles):
    p = _run("-m", model, "-p", "x", "-n", "5", *args)
    _one_error_line(p, 1, *needles)
    assert p.stdout == b""  # refused before anything is generated


def test_missing_library_is_one_clear_error(model):
    p = _run("-m", model, "-p", "x", "-n", "5", "-j", "{}", env={"BONSAI_LLGUIDANCE_LIB": "/nonexistent"})
    _one_error_line(p, 1, "-j/--json-schema needs the llguidance package (pip install llguidance) or "
                          "BONSAI_LLGUIDANCE_LIB=path/to/_lib.abi3.so", "/nonexistent")
    p = _run("-m", model, "-p", "x", "-n", "5", "--grammar", YES_NO_GBNF,
             env={"BONSAI_LLGUIDANCE_LIB": "/etc/hostname"})
    _one_error_line(p, 1, "--grammar needs the llguidance package", "/etc/hostname")


def test_help_lists_the_grammar_flags():
    out = _run("--help").stdout.decode()
    for text in ("--grammar GRAMMAR", "--grammar-file FILE", "-j, --json-schema SCHEMA",
                 "-jf, --json-schema-file FILE", "GBNF as llama.cpp", "Lark as llguidance"):
        assert text in out, text


# ----- the GBNF translator against llguidance's own -----

GRAMMARS = {
    "arithmetic": (
        "# sums and products of integers\n"
        "root   ::= expr\n"
        "expr   ::= term ((\"+\" | \"-\") term)*\n"
        "term   ::= factor ((\"*\" | \"/\") factor)*\n"
        "factor ::= number | \"(\" expr \")\"\n"
        "number ::= [0-9]+\n",
        ["1+2*3", "(1+2)*30", "7", "((4))/2-1"],
        ["1+", "(1", "a", "1++2", "", "()"]),
    "json-subset": (
        "root   ::= object\n"
        "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
        "object ::=\n"
        "  \"{\" ws ( string \":\" ws value\n"
        "    (\",\" ws string \":\" ws value)* )? \"}\"\n"
        "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\"\n"
        "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\"\n"
        "number ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15}) (\".\" [0-9]+)?\n"
        "ws     ::= [ \\t\\n]{0,4}\n",
        ['{}', '{"a": 1}', '{"k":[1,-2.5,{"x":"y\\n"}],\n "t":true}', '{"u":"\\u00e9"}', '{"e":"é"}'],
        ['{"a":}', '[1]', '{"a":01}', '{"a":"\x01"}', '{"a":1,}', '{"a"  :1}']),
    "lines": (
        "root ::= item+\n"
        "item ::= \"- \" [^\\n]+ \"\\n\"   # a bullet line\n",
        ["- a\n", "- a\n- bc d\n"],
        ["- \n", "-a\n", "- a", ""]),
    "names": (
        "root ::= greeting-word \" \" Name{1,2} \"!\"?\n"
        "greeting-word ::= \"hi\" | \"\\xe9t\\xe9\" | \"こんにちは\" |\n"
        "                  \"tab\\there\"\n"
        "Name ::= [A-Z] [a-zぁ-ゟ]{1,5}\n",
        ["hi Ann", "été Bobby!", "こんにちは Aぁぁ", "hi AnnBob!", "tab\there Zz"],
        ["hi ann", "hi A", "hi Annabelle", "hey Ann", "hi Ann!!", "hi AnnBobCy"]),
    "dot": (
        "root ::= \"<\" . . \">\" | \"[\" ([a-c] | \"-\"){2} \"]\"\n",
        ["<ab>", "<é!>", "[a-]", "[cc]"],
        ["<a>", "<abc>", "[d-]", "[---]"]),
}


class _ByteTokenizer:
    """One token per byte plus an end-of-sequence token, the shape llguidance.TokenizerWrapper reads."""

    eos_token_id = 256
    bos_token_id = None
    special_token_ids: list[int] = []

    def __init__(self):
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]

    def __call__(self, text):
        return list(text if isinstance(text, bytes) else text.encode("utf-8"))


def _accepts(llg, tokenizer, lark: str, text: str) -> bool:
    m = llg.LLMatcher(tokenizer, llg.LLMatcher.grammar_from_lark(lark), log_level=0)
    assert not m.is_error(), m.get_error()
    return all(m.consume_token(b) for b in text.encode("utf-8")) and m.is_accepting()


@pytest.fixture(scope="module")
def to_lark():
    """Runs `test_gbnf --to-lark` on a GBNF text; returns the finished process."""
    exe = Path(bonsai_run_path()).parent / "test_gbnf"
    if not exe.exists():
        pytest.skip("test_gbnf is built by scripts/dev_build.sh (the C++ tests)")

    def convert(gbnf: str, tmp: Path) -> subprocess.CompletedProcess:
        path = tmp / "g.gbnf"
        path.write_text(gbnf, encoding="utf-8")
        return subprocess.run([str(exe), "--to-lark", str(path)], capture_output=True, text=True, timeout=30)
    return convert


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_gbnf_translation_accepts_what_llguidance_own_translation_accepts(name, to_lark, tmp_path):
    llg = pytest.importorskip("llguidance")
    from llguidance.gbnf_to_lark import gbnf_to_lark

    gbnf, good, bad = GRAMMARS[name]
    tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokenizer()), n_vocab=257)
    p = to_lark(gbnf, tmp_path)
    assert p.returncode == 0, p.stderr
    ours, theirs = p.stdout, gbnf_to_lark(gbnf)
    for text, expected in [(t, True) for t in good] + [(t, False) for t in bad]:
        got = (_accepts(llg, tokenizer, ours, text), _accepts(llg, tokenizer, theirs, text))
        assert got == (expected, expected), (text, got, ours)


def test_gbnf_translation_error_names_the_line_and_rule(to_lark, tmp_path):
    p = to_lark("root ::= \"a\" undefined-rule\n", tmp_path)
    assert p.returncode == 1 and "line 1, column 14: undefined rule 'undefined-rule'" in p.stderr


# ----- the real model (byte-level BPE, 151,936 tokens) -----

@pytest.mark.real_model
def test_real_model_json_schema(real_model_path):  # noqa: F811
    from test_engine_real_model import converted

    prompt = "A person as JSON:"
    schema = {**SCHEMA_WITH_STRING, "additionalProperties": False}
    p = _run("-m", converted(real_model_path, "q8_0"), "-p", prompt, "-n", "128", "-s", "3", "--temp", "0.7",
             "-c", "512", "-j", json.dumps(schema))
    assert p.returncode == 0, p.stderr
    jsonschema.validate(json.loads(p.stdout.decode()[len(prompt):]), schema)

