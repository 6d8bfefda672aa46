"""bonsai_run --parallel N -f FILE: prompts generated concurrently by continuous batching in C++.

On a tiny random model (tests/engine_fixtures.py), every prompt's greedy output under --parallel
(with and without --cache-prompt, with a batch size small enough that prompt chunks of newcomers
share steps with generating sequences) must equal the stdout of a single run of the same prompt;
seeded sampling of prompt i must equal a single run with seed + i; bad input gives one error line
and a non-zero exit.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import bonsai_run_path
from engine_fixtures import Cfg, write_model

PROMPTS = ["ab abc", "abc ab ab", "b", "ab abc ab abc ab", "ab abc ab"]
LINE = re.compile(rb"^\[(\d+)\] (.*)$", re.S)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("parallel") / "qwen2_q8.gguf"
    write_model(path, Cfg(arch="qwen2", wtype="Q8_0"), seed=11)
    return str(path)


def _run(*args):
    p = subprocess.run([bonsai_run_path(), *map(str, args)], capture_output=True, timeout=120)
    p.stderr = p.stderr.decode("utf-8", "replace")
    return p


def _outputs(stdout: bytes) -> dict[int, bytes]:
    """Texts by prompt index from the "[i] " prefixed lines; checks that they do not interleave."""
    lines = stdout.split(b"\n")
    assert lines[-1] == b""
    texts: dict[int, list[bytes]] = {}
    order = []
    for ln in lines[:-1]:
        m = LINE.match(ln)
        assert m, ln
        i = int(m.group(1))
        if not order or order[-1] != i:
            assert i not in texts, f"output of sequence {i} is interleaved with another"
            order.append(i)
        texts.setdefault(i, []).append(m.group(2))
    return {i: b"\n".join(parts) for i, parts in texts.items()}


def _prompt_file(tmp_path, prompts):
    f = tmp_path / "prompts.txt"
    f.write_bytes(("\n".join(prompts) + "\n").encode())
    return f


@pytest.mark.parametrize("extra", [(), ("--cache-prompt",), ("--cache-prompt", "-b", "3")])
def test_parallel_greedy_equals_single_runs(model, tmp_path, extra):
    common = ("-m", model, "-n", "10", "--temp", "0", "-t", "2", "-c", "64")
    f = tmp_path / "prompts.txt"
    f.write_bytes(("\n".join(PROMPTS[:2]) + "\n\n   \n" + "\r\n".join(PROMPTS[2:]) + "\n").encode())
    p = _run(*common, "--parallel", "3", "-f", f, *extra)
    assert p.returncode == 0, p.stderr
    got = _outputs(p.stdout)
    assert sorted(got) == list(range(len(PROMPTS)))
    for i, prompt in enumerate(PROMPTS):
        single = _run(*common, "-p", prompt)
        assert single.returncode == 0, single.stderr
        assert got[i] == single.stdout, f"prompt {i}"
    assert re.search(r"aggregate: .*prompt \d+ tokens evaluated.*\(\d+\.\d+ tokens/s\) \| generation \d+ tokens "
                     r"\(\d+\.\d+ tokens/s\)", p.stderr), p.stderr
    assert len(re.findall(r"^\[\d\] prompt \d+ tokens .*tokens/s", p.stderr, re.M)) == len(PROMPTS)
    if extra:
        assert re.search(r"\((?!0 )\d+ reused\)", p.stderr.split("aggregate:")[1]), p.stderr


def test_parallel_seeded_sampling_uses_seed_plus_index(model, tmp_path):
    common = ("-m", model, "-n", "8", "--temp", "1.0", "-t", "2", "-c", "64")
    p = _run(*common, "--seed", "40", "--parallel", "2", "-f", _prompt_file(tmp_path, PROMPTS[:3]))
    assert p.returncode == 0, p.stderr
    got = _outputs(p.stdout)
    for i, prompt in enumerate(PROMPTS[:3]):
        assert got[i] == _run(*common, "--seed", str(40 + i), "-p", prompt).stdout


@pytest.mark.parametrize("case,msg", [
    ("missing", "cannot open the prompt file"), ("empty", "has no prompts"), ("blank", "has no prompts"),
    ("zero", "--parallel"), ("too_many", "--parallel"), ("with_p", "-f file"), ("too_long", "line 2")])
def test_parallel_bad_input(model, tmp_path, case, msg):
    args = ["--parallel", "2", "-f", str(tmp_path / "nope.txt")]
    if case == "empty":
        args[-1] = str(_prompt_file(tmp_path, []))
        (tmp_path / "prompts.txt").write_bytes(b"")
    elif case == "blank":
        args[-1] = str(_prompt_file(tmp_path, ["", "  ", "\t"]))
    elif case == "zero":
        args = ["--parallel", "0", "-f", str(_prompt_file(tmp_path, PROMPTS))]
    elif case == "too_many":
        args = ["--parallel", "65", "-f", str(_prompt_file(tmp_path, PROMPTS))]
    elif case == "with_p":
        args = ["--parallel", "2", "-p", "ab"]
    elif case == "too_long":
        args[-1] = str(_prompt_file(tmp_path, ["ab", "ab " * 40]))
    p = _run("-m", model, "-t", "1", "-c", "16", "-n", "4", *args)
    assert p.returncode not in (0, -11, -6), p.stderr
    err = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and msg.lower() in err[0].lower(), p.stderr
    assert p.stdout == b""
