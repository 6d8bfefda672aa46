"""GGUF format: our writer, our C++ reader (_core.GgufFile / gguf_reader) and gguf-py agree.

- Files written by GGUFWriter are read by gguf-py's GGUFReader (for the types it knows) and by our
  reader with identical metadata (values and types) and tensor bytes.
- Ids gguf-py 0.19 does not know (42 in both layouts, 142, 143) round-trip through our writer and
  reader; gguf-py refuses id 143.
- Every malformed-file rule of the reader answers with one BonsaiError naming the problem.
- The writer validates its input and never leaves a partial file.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from bonsai_runner import _core
from bonsai_runner.errors import BonsaiError
from bonsai_runner.gguf_reader import open_gguf
from bonsai_runner.gguf_writer import GGUFWriter, ValueType
from real_model import real_model_path  # noqa: F401  (fixture)

gguf = pytest.importorskip("gguf")

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------------------------
# helpers

def _all_value_kinds(w: GGUFWriter) -> dict[str, tuple[object, str]]:
    """Adds one key of every value type; returns key -> (value, expected GGUF type name)."""
    keys = {
        "t.u8": (200, ValueType.UINT8), "t.i8": (-100, ValueType.INT8),
        "t.u16": (60000, ValueType.UINT16), "t.i16": (-30000, ValueType.INT16),
        "t.u32": (4000000000, None), "t.i32": (-2000000000, None),
        "t.f32": (0.25, None), "t.bool": (True, None), "t.str": ("héllo\nworld", None),
        "t.u64": (2**40, None), "t.i64": (-2**40, ValueType.INT64), "t.f64": (1.5, ValueType.FLOAT64),
        "t.arr_str": (["a", "", "ü"], None), "t.arr_i32": ([1, -2, 3], None),
        "t.arr_f32": ([0.5, -1.0], None), "t.arr_u8": ([1, 2, 255], ValueType.UINT8),
        "t.arr_bool": ([True, False], None),
    }
    expected = {
        "t.u8": "UINT8", "t.i8": "INT8", "t.u16": "UINT16", "t.i16": "INT16", "t.u32": "UINT32",
        "t.i32": "INT32", "t.f32": "FLOAT32", "t.bool": "BOOL", "t.str": "STRING",
        "t.u64": "UINT64", "t.i64": "INT64", "t.f64": "FLOAT64", "t.arr_str": "ARRAY[STRING]",
        "t.arr_i32": "ARRAY[INT32]", "t.arr_f32": "ARRAY[FLOAT32]", "t.arr_u8": "ARRAY[UINT8]",
        "t.arr_bool": "ARRAY[BOOL]",
    }
    for k, (v, vt) in keys.items():
        w.add(k, v, vt)
    return {k: (v, expected[k]) for k, (v, _) in keys.items()}


def _quantize(x: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.quantize(x, gguf.GGMLQuantizationType[name]).view(np.uint8)


def _random_bytes(info_name: str, shape: tuple[int, ...]) -> np.ndarray:
    from bonsai_runner.ggml_types import type_info

    info = type_info(info_name)
    n = int(np.prod(shape))
    return RNG.integers(0, 256, info.row_bytes(n), dtype=np.uint8)


def _raw_gguf(kvs: bytes, n_kv: int, tensors: list[tuple[str, list[int], int, int]],
              data_len: int, *, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    """Hand-built file: tensors as (name, ne in ggml order, ggml id, offset)."""
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), n_kv) + kvs)
    for name, ne, tid, off in tensors:
        out += _s(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, tid, off)
    out += bytes(-len(out) % 32)
    out += bytes((i * 7 + 1) % 256 for i in range(data_len))
    return bytes(out)


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


ARCH_KV = _s("general.architecture") + struct.pack("<I", 8) + _s("llama")


def _open_error(tmp_path, data: bytes, name: str = "bad.gguf") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(BonsaiError) as e:
        _core.GgufFile(str(p))
    msg = str(e.value)
    assert str(p) in msg, msg
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# writer -> gguf-py and our reader

def test_writer_output_matches_gguf_py_and_our_reader(tmp_path):
    path = tmp_path / "std.gguf"
    w = GGUFWriter(path, "llama")
    kinds = _all_value_kinds(w)
    f32 = RNG.standard_normal((3, 64)).astype(np.float32)
    f16 = RNG.standard_normal((2, 48)).astype(np.float16)
    x = RNG.standard_normal((4, 256)).astype(np.float32)
    tensors = {
        "a.f32": (f32, "F32", f32.shape),
        "a.f16": (f16, "F16", f16.shape),
        "a.bf16": (_quantize(x, "BF16"), "BF16", x.shape),
        "a.q8": (_quantize(x, "Q8_0"), "Q8_0", x.shape),
        "a.q4": (_quantize(x, "Q4_0"), "Q4_0", x.shape),
        "a.tq1": (_quantize(x, "TQ1_0"), "TQ1_0", x.shape),
        "a.tq2": (lambda: _quantize(x, "TQ2_0"), "TQ2_0", x.shape),
        "a.vec": (f32[0], "F32", (64,)),
    }
    for name, (data, qt, shape) in tensors.items():
        w.add_tensor(name, data, qt, shape)
    w.write()
    assert not os.path.exists(str(path) + ".tmp")

    ref = gguf.GGUFReader(path)
    ours = _core.GgufFile(str(path))
    assert ours.version == 3 and ours.alignment == 32
    assert list(ours.metadata) == [f.name for f in ref.fields.values()
                                   if not f.name.startswith("GGUF.")]
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        gtypes = [t.name for t in field.types]
        want = gtypes[0] if len(gtypes) == 1 else f"ARRAY[{gtypes[1]}]"
        assert ours.metadata_types[key] == want, key
        ref_value = field.contents()
        if isinstance(ref_value, float):
            assert ours.metadata[key] == pytest.approx(ref_value, rel=0, abs=0)
        else:
            assert ours.metadata[key] == ref_value, key
    for key, (value, tname) in kinds.items():
        assert ours.metadata_types[key] == tname
        assert ours.metadata[key] == value
    assert ours.metadata["general.architecture"] == "llama"

    ref_tensors = {t.name: t for t in ref.tensors}
    assert [t.name for t in ours.tensors] == list(tensors)
    for t in ours.tensors:
        r = ref_tensors[t.name]
        assert t.type_name == r.tensor_type.name
        assert t.file_id == int(r.tensor_type)
        assert list(t.ne) == [int(d) for d in r.shape]
        assert t.shape == tuple(tensors[t.name][2])
        assert t.nbytes == r.n_bytes
        assert t.offset == r.data_offset - ours.data_offset
        assert np.array_equal(ours.tensor_data(t.name), np.asarray(r.data).view(np.uint8).ravel())

    with open_gguf(path) as g:
        assert np.array_equal(g.tensor_array("a.f32"), f32)
        assert np.array_equal(g.tensor_array("a.f16"), f16.astype(np.float32))
        bf = g.tensor_array("a.bf16")
        assert bf.dtype == np.float32 and bf.shape == x.shape
        assert np.allclose(bf, x, rtol=1e-2, atol=1e-2)
        assert g.tensor_array("a.q8").dtype == np.uint8
        assert g.value_type("t.arr_u8") == (ValueType.ARRAY, ValueType.UINT8)
        assert g.value_type("t.i16") == (ValueType.INT16, None)


def test_gguf_py_reads_custom_alignment(tmp_path):
    path = tmp_path / "a64.gguf"
    x = RNG.standard_normal((2, 40)).astype(np.float32)
    w = GGUFWriter(path, "llama", alignment=64)
    w.add_tensor("a", x[0], "F32", (40,))
    w.add_tensor("b", x, "F32", x.shape)
    w.write()
    ref = gguf.GGUFReader(path)
    assert ref.alignment == 64
    assert np.array_equal(np.asarray(ref.tensors[1].data), x)
    assert _core.GgufFile(path).tensor("b").offset == 192


def test_gguf_py_written_file_reads_identically(tmp_path):
    path = tmp_path / "by_gguf_py.gguf"
    gw = gguf.GGUFWriter(path, "qwen2")
    gw.add_uint32("qwen2.block_count", 2)
    gw.add_float32("qwen2.rope.freq_base", 1e6)
    gw.add_token_list(["<s>", "a", "b"])
    gw.add_token_types([3, 1, 1])
    w16 = RNG.standard_normal((8, 32)).astype(np.float16)
    gw.add_tensor("blk.0.attn_q.weight", w16)
    gw.add_tensor("blk.0.attn_k.weight", _quantize(RNG.standard_normal((2, 64)).astype(np.float32), "Q8_0"),
                  raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    with open_gguf(path) as g:
        assert g.metadata["qwen2.block_count"] == 2
        assert g.metadata["tokenizer.ggml.tokens"] == ["<s>", "a", "b"]
        assert g.metadata_types["tokenizer.ggml.token_type"] == "ARRAY[INT32]"
        assert g.tensor("blk.0.attn_q.weight").shape == (8, 32)
        assert np.array_equal(g.tensor_array("blk.0.attn_q.weight"), w16.astype(np.float32))
        assert g.tensor("blk.0.attn_k.weight").type_name == "Q8_0"


@pytest.mark.parametrize("use_mmap", [True, False])
def test_prism_and_q2_ids_round_trip(tmp_path, use_mmap):
    path = tmp_path / "ternary.gguf"
    shapes = {"PTQ1_0": (4, 256), "PQ2_0": (3, 128), "Q2_0": (8, 512), "Q2_0_G128": (8, 512),
              "TQ1_0": (2, 256)}
    data = {name: _random_bytes(name, shape) for name, shape in shapes.items()}
    w = GGUFWriter(path, "llama", alignment=64)
    for name, shape in shapes.items():
        w.add_tensor(f"w.{name.lower()}", data[name], name, shape)
    w.write()

    with open_gguf(path, use_mmap=use_mmap) as g:
        assert g.alignment == 64
        assert g.metadata["general.alignment"] == 64
        assert g.metadata_types["general.alignment"] == "UINT32"
        for name, shape in shapes.items():
            t = g.tensor(f"w.{name.lower()}")
            assert t.type_name == name
            assert t.supported and t.engine_type == g.type_info(t.name).engine_id
            assert t.file_id == {"Q2_0_G128": 42}.get(name, t.engine_type)
            assert t.shape == shape and t.offset % 64 == 0
            assert np.array_equal(g.tensor_bytes(t.name), data[name])
        g.check_engine_types()

    with pytest.raises(ValueError, match="143"):
        gguf.GGUFReader(path)


def test_tensor_view_is_read_only_and_outlives_close(tmp_path):
    path = tmp_path / "v.gguf"
    x = np.arange(64, dtype=np.float32)
    w = GGUFWriter(path, "llama")
    w.add_tensor("x", x, "F32", x.shape)
    w.write()
    f = _core.GgufFile(path)
    view = f.tensor_data("x")
    with pytest.raises(ValueError):
        view[0] = 1
    f.close()
    assert f.closed
    assert np.array_equal(view.view(np.float32), x)
    with pytest.raises(BonsaiError, match="closed"):
        f.tensor_data("x")
    with pytest.raises(BonsaiError, match="tensor 'nope' is missing"):
        _core.GgufFile(path).tensor_data("nope")


# ---------------------------------------------------------------------------------------------
# reader: bad input, one error per rule

def _valid_file(tmp_path) -> bytes:
    path = tmp_path / "valid.gguf"
    w = GGUFWriter(path, "llama")
    w.add("tokenizer.ggml.tokens", [f"tok{i}" for i in range(50)])
    w.add("llama.block_count", 2)
    w.add_tensor("a", np.ones(64, np.float32), "F32", (64,))
    w.add_tensor("b", _random_bytes("PTQ1_0", (2, 128)), "PTQ1_0", (2, 128))
    w.add_tensor("c", np.ones(40, np.float32), "F32", (40,))  # 160 bytes, no padding after it
    w.write()
    return path.read_bytes()


def test_truncated_file_at_several_points(tmp_path):
    good = _valid_file(tmp_path)
    header_end = len(good) - 256 - 64 - 160
    for cut in [0, 3, 10, 20, 40, 100, 300, header_end - 5, header_end + 100, len(good) - 1]:
        msg = _open_error(tmp_path, good[:cut])
        assert "truncated" in msg, (cut, msg)


def test_wrong_magic(tmp_path):
    msg = _open_error(tmp_path, b"PK\x03\x04" + bytes(100))
    assert "not a GGUF file" in msg and "PK\\x03\\x04" in msg


@pytest.mark.parametrize("version", [1, 2, 4])
def test_unsupported_version(tmp_path, version):
    msg = _open_error(tmp_path, _raw_gguf(ARCH_KV, 1, [], 0, version=version))
    assert f"unsupported GGUF version {version}" in msg


def test_unknown_value_type(tmp_path):
    kv = _s("my.key") + struct.pack("<II", 13, 0)
    assert "'my.key' has unknown value type 13" in _open_error(tmp_path, _raw_gguf(kv, 1, [], 0))


def test_duplicate_key(tmp_path):
    msg = _open_error(tmp_path, _raw_gguf(ARCH_KV + ARCH_KV, 2, [], 0))
    assert "duplicate metadata key 'general.architecture'" in msg


def test_string_length_past_eof(tmp_path):
    kv = _s("general.name") + struct.pack("<IQ", 8, 10**12) + b"abc"
    msg = _open_error(tmp_path, _raw_gguf(kv, 1, [], 0))
    assert "'general.name'" in msg and "runs past the end of the file" in msg


def test_absurd_counts(tmp_path):
    assert "claims 1000000 tensors" in _open_error(
        tmp_path, b"GGUF" + struct.pack("<IQQ", 3, 10**6, 0))
    kv = _s("k") + struct.pack("<IIQ", 9, 4, 2**50)
    assert "'k' claims an array of" in _open_error(tmp_path, _raw_gguf(kv, 1, [], 0))


def test_unknown_tensor_type_opens_but_is_unsupported(tmp_path):
    data = _raw_gguf(ARCH_KV, 1, [("w", [256], 12, 0), ("x", [10], 99, 160)], 224)
    path = tmp_path / "foreign.gguf"
    path.write_bytes(data)
    with open_gguf(path) as g:
        w, x = g.tensor("w"), g.tensor("x")
        assert (w.type_name, w.supported, w.engine_type, w.file_id, w.nbytes) == (
            "Q4_K", False, None, 12, 144)
        assert (x.type_name, x.supported, x.file_id) == ("type 99", False, 99)
        with pytest.raises(BonsaiError, match="'w' has type Q4_K, which is not supported by the engine"):
            g.check_engine_types()
        assert g.type_info("w") is None
        assert g.tensor_array("w").dtype == np.uint8
    from conftest import run_cli

    p = run_cli("inspect", path)
    assert p.returncode == 0, p.stderr
    assert "Q4_K" in p.stdout and "cannot run" in p.stdout


def test_tensor_past_end_of_file(tmp_path):
    msg = _open_error(tmp_path, _raw_gguf(ARCH_KV, 1, [("w", [64], 0, 0)], 100))
    assert "'w'" in msg and "extends past the end of the file" in msg


def test_misaligned_offset(tmp_path):
    msg = _open_error(tmp_path, _raw_gguf(ARCH_KV, 1, [("a", [8], 0, 0), ("b", [8], 0, 40)], 128))
    assert "'b' has data offset 40, not a multiple of the alignment 32" in msg


def test_overlapping_tensors(tmp_path):
    msg = _open_error(tmp_path, _raw_gguf(ARCH_KV, 1, [("a", [64], 0, 0), ("b", [8], 0, 128)], 256))
    assert "'a'" in msg and "overlaps tensor 'b'" in msg


def test_id42_of_neither_size(tmp_path):
    msg = _open_error(tmp_path, _raw_gguf(
        ARCH_KV, 1, [("w", [4096], 42, 0), ("x", [8], 0, 1024)], 1056))
    assert "'w' has ggml type id 42" in msg and "size of neither" in msg


def test_row_not_multiple_of_block(tmp_path):
    msg = _open_error(tmp_path, _raw_gguf(ARCH_KV, 1, [("w", [100, 2], 143, 0)], 128))
    assert "'w' of type PTQ1_0 has rows of 100 elements, not a multiple of its block size 128" in msg


def test_duplicate_tensor_name(tmp_path):
    msg = _open_error(tmp_path, _raw_gguf(ARCH_KV, 1, [("w", [8], 0, 0), ("w", [8], 0, 32)], 64))
    assert "duplicate tensor name 'w'" in msg


def test_bad_shapes(tmp_path):
    assert "'w' has 5 dimensions" in _open_error(
        tmp_path, _raw_gguf(ARCH_KV, 1, [("w", [1, 1, 1, 1, 1], 0, 0)], 32))
    assert "'w' has dimension 1 = 0" in _open_error(
        tmp_path, _raw_gguf(ARCH_KV, 1, [("w", [4, 0], 0, 0)], 32))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(BonsaiError, match="cannot open .*No such file"):
        open_gguf(tmp_path / "absent.gguf")
    with pytest.raises(BonsaiError, match="is a directory"):
        open_gguf(tmp_path)


# ---------------------------------------------------------------------------------------------
# writer validation and atomicity

def test_writer_rejects_bad_tensors(tmp_path):
    w = GGUFWriter(tmp_path / "x.gguf", "llama")
    with pytest.raises(BonsaiError, match="'q': 10 bytes given, but Q8_0 of shape"):
        w.add_tensor("q", np.zeros(10, np.uint8), "Q8_0", (2, 32))
    with pytest.raises(BonsaiError, match="'q': float32 data cannot be stored as Q8_0"):
        w.add_tensor("q", np.zeros((2, 32), np.float32), "Q8_0", (2, 32))
    with pytest.raises(BonsaiError, match="rows of 100 elements are not a multiple of the PTQ1_0"):
        w.add_tensor("p", np.zeros(28, np.uint8), "PTQ1_0", (1, 100))
    with pytest.raises(BonsaiError, match="'f': 10 float32 values given"):
        w.add_tensor("f", np.zeros(10, np.float32), "F32", (12,))
    with pytest.raises(BonsaiError, match="unknown tensor type 'Q4_K'"):
        w.add_tensor("k", np.zeros(144, np.uint8), "Q4_K", (256,))
    with pytest.raises(BonsaiError, match="too small to be told apart"):
        w.add_tensor("s", np.zeros(34, np.uint8), "Q2_0_G128", (128,))
    w.add_tensor("ok", np.zeros(4, np.float32), "F32", (4,))
    with pytest.raises(BonsaiError, match="tensor 'ok' was added twice"):
        w.add_tensor("ok", np.zeros(4, np.float32), "F32", (4,))
    with pytest.raises(BonsaiError, match="'general.architecture' was added twice"):
        w.add("general.architecture", "qwen2")
    with pytest.raises(BonsaiError, match="'k': value 300 does not fit UINT8"):
        w.add("k", 300, ValueType.UINT8)
    with pytest.raises(BonsaiError, match="array mixes element types"):
        w.add("m", [1, "a"])
    with pytest.raises(BonsaiError, match="empty array"):
        w.add("e", [])
    w.add("e", [], ValueType.INT32)


def test_writer_leaves_nothing_when_a_lazy_tensor_fails(tmp_path):
    path = tmp_path / "out.gguf"

    def boom():
        raise RuntimeError("producer failed")

    w = GGUFWriter(path, "llama")
    w.add_tensor("a", np.ones(64, np.float32), "F32", (64,))
    w.add_tensor("b", boom, "F32", (64,))
    with pytest.raises(RuntimeError, match="producer failed"):
        w.write()
    assert os.listdir(tmp_path) == []

    w = GGUFWriter(path, "llama")
    w.add_tensor("a", lambda: np.zeros(3, np.uint8), "Q8_0", (32,))
    with pytest.raises(BonsaiError, match="'a': 3 bytes given"):
        w.write()
    assert os.listdir(tmp_path) == []

    path.write_bytes(b"previous")
    w = GGUFWriter(path, "llama")
    w.add_tensor("b", boom, "F32", (64,))
    with pytest.raises(RuntimeError):
        w.write()
    assert path.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["out.gguf"]


# ---------------------------------------------------------------------------------------------
# bonsai inspect

def _model_with_fallback(tmp_path):
    import json

    path = tmp_path / "tiny.gguf"
    w = GGUFWriter(path, "llama")
    w.add("llama.block_count", 1)
    w.add("llama.embedding_length", 128)
    w.add("llama.attention.head_count", 2)
    w.add("tokenizer.ggml.tokens", [f"t{i}" for i in range(300)])
    w.add("bonsai.fallback_table", json.dumps([
        {"tensor": "blk.0.ffn_down.weight", "type": "Q8_0", "reason": "down_proj default",
         "cosine": 0.9712}]))
    w.add_tensor("token_embd.weight", np.zeros((300, 128), np.float16), "F16", (300, 128))
    w.add_tensor("blk.0.attn_q.weight", _random_bytes("PTQ1_0", (128, 128)), "PTQ1_0", (128, 128))
    w.add_tensor("blk.0.ffn_down.weight", _random_bytes("Q8_0", (128, 256)), "Q8_0", (128, 256))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(128, np.float32), "F32", (128,))
    w.write()
    return path


def test_inspect_report(tmp_path):
    from conftest import run_cli

    path = _model_with_fallback(tmp_path)
    p = run_cli("inspect", path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "architecture: llama (blocks 1, vocab 300, embedding 128, heads 2)" in out
    assert "[300 items]" in out
    assert "blk.0.attn_q.weight" in out and "128 x 128" in out
    lin_bits = (128 * 128 // 128 * 28 + 128 * 256 // 32 * 34) * 8
    lin_el = 128 * 128 + 128 * 256
    assert f"linear layers: {lin_bits / lin_el:.4f} bpw over 2 tensors" in out
    assert "fallback layer table (1 tensors" in out
    assert "blk.0.ffn_down.weight  Q8_0  down_proj default  0.9712" in out
    assert "cannot run" not in out

    p = run_cli("inspect", path, "--json", "--no-tensors")
    assert p.returncode == 0, p.stderr
    import json

    r = json.loads(p.stdout)
    assert "tensors" not in r
    assert r["types"]["PTQ1_0"]["bpw"] == 1.75
    assert r["bpw"]["linear"] == pytest.approx(lin_bits / lin_el)
    assert r["bpw"]["file"] == pytest.approx(8 * os.path.getsize(path) / (lin_el + 300 * 128 + 128))
    assert r["fallback_table"][0]["reason"] == "down_proj default"
    assert r["metadata"]["tokenizer.ggml.tokens"]["count"] == 300

    p = run_cli("inspect", path, "--no-tensors")
    assert "blk.0.attn_norm.weight" not in p.stdout


def test_inspect_bad_file_exit_1_one_line(tmp_path):
    from conftest import run_cli

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 2) + bytes(16))
    p = run_cli("inspect", bad)
    assert p.returncode == 1
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1 and "unsupported GGUF version 2" in p.stderr
    p = run_cli("inspect", tmp_path / "missing.gguf")
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "cannot open" in p.stderr


def test_inspect_malformed_fallback_table(tmp_path):
    from conftest import run_cli

    path = tmp_path / "ft.gguf"
    w = GGUFWriter(path, "llama")
    w.add("bonsai.fallback_table", "{not json")
    w.write()
    p = run_cli("inspect", path)
    assert p.returncode == 1 and "bonsai.fallback_table is not valid JSON" in p.stderr


# ---------------------------------------------------------------------------------------------
# bonsai_run command line

def test_bonsai_run_help():
    from conftest import run_bonsai_run

    p = run_bonsai_run("--help")
    assert p.returncode == 0
    for flag in ["--model", "--config", "--tokenizer", "--n-gpu-layers", "--ctx-size", "--temp",
                 "--top-p", "--top-k", "--min-p", "--repeat-penalty", "--repeat-last-n",
                 "--cache-type-k", "--cache-type-v", "--flash-attn", "--cuda-graph", "--no-mmap",
                 "--parallel", "--batch-size", "--cache-prompt", "--threads", "--seed", "--prompt",
                 "--file", "--n-predict", "--interactive", "--inspect", "examples:"]:
        assert flag in p.stdout, flag


@pytest.mark.parametrize("args, needle", [
    (["-m", "x.gguf", "--bogus"], "unknown flag '--bogus'"),
    (["-m", "x.gguf", "--ctx-size", "lots"], "invalid value 'lots' for --ctx-size"),
    (["-m", "x.gguf", "--cache-type-v", "q4_0"], "expected f16 or q8_0"),
    (["-m", "x.gguf", "--top-p", "2"], "between 0 and 1"),
    (["-p", "hi"], "--model is required"),
])
def test_bonsai_run_bad_command_line(args, needle):
    from conftest import run_bonsai_run

    p = run_bonsai_run(*args)
    assert p.returncode == 2
    assert needle in p.stderr and "usage: bonsai_run" in p.stderr


def test_bonsai_run_inspect_and_refusals(tmp_path):
    from conftest import run_bonsai_run

    path = _model_with_fallback(tmp_path)
    p = run_bonsai_run("--model", path, "--inspect")
    assert p.returncode == 0, p.stderr
    assert "blk.0.attn_q.weight" in p.stdout and "PTQ1_0" in p.stdout
    assert "totals per type" in p.stdout and "linear layers:" in p.stdout
    p2 = run_bonsai_run("-m", path, "--inspect", "--no-mmap")
    assert p2.returncode == 0 and p2.stdout == p.stdout

    p = run_bonsai_run("-m", path, "-p", "hello")
    assert p.returncode == 1 and "llama.context_length" in p.stderr and p.stderr.count("\n") == 1

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(60))
    p = run_bonsai_run("-m", bad, "--inspect")
    assert p.returncode == 1 and "not a GGUF file" in p.stderr and p.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# a real file (Qwen2.5-Coder-0.5B Q4_K_M): our reader agrees with gguf-py on every key and tensor

@pytest.mark.real_model
def test_real_model_matches_gguf_py(real_model_path):
    path = str(real_model_path)
    ref = gguf.GGUFReader(path)
    with open_gguf(path) as g:
        for key, field in ref.fields.items():
            if key.startswith("GGUF."):
                continue
            v = field.contents()
            assert g.metadata[key] == (pytest.approx(v) if isinstance(v, float) else v), key
        assert len(g.tensors) == len(ref.tensors)
        for r in ref.tensors:
            t = g.tensor(r.name)
            assert t.type_name == r.tensor_type.name and t.nbytes == r.n_bytes
            assert t.offset + g.data_offset == r.data_offset
        assert np.array_equal(g.tensor_array("output_norm.weight"),
                              np.asarray(ref.get_tensor(len(ref.tensors) - 1).data))
