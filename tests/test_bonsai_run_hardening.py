"""bonsai_run on bad or unusual input (issue #13): every case ends in one clear error line and the
documented exit status (2: the command line is wrong, 1: the model or an input file is wrong),
never an "internal error" or a crash; and a run's printed seed replays it.

The model is the tiny random qwen2 of tests/engine_fixtures.py.
"""

from __future__ import annotations

import re
import struct
import subprocess

import pytest

from conftest import bonsai_run_path
from engine_fixtures import Cfg, write_model

SEED_MAX = 2**64 - 2  # 2**64 - 1 is the "random seed" value of the engine


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("hardening") / "qwen2_q8.gguf"
    write_model(path, Cfg(arch="qwen2", wtype="Q8_0", n_embd=128, head_dim=32), seed=5)  # q8_0 KV needs head 32
    return path


def _run(*args, timeout=120):
    p = subprocess.run([bonsai_run_path(), *map(str, args)], capture_output=True, timeout=timeout)
    p.stderr = p.stderr.decode("utf-8", "replace")
    return p


def _error_lines(p) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if "error" in ln]


def _expect_error(p, status: int, needle: str) -> str:
    """One error line mentioning `needle`, exit status `status`, nothing on stdout."""
    assert p.returncode == status, (p.returncode, p.stderr)
    err = _error_lines(p)
    assert len(err) == 1, p.stderr
    assert "internal error" not in err[0], err[0]
    assert needle in err[0], err[0]
    assert p.stdout == b""
    return err[0]


def _printed_seed(stderr: str) -> int:
    m = re.search(r"^sampling: .*seed (\d+)", stderr, re.M)
    assert m, stderr
    return int(m.group(1))


# ----- the printed seed replays the run -----

def test_printed_random_seed_replays(model):
    common = ("-m", model, "-p", "ab abc", "-n", "24", "--temp", "1.5", "--top-k", "0", "--top-p", "1",
              "--min-p", "0", "-t", "1", "-c", "64")
    first = _run(*common)
    assert first.returncode == 0, first.stderr
    seed = _printed_seed(first.stderr)
    replay = _run(*common, "--seed", seed)
    assert replay.returncode == 0, replay.stderr
    assert _printed_seed(replay.stderr) == seed
    assert replay.stdout == first.stdout
    # a seed drawn at random is 64-bit: a different one (almost surely) gives a different text
    other = _run(*common, "--seed", (seed + 1) % (SEED_MAX + 1))
    assert other.returncode == 0, other.stderr


@pytest.mark.parametrize("seed", [0, 2**32, SEED_MAX])
def test_every_64_bit_seed_is_accepted_and_printed(model, seed):
    p = _run("-m", model, "-p", "ab", "-n", "4", "--temp", "1", "-t", "1", "-c", "32", "-s", seed)
    assert p.returncode == 0, p.stderr
    assert _printed_seed(p.stderr) == seed


def test_parallel_seed_offsets_wrap_below_the_random_value(model, tmp_path):
    """--parallel: prompt i samples with seed + i modulo 2**64 - 1, so the last seed wraps to 0."""
    f = tmp_path / "prompts.txt"
    f.write_bytes(b"ab abc\nabc ab\n")
    common = ("-m", model, "-n", "8", "--temp", "1.5", "--top-k", "0", "--min-p", "0", "-t", "1", "-c", "64")
    p = _run(*common, "--parallel", "2", "-f", f, "-s", SEED_MAX)
    assert p.returncode == 0, p.stderr
    lines = dict(re.match(rb"^\[(\d)\] (.*)$", ln).groups() for ln in p.stdout.split(b"\n") if ln)
    assert lines[b"0"] == _run(*common, "-p", "ab abc", "-s", SEED_MAX).stdout
    assert lines[b"1"] == _run(*common, "-p", "abc ab", "-s", 0).stdout


# ----- the parser refuses what the engine would refuse, with the usage-error status -----

@pytest.mark.parametrize("flag,value", [
    ("--top-p", "0"), ("--top-p", "-0.1"), ("--top-p", "1.01"), ("--top-p", "nan"),
    ("--min-p", "-0.5"), ("--min-p", "1.5"), ("--temp", "-1"), ("--temp", "inf"),
    ("--repeat-penalty", "0"), ("--repeat-penalty", "-1"), ("-n", "0"), ("-n", "-2"),
    ("--top-k", "-1"), ("--repeat-last-n", "-2"), ("-c", "-1"), ("-b", "0"), ("-t", "-1"),
    ("-ngl", "-2"), ("--parallel", "0"), ("--parallel", "65"), ("-s", "-2"),
    ("-s", str(2**64 - 1)), ("-s", str(2**64)), ("-s", "+5"), ("-s", " 5"), ("-c", " 5"),
    ("--temp", " 1"), ("-ctk", "q4_0"),
])
def test_out_of_range_values_are_usage_errors(model, flag, value):
    p = _run("-m", model, "-p", "ab", flag, value)
    line = _expect_error(p, 2, f"invalid value '{value}' for {flag}")
    assert "expected" in line
    assert "usage: bonsai_run" in p.stderr


