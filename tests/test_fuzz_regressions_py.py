"""Regression tests of the crashes found by the Python-reader fuzzers (fuzz/python/) and of the
`bonsai inspect` report on GGUF files that are not valid UTF-8 (issue #13): every malformed file is
one BonsaiError naming the problem, every readable one prints and serializes. Each input is built
here byte by byte (GGUF v3: magic, version, tensor count, key count, keys, tensor directory)."""

from __future__ import annotations

import json
import random
import struct

import pytest

from bonsai_runner.errors import BonsaiError
from conftest import run_cli

STRING, UINT32, F32 = 8, 4, 0


def _str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(kvs: list[tuple[bytes, int, bytes]], tensors: list[tuple[bytes, tuple, int]] = ()) -> bytes:
    """kvs: (key bytes, value type, encoded value); tensors: (name bytes, ne, ggml type), F32 data."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vtype, value in kvs:
        out += _str(key) + struct.pack("<I", vtype) + value
    offset = 0
    sizes = []
    for name, ne, ttype in tensors:
        out += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ttype, offset)
        n = 4
        for d in ne:
            n *= d
        sizes.append(n)
        offset += -(-n // 32) * 32
    out += b"\0" * (-len(out) % 32)
    for n in sizes:
        out += b"\0" * (-(-n // 32) * 32)
    return out


ARCH = (b"general.architecture", STRING, _str(b"llama"))


def _open(path):
    from bonsai_runner.gguf_reader import open_gguf

    with open_gguf(path) as g:
        return dict(g.metadata), [t.name for t in g.tensors]


def test_builder_writes_a_file_the_reader_accepts(tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(gguf_bytes([ARCH, (b"llama.block_count", UINT32, struct.pack("<I", 2))],
                             [(b"output_norm.weight", (8,), F32)]))
    md, names = _open(p)
    assert md["llama.block_count"] == 2 and names == ["output_norm.weight"]


def test_engine_message_quoting_a_non_utf8_key_is_a_bonsai_error(tmp_path):
    """fuzz_gguf crash-7e5a763c: unknown value type under a key with a stray byte; the engine's
    error message could not be turned into a Python string (UnicodeDecodeError)."""
    p = tmp_path / "crash.gguf"
    p.write_bytes(gguf_bytes([ARCH, (b"tokenizer.ggml.toke\xebn", 2419, b"")]))
    with pytest.raises(BonsaiError, match=r"toke\\xebn' has unknown value type 2419"):
        _open(p)


def test_non_utf8_key_name_is_a_bonsai_error(tmp_path):
    p = tmp_path / "key.gguf"
    p.write_bytes(gguf_bytes([ARCH, (b"general.architectur\xb1", STRING, _str(b"x"))]))
    with pytest.raises(BonsaiError, match=r"metadata key #1 \('general.architectur\\\\xb1'\) is not valid UTF-8"):
        _open(p)


def test_non_utf8_tensor_name_is_a_bonsai_error(tmp_path):
    p = tmp_path / "tensor.gguf"
    p.write_bytes(gguf_bytes([ARCH], [(b"blk.0.att\xe6_q.weight", (8,), F32)]))
    with pytest.raises(BonsaiError, match=r"the name of tensor #0 \('blk.0.att\\\\xe6_q.weight'\) is not valid UTF-8"):
        _open(p)
    p2 = tmp_path / "t.gguf"
    p2.write_bytes(gguf_bytes([ARCH], [(b"blk.0.att\xe6_q.weight", (8,), F32)]))
    r = run_cli("inspect", p2)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "not valid UTF-8" in r.stderr


def test_inspect_shows_non_utf8_string_values_escaped(tmp_path):
    from bonsai_runner.inspect import format_report, inspect_file

    p = tmp_path / "value.gguf"
    p.write_bytes(gguf_bytes([ARCH, (b"general.name", STRING, _str(b"tiny \xff model")),
                              (b"tokenizer.ggml.tokens", 9, struct.pack("<IQ", STRING, 2)
                               + _str(b"ok") + _str(b"\xc3("))],
                             [(b"output_norm.weight", (8,), F32)]))
    report = inspect_file(p)
    assert report["metadata"]["general.name"]["value"] == "tiny \\xff model"
    assert report["metadata"]["tokenizer.ggml.tokens"]["first"] == ["ok", "\\xc3("]
    assert report["invalid_utf8"] == ["general.name", "tokenizer.ggml.tokens"]
    text = format_report(report)
    text.encode("utf-8")
    json.dumps(report, ensure_ascii=False).encode("utf-8")
    assert "warning: 2 metadata keys hold strings that are not valid UTF-8" in text
    for args in ((p,), (p, "--json")):
        r = run_cli("inspect", *args)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "tiny \\xff model" in r.stdout or "tiny \\\\xff model" in r.stdout


def test_inspect_fallback_table_with_non_utf8_bytes_prints(tmp_path):
    from bonsai_runner.inspect import format_report, inspect_file

    table = b'[{"tensor": "blk.0.ffn_down.weight\xfe", "type": "Q8_0", "reason": "x"}]'
    p = tmp_path / "ft.gguf"
    p.write_bytes(gguf_bytes([ARCH, (b"bonsai.fallback_table", STRING, _str(table))]))
    text = format_report(inspect_file(p))
    text.encode("utf-8")
    assert "blk.0.ffn_down.weight\\xfe" in text


def test_300_mutated_copies_of_a_tiny_model_each_report_or_fail_cleanly(tmp_path):
    """The issue's reproduction: byte mutations in the header region of a tiny model."""
    from tiny_gguf import make_hf_weights, write_gguf

    from bonsai_runner.inspect import format_report, inspect_file

    cfg, w = make_hf_weights("llama")
    base = tmp_path / "base.gguf"
    write_gguf(base, cfg, w, vocab=True)
    data = base.read_bytes()
    rng = random.Random(1)
    errors = reported = 0
    for i in range(300):
        d = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            d[rng.randrange(20000)] = rng.randrange(256)
        p = tmp_path / "m.gguf"
        p.write_bytes(bytes(d))
        try:
            r = inspect_file(p)
        except BonsaiError:
            errors += 1
            continue
        format_report(r).encode("utf-8")
        json.dumps(r, ensure_ascii=False).encode("utf-8")
        reported += 1
    assert errors and reported and errors + reported == 300