@pytest.mark.parametrize("args", [
    ("--top-p", "1e-9"), ("--top-p", "1"), ("--min-p", "0"), ("--min-p", "1"), ("--temp", "0"),
    ("--temp", "100"), ("--repeat-penalty", "1e-6"), ("--repeat-penalty", "100"), ("--top-k", "0"),
    ("--repeat-last-n", "-1"), ("--repeat-last-n", "0"), ("-n", "-1"), ("-b", "1"), ("-t", "0"),
    ("-ngl", "-1"), ("-ctk", "q8_0", "-ctv", "q8_0"),
])
def test_edge_values_the_parser_accepts_run(model, args):
    """Each range's bounds, as the parser accepts them, are accepted by the engine too."""
    defaults = [x for flag, value in (("-n", "3"), ("-t", "1")) if flag not in args for x in (flag, value)]
    p = _run("-m", model, "-p", "ab", "-c", "32", *defaults, *args)
    assert p.returncode == 0, p.stderr
    assert not _error_lines(p), p.stderr


# ----- paths that are directories or otherwise not files -----

def test_prompt_file_that_is_a_directory(model, tmp_path):
    line = _expect_error(_run("-m", model, "-f", tmp_path), 1, "is a directory")
    assert "the prompt file" in line and "-f" in line


def test_parallel_prompt_file_that_is_a_directory(model, tmp_path):
    _expect_error(_run("-m", model, "--parallel", "2", "-f", tmp_path), 1, "is a directory")


def test_prompt_file_that_does_not_exist(model):
    line = _expect_error(_run("-m", model, "-f", "/dev/null/x"), 1, "cannot open the prompt file")
    assert "check the path given to -f" in line


def test_prompt_from_a_pipe_is_read(model):
    """Only directories are refused: -f /dev/stdin (a pipe) still reads the prompt."""
    p = subprocess.run([bonsai_run_path(), "-m", str(model), "-f", "/dev/stdin", "-n", "2", "--temp", "0",
                        "-t", "1", "-c", "32"], input=b"ab abc", capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(b"ab abc")


def test_model_that_is_a_directory(tmp_path):
    line = _expect_error(_run("-m", tmp_path, "-p", "hi"), 1, "is a directory")
    assert "not found" not in line and ".gguf" in line


def test_config_that_is_a_directory(model, tmp_path):
    _expect_error(_run("-m", model, "-p", "hi", "--config", tmp_path), 2, "is a directory")


def test_tokenizer_that_is_a_directory(model, tmp_path):
    _expect_error(_run("-m", model, "-p", "hi", "--tokenizer", tmp_path), 1, "is a directory")


# ----- type names in messages -----

def _set_tensor_type(path, name: str, type_id: int) -> None:
    """Overwrites the ggml type id in the tensor info of `name` (GGUF v3: u64 name length, name,
    u32 n_dims, n_dims x u64 dims, u32 type)."""
    data = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(data))


def test_unknown_type_id_is_named_once(model, tmp_path):
    bad = tmp_path / "type99.gguf"
    bad.write_bytes(model.read_bytes())
    _set_tensor_type(bad, "blk.0.attn_q.weight", 99)
    line = _expect_error(_run("-m", bad, "-p", "hi", "-n", "2"), 1, "blk.0.attn_q.weight")
    assert "unknown ggml type id 99" in line
    assert not re.search(r"\btype type\b", line), line


# ----- inputs found by fuzz/cpp/fuzz_gguf, each fixed in the engine -----

def _set_u32_key(path, key: str, value: int) -> None:
    """Overwrites a UINT32 metadata value (GGUF v3: u64 key length, key, u32 type = 4, u32 value)."""
    data = bytearray(path.read_bytes())
    at = data.index(struct.pack("<Q", len(key)) + key.encode()) + 8 + len(key)
    assert struct.unpack_from("<I", data, at) == (4,), "not a UINT32 key"
    struct.pack_into("<I", data, at + 4, value)
    path.write_bytes(bytes(data))


def test_huge_block_count_is_refused_before_allocating(model, tmp_path):
    """fuzz_gguf: block_count 4294967295 sized the layer table before any tensor was checked
    (std::bad_alloc, "internal error")."""
    bad = tmp_path / "blocks.gguf"
    bad.write_bytes(model.read_bytes())
    _set_u32_key(bad, "qwen2.block_count", 0xFFFFFFFF)
    line = _expect_error(_run("-m", bad, "-p", "hi", "-n", "2"), 1, "block_count is 4294967295")
    assert "the file is corrupt" in line