# ----- Hugging Face config.json / safetensors (convert/) -----

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
                "vocab_size": 10, "num_hidden_layers": 1, "intermediate_size": 8, "rms_norm_eps": 1e-5}


@pytest.mark.parametrize("key, value, msg", [
    ("hidden_size", "abc", r'"hidden_size" must be an integer in \[0, 2147483647\], got \'abc\''),
    ("hidden_size", [64], r'"hidden_size" must be an integer'),
    ("hidden_size", 1e400, r'"hidden_size" must be an integer'),  # json reads 1e400 as inf
    ("vocab_size", True, r'"vocab_size" must be an integer'),
    ("num_hidden_layers", 10**9, r'"num_hidden_layers" must be an integer in \[0, 4096\]'),
    ("rms_norm_eps", "x", r'"rms_norm_eps" must be a finite number'),
    ("rope_theta", float("nan"), r'"rope_theta" must be a finite number'),
    ("rope_scaling", [1, 2], r'"rope_scaling" must be an object or null'),
    ("max_position_embeddings", "4096", r'"max_position_embeddings" must be an integer'),
])
def test_config_values_of_the_wrong_type_are_bonsai_errors(key, value, msg):
    """int()/float()/dict() of config values raised ValueError/TypeError/OverflowError, and a huge
    num_hidden_layers built a tensor list of that length."""
    from bonsai_runner.convert.arch import family_for

    with pytest.raises(BonsaiError, match=msg):
        family_for({**LLAMA_CONFIG, key: value}).tensor_specs()


def test_config_integral_float_sizes_still_work():
    from bonsai_runner.convert.arch import family_for

    assert family_for({**LLAMA_CONFIG, "hidden_size": 64.0}).hp.n_embd == 64


@pytest.mark.parametrize("text", ["[" * 100000, '{"a": 1' + "0" * 5000 + "}"])
def test_read_json_too_deep_or_huge_int_is_a_bonsai_error(tmp_path, text):
    """RecursionError / ValueError (int of > 4300 digits) escaped json.loads."""
    from bonsai_runner.convert.hf_reader import read_json

    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(BonsaiError, match="unreadable JSON"):
        read_json(p)


def _safetensors(tmp_path, header: bytes, data: bytes = b""):
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return p


@pytest.mark.parametrize("header, msg", [
    (b"[" * 100000, "malformed safetensors header"),
    (b'{"a": 1' + b"0" * 5000 + b"}", "malformed safetensors header"),
    # 2**32 x 2**32 F32 wrapped to 0 bytes in int64: accepted, then np.zeros((2**32, 2**32))
    (b'{"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}',
     r"data_offsets span 0 bytes but F32 \[4294967296, 4294967296\] needs"),
    (b'{"w": {"dtype": "F32", "shape": [true, 4], "data_offsets": [0, 16]}}',
     "malformed shape or data_offsets"),
])
def test_safetensors_header_problems_are_bonsai_errors(tmp_path, header, msg):
    from bonsai_runner.convert.safetensors_file import SafetensorsFile

    p = _safetensors(tmp_path, header, b"\0" * 16)
    with pytest.raises(BonsaiError, match=msg):
        SafetensorsFile(p).read_raw("w")


# ----- calibration files (quantize/calibration.py) -----

@pytest.mark.parametrize("line", ['{"text": 1' + "0" * 5000 + "}", "[" * 100000])
def test_calibration_line_with_huge_int_or_deep_nesting_is_a_bonsai_error(tmp_path, line):
    """ValueError (int of > 4300 digits) / RecursionError escaped json.loads."""
    from bonsai_runner.quantize.calibration import read_samples

    p = tmp_path / "calib.jsonl"
    p.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(BonsaiError, match="line 2 is unreadable JSON"):
        read_samples(p)


def test_shard_index_with_a_non_string_file_name_is_a_bonsai_error(tmp_path):
    """fuzz_hf found this: weight_map values of mixed types crashed sorting them (TypeError)."""
    from bonsai_runner.convert.hf_reader import HfCheckpoint

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "model_type": "llama"}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a.weight": "model-00001.safetensors", "b.weight": 3}}))
    with pytest.raises(BonsaiError, match="shard file names, found 3"):
        HfCheckpoint(tmp_path)
