"""prism.hadamard rotated files (SPEC §4a): the FWHT kernels, the engine's activation rotation and
the contract's validation.

The rotated models here are built straight from the contract with numpy, independent of the
converter and of bonsai_runner.hadamard: H is the explicit matrix (-1)^popcount(r & c) / sqrt(B),
each folded weight's rows become (s ⊙ w) @ H blockwise, token_embd's rows likewise (its lookup is
inverted by the engine). A rotated file must give its source's logits to float error.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine_fixtures import Cfg, write_model
from test_engine import ctx_for, rel_err

_core = pytest.importorskip("bonsai_runner._core")
BonsaiError = _core.BonsaiError
gguf = pytest.importorskip("gguf")

RNG = np.random.default_rng(99)
TOKENS = RNG.integers(3, 300, 40)


def explicit_h(block: int) -> np.ndarray:
    r = np.arange(block)
    pc = np.vectorize(lambda v: bin(int(v)).count("1"))(r[:, None] & r[None, :])
    return np.where(pc % 2 == 1, -1.0, 1.0) / np.sqrt(block)


def rotate_np(x: np.ndarray, signs, block: int) -> np.ndarray:
    """WHT_B(s ⊙ x) along the last axis in float64, by the explicit matrix."""
    x = np.asarray(x, np.float64) * (1.0 if signs is None else signs)
    h = explicit_h(block)
    shp = x.shape
    return (x.reshape(-1, shp[-1] // block, block) @ h).reshape(shp)


# ---------------------------------------------------------------- the kernel
BLOCKS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("inverse", [False, True])
def test_fwht_every_path_equals_scalar_and_float64(block, inverse):
    rng = np.random.default_rng(block)
    cols = 2 * block if block >= 64 else 4 * block
    x = rng.standard_normal((5, cols)).astype(np.float32)
    signs = np.where(rng.integers(0, 2, cols) == 1, 1.0, -1.0).astype(np.float32)
    for s in (signs, None):
        ref = _core.hadamard_rotate(x, block, s, inverse=inverse, path="scalar")
        if inverse:
            want = rotate_np(x, None, block) * (1.0 if s is None else s)
        else:
            want = rotate_np(x, s, block)
        assert np.abs(ref - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
        for path in _core.cpu_paths():
            got = _core.hadamard_rotate(x, block, s, inverse=inverse, path=path, threads=2)
            np.testing.assert_array_equal(got, ref, err_msg=f"path {path}, block {block}")
    # self-inverse: unrotate(rotate(x)) == x
    back = _core.hadamard_rotate(_core.hadamard_rotate(x, block, signs), block, signs, inverse=True)
    assert np.abs(back - x).max() < 1e-5 * np.abs(x).max()


def test_fwht_rejects_bad_blocks():
    x = np.zeros((1, 96), np.float32)
    with pytest.raises(BonsaiError, match="power of two"):
        _core.hadamard_rotate(x, 48)
    with pytest.raises(BonsaiError, match="multiple of the Hadamard block"):
        _core.hadamard_rotate(x, 64)


@pytest.mark.parametrize("tname", ["Q8_0", "TQ2_0", "F16"])
@pytest.mark.parametrize("n_tokens", [1, 7, 40])
def test_matmul_rotated_fused_equals_rotate_then_matmul(tname, n_tokens):
    """The rotation fused into the INT8 quantization gives exactly matmul(rotate(x))."""
    from gguf.quants import quantize

    rng = np.random.default_rng(n_tokens)
    rows, cols, block = 24, 512, 128
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    qt = getattr(gguf.GGMLQuantizationType, tname)
    packed = np.ascontiguousarray(quantize(w, qt).view(np.uint8).reshape(rows, -1))
    tid = int(qt)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    signs = np.where(rng.integers(0, 2, cols) == 1, 1.0, -1.0).astype(np.float32)
    for path in _core.cpu_paths():
        for mode in ("int8", "float"):
            xr = _core.hadamard_rotate(x, block, signs, path=path)
            want = _core.matmul(tid, packed, cols, xr, mode=mode, path=path, threads=2)
            got = _core.matmul_rotated(tid, packed, cols, x, block, signs, mode=mode, path=path, threads=2)
            np.testing.assert_array_equal(got, want, err_msg=f"{tname} {path} {mode}")


# ---------------------------------------------------------------- rotated files, built with numpy
def _copy_fields(r, w, drop_prefix=None):
    """Copies every metadata field of reader `r` to writer `w` but the architecture (the writer's
    own) and, with `drop_prefix`, the keys starting with it."""
    for name, val, vt, et in _fields(r):
        if name == "general.architecture" or (drop_prefix and name.startswith(drop_prefix)):
            continue
        if vt.name == "ARRAY":
            w.add_array(name, val)
        elif vt.name == "STRING":
            w.add_string(name, val)
        else:
            w.add_key_value(name, val, vt)


def _fields(reader):
    """(name, value, type) of every metadata field except the GGUF header ones."""
    out = []
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        if vt.name == "ARRAY":
            et = f.types[1]
            vals = [bytes(f.parts[i]).decode() if et.name == "STRING" else f.parts[i].tolist()[0] for i in f.data]
            out.append((f.name, vals, vt, et))
        elif vt.name == "STRING":
            out.append((f.name, bytes(f.parts[-1]).decode(), vt, None))
        else:
            out.append((f.name, f.parts[-1].tolist()[0], vt, None))
    return out


def linear_names(path) -> list[str]:
    r = gguf.GGUFReader(str(path))
    kinds = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    names = [t.name for t in r.tensors
             if t.name.startswith("blk.") and t.name.endswith(".weight") and t.name.split(".")[2] in kinds]
    return names + (["output.weight"] if any(t.name == "output.weight" for t in r.tensors) else [])


def write_rotated(src, dst, block=64, names=None, inverse=True, sign_mode="explicit", seed=5,
                  kv_override=None, drop_keys=(), rotate_tensors=True):
    """Copies a fixture GGUF (F32/F16 tensors) with the given weights folded by the contract.

    kv_override maps a prism.hadamard key to a value (or to (value, GGUFValueType)); drop_keys
    removes keys, for the invalid-metadata cases."""
    r = gguf.GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    names = linear_names(src) if names is None else names
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in r.tensors}
    widths = sorted({shapes[n][-1] for n in names if n in shapes} | ({shapes["token_embd.weight"][-1]} if inverse else set()))
    rng = np.random.default_rng(seed)
    signs = {w: np.where(rng.integers(0, 2, w) == 1, 1.0, -1.0) for w in widths}
    w = gguf.GGUFWriter(str(dst), arch)
    _copy_fields(r, w)
    V = gguf.GGUFValueType
    kv = {
        "prism.hadamard.version": (1, V.UINT32),
        "prism.hadamard.block_size": (block, V.UINT32),
        "prism.hadamard.transform": ("normalized-sylvester-walsh-hadamard", V.STRING),
        "prism.hadamard.axis": ("input-last-dimension", V.STRING),
        "prism.hadamard.sign_mode": (sign_mode, V.STRING),
        "prism.hadamard.weight_names": (list(names), V.ARRAY),
        "prism.hadamard.inverse_weight_names": (["token_embd.weight"] if inverse else [], V.ARRAY),
    }
    if sign_mode == "explicit":
        kv["prism.hadamard.sign_widths"] = ([int(x) for x in widths], V.ARRAY)
        kv["prism.hadamard.sign_values"] = ([int(v) for x in widths for v in signs[x]], V.ARRAY)
    for k, v in (kv_override or {}).items():
        kv[k] = v if isinstance(v, tuple) else (v, V.ARRAY if isinstance(v, list) else
                                                V.STRING if isinstance(v, str) else V.UINT32)
    for k, (v, t) in kv.items():
        if k in drop_keys:
            continue
        if t == V.ARRAY:
            if v:  # the gguf package cannot write empty arrays: an empty list is left out
                w.add_array(k, v)
        else:
            w.add_key_value(k, v, t)
    folded = set(names) | ({"token_embd.weight"} if inverse else set())
    for t in r.tensors:
        data = np.array(t.data)
        if rotate_tensors and t.name in folded:
            s = signs[data.shape[-1]] if sign_mode == "explicit" else None
            data = rotate_np(data.astype(np.float64), s, block).astype(data.dtype)
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _source(tmp_path, arch, wtype="F32", tied=False):
    c = Cfg(arch=arch, wtype=wtype, emb_type=wtype, tied=tied)
    if arch == "qwen3":
        c.head_dim = 32  # n_embd_q 128 != n_embd 64: attn_output's input has its own width and signs
    path = tmp_path / f"{arch}_{wtype}_{tied}.gguf"
    write_model(path, c, seed=3)
    return path


def _logits(path, toks, **kw):
    m = _core.Model(str(path))
    with ctx_for(m, **kw) as ctx:
        return ctx.decode(toks, logits="all").astype(np.float64)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("wtype,tol", [("F32", 1e-4), ("F16", 5e-3)])
def test_rotated_file_gives_source_logits(tmp_path, arch, tied, wtype, tol):
    src = _source(tmp_path, arch, wtype, tied)
    rot = write_rotated(src, tmp_path / "rot.gguf", block=64)
    base = _logits(src, TOKENS)
    got = _logits(rot, TOKENS)
    assert rel_err(got, base) < tol
    # the rotation is really needed: the same tensors read as a plain file give other logits
    stripped = tmp_path / "stripped.gguf"
    _strip_keys(rot, stripped)
    assert rel_err(_logits(stripped, TOKENS), base) > 0.05


def _strip_keys(src, dst):
    r = gguf.GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(dst), arch)
    _copy_fields(r, w, drop_prefix="prism.hadamard.")
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_identity_signs_and_partial_folding(tmp_path):
    """Identity sign mode, and only some weights folded (q folded, k/v not: one input, two paths)."""
    src = _source(tmp_path, "qwen2")
    base = _logits(src, TOKENS)
    rot = write_rotated(src, tmp_path / "id.gguf", block=32, sign_mode="identity")
    assert rel_err(_logits(rot, TOKENS), base) < 1e-4
    some = ["blk.0.attn_q.weight", "blk.1.ffn_up.weight", "blk.1.ffn_down.weight", "output.weight"]
    part = write_rotated(src, tmp_path / "part.gguf", block=64, names=some, inverse=False)
    assert rel_err(_logits(part, TOKENS), base) < 1e-4


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen3", False)])
def test_rotated_int8_activations_close(tmp_path, arch, tied):
    src = _source(tmp_path, arch, "F32", tied)
    rot = write_rotated(src, tmp_path / "rot.gguf", block=64)
    base = _logits(src, TOKENS, act_mode="float")
    got = _logits(rot, TOKENS, act_mode="int8")
    plain_int8 = _logits(src, TOKENS, act_mode="int8")
    err, err_plain = rel_err(got, base), rel_err(plain_int8, base)
    assert 0 < err < 0.05  # close, not exact: the int8 grid differs in the rotated basis
    assert err < 3 * err_plain + 1e-3


def test_rotated_batches_sequences_and_prefix_reuse(tmp_path):
    src = _source(tmp_path, "qwen3", "F32", True)
    rot = write_rotated(src, tmp_path / "rot.gguf", block=64)
    base = _logits(src, TOKENS[:20])
    m = _core.Model(str(rot))
    # two sequences in one batch, different lengths, interleaved
    a, b = TOKENS[:20], TOKENS[20:32]
    with ctx_for(m, n_seq_max=2, n_batch=8) as ctx:
        toks = np.concatenate([a[:12], b])
        pos = np.concatenate([np.arange(12), np.arange(len(b))]).astype(np.int32)
        seqs = [0] * 12 + [1] * len(b)
        out = ctx.decode(toks, pos=pos, seq_ids=seqs, logits="all").astype(np.float64)
        assert rel_err(out[:12], base[:12]) < 1e-4
        assert rel_err(out[12:], _logits(src, b)) < 1e-4
        # prefix reuse: sequence 1 takes sequence 0's first 12 cells, then continues like a
        ctx.seq_rm(1)
        ctx.seq_cp(0, 1, 0, 12)
        tail = ctx.decode(a[12:], pos=np.arange(12, 20).astype(np.int32), seq_ids=[1] * 8, logits="all")
        assert rel_err(tail.astype(np.float64), base[12:]) < 1e-4
    # one token at a time (decode path) equals the batch
    with ctx_for(m) as ctx:
        steps = np.stack([ctx.decode([t], logits="last")[0] for t in a]).astype(np.float64)
    assert rel_err(steps, base) < 1e-4


def test_rotated_file_through_llama(tmp_path):
    from bonsai_runner import Llama

    src = _source(tmp_path, "llama", "F32", True)
    rot = write_rotated(src, tmp_path / "rot.gguf", block=64)
    outs = []
    for p in (src, rot):
        with Llama(str(p), n_ctx=64, verbose=False) as llm:
            outs.append(llm("ab ac", max_tokens=8, temperature=0)["choices"][0]["text"])
    assert outs[0] == outs[1]


# ---------------------------------------------------------------- invalid metadata
V = gguf.GGUFValueType
INVALID = [
    ({"kv_override": {"prism.hadamard.version": 2}}, r"version 2 is not supported"),
    ({"drop_keys": ("prism.hadamard.version",)}, r"no prism.hadamard.version"),
    ({"kv_override": {"prism.hadamard.transform": "walsh-paley"}}, r"transform 'walsh-paley' is not supported"),
    ({"kv_override": {"prism.hadamard.axis": "output-first-dimension"}}, r"axis 'output-first-dimension'"),
    ({"kv_override": {"prism.hadamard.sign_mode": "random"}}, r"sign_mode 'random' is not supported"),
    ({"kv_override": {"prism.hadamard.block_size": 48}}, r"block_size 48 is not a power of two"),
    ({"block": 128, "sign_mode": "identity", "rotate_tensors": False}, r"input width 64 is not a multiple of prism.hadamard.block_size 128"),
    ({"kv_override": {"prism.hadamard.sign_widths": [96]}}, r"width 96, not a positive multiple of block_size 64"),
    ({"kv_override": {"prism.hadamard.sign_widths": [64]}}, r"sign_values has \d+ values but sign_widths add up "
                                                           r"to 64.*lengths are inconsistent"),
    ({"kv_override": {"prism.hadamard.sign_values": ([1, -1, 2] + [1] * 189, V.ARRAY)}},
     r"sign_values\[2\] is 2; every sign must be \+1 or -1"),
    ({"kv_override": {"prism.hadamard.sign_widths": [64, 64]}}, r"lists the width 64 twice"),
    ({"kv_override": {"prism.hadamard.weight_names": ["blk.0.attn_q.weight", "blk.7.attn_q.weight"]}},
     r"'blk.7.attn_q.weight', which is not a folded linear weight of this file"),
    ({"kv_override": {"prism.hadamard.weight_names": ["blk.0.attn_norm.weight"]}},
     r"'blk.0.attn_norm.weight', which is not a folded linear weight"),
    ({"kv_override": {"prism.hadamard.weight_names": ["token_embd.weight"]}},
     r"both prism.hadamard.weight_names and inverse_weight_names"),
    ({"kv_override": {"prism.hadamard.weight_names": ["blk.0.attn_q.weight", "blk.0.attn_q.weight"]}},
     r"lists 'blk.0.attn_q.weight' twice"),
    ({"kv_override": {"prism.hadamard.inverse_weight_names": ["output.weight"]}},
     r"only token_embd.weight can be folded inverse"),
    ({"drop_keys": ("prism.hadamard.sign_values",)}, r"sign_mode is explicit but prism.hadamard.sign_values is missing"),
    ({"sign_mode": "identity", "kv_override": {"prism.hadamard.sign_widths": [64]}},
     r"sign_mode is identity but the file carries sign_widths"),
    ({"kv_override": {"prism.hadamard.rotation_seed": (3, V.UINT32)}}, r"'prism.hadamard.rotation_seed', which is "
                                                                       r"not part of the prism.hadamard version 1"),
    ({"drop_keys": ("prism.hadamard.weight_names",)}, r"weight_names is missing"),
]


@pytest.mark.parametrize("kw,msg", INVALID, ids=[m[:40] for _, m in INVALID])
def test_invalid_contract_is_refused(tmp_path, kw, msg):
    src = _source(tmp_path, "llama", "F32", False)
    bad = write_rotated(src, tmp_path / "bad.gguf", **{"block": 64, **kw})
    with pytest.raises(BonsaiError, match=msg):
        _core.Model(str(bad))


def test_folded_width_without_signs_is_refused(tmp_path):
    # qwen3's attn_output reads n_embd_q = 128 values; give signs only for the width 64
    src = _source(tmp_path, "qwen3", "F32", False)
    r = np.random.default_rng(0)
    bad = write_rotated(src, tmp_path / "bad.gguf", block=64, kv_override={
        "prism.hadamard.sign_widths": [64],
        "prism.hadamard.sign_values": ([int(v) for v in np.where(r.integers(0, 2, 64) == 1, 1, -1)], V.ARRAY)})
    with pytest.raises(BonsaiError, match=r"blk.0.attn_output.weight' is folded .* no sign vector for its input "
                                          r"width 128"):
        _core.Model(str(bad))


def test_tied_head_cannot_be_listed_as_output(tmp_path):
    src = _source(tmp_path, "llama", "F32", True)
    bad = write_rotated(src, tmp_path / "bad.gguf", block=64,
                        kv_override={"prism.hadamard.weight_names": ["output.weight"]})
    with pytest.raises(BonsaiError, match=r"'output.weight', which is not a folded linear weight.*tied to token_embd"):
        _core.Model(str(bad))


# ---------------------------------------------------------------- bonsai convert --hadamard
def _convert(src, dst, *args):
    from bonsai_runner.cli import main

    assert main(["convert", str(src), "--outfile", str(dst), "--no-progress", *args]) == 0
    return dst


def _meta(path):
    from bonsai_runner.gguf_reader import open_gguf

    with open_gguf(str(path)) as g:
        return dict(g.metadata), {t.name: t.type_name for t in g.tensors}


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False), ("qwen3", True)])
def test_convert_hadamard_gives_source_logits(tmp_path, arch, tied):
    src = _source(tmp_path, arch, "F32", tied)
    rot = _convert(src, tmp_path / "rot.gguf", "--hadamard", "64", "--hadamard-seed", "7")
    meta, types = _meta(rot)
    assert meta["prism.hadamard.block_size"] == 64 and meta["prism.hadamard.sign_mode"] == "explicit"
    assert "output.weight" in types and "output.weight" in meta["prism.hadamard.weight_names"]
    assert meta["prism.hadamard.inverse_weight_names"] == ["token_embd.weight"]
    assert sum(meta["prism.hadamard.sign_widths"]) == len(meta["prism.hadamard.sign_values"])
    assert rel_err(_logits(rot, TOKENS), _logits(src, TOKENS)) < 1e-4
    # the same seed gives the same file's signs; another seed other signs
    other = _convert(src, tmp_path / "rot2.gguf", "--hadamard", "64", "--hadamard-seed", "8")
    assert _meta(other)[0]["prism.hadamard.sign_values"] != meta["prism.hadamard.sign_values"]


def _convert_fails(capsys, *argv):
    from bonsai_runner.cli import main

    assert main(["convert", *map(str, argv), "--no-progress"]) != 0
    return capsys.readouterr().err


def test_convert_hadamard_then_retype_keeps_the_rotation(tmp_path, capsys):
    src = _source(tmp_path, "llama", "F32", False)
    rot = _convert(src, tmp_path / "rot.gguf", "--hadamard", "64", "--outtype", "f16")
    capsys.readouterr()
    q = _convert(rot, tmp_path / "rot-q8.gguf", "--outtype", "q8_0", "--allow-lossy")
    assert "mainline llama.cpp ignores those keys" in capsys.readouterr().err
    meta_r, _ = _meta(rot)
    meta_q, types_q = _meta(q)
    assert {k: v for k, v in meta_q.items() if k.startswith("prism.")} == \
        {k: v for k, v in meta_r.items() if k.startswith("prism.")}
    assert types_q["blk.0.attn_q.weight"] == "Q8_0"
    base = _logits(src, TOKENS)
    assert rel_err(_logits(q, TOKENS), base) < 0.02
    assert rel_err(_logits(q, TOKENS, act_mode="int8"), base) < 0.05
    # folding into a quantized type re-quantizes: lossy, so it needs --allow-lossy
    q8 = _convert(src, tmp_path / "q8.gguf", "--outtype", "q8_0", "--allow-lossy")
    assert "pass --allow-lossy" in _convert_fails(capsys, q8, "--outfile", tmp_path / "x.gguf", "--hadamard", "64")
    rq = _convert(q8, tmp_path / "q8-rot.gguf", "--hadamard", "64", "--allow-lossy")
    assert rel_err(_logits(rq, TOKENS), base) < 0.02


@pytest.mark.parametrize("args,msg", [
    (["--hadamard", "48"], "must be a power of two"),
    (["--hadamard", "128"], "input width 64, not a multiple of the block"),
])
def test_convert_hadamard_errors(tmp_path, capsys, args, msg):
    src = _source(tmp_path, "llama", "F32", False)
    assert msg in _convert_fails(capsys, src, "--outfile", tmp_path / "x.gguf", *args)
    assert not (tmp_path / "x.gguf").exists()


def test_convert_refuses_to_rotate_twice(tmp_path, capsys):
    src = _source(tmp_path, "llama", "F32", False)
    rot = _convert(src, tmp_path / "rot.gguf", "--hadamard", "64")
    assert "already Hadamard-rotated" in _convert_fails(capsys, rot, "--outfile", tmp_path / "x.gguf",
                                                        "--hadamard", "64")


def test_rotation_summary_for_inspect(tmp_path):
    from bonsai_runner.hadamard import format_rotation

    src = _source(tmp_path, "llama", "F32", True)
    rot = _convert(src, tmp_path / "rot.gguf", "--hadamard", "64")
    text = format_rotation(_meta(rot)[0])
    assert "block 64" in text and "folded weights: 15" in text and "token_embd.weight" in text
    assert format_rotation(_meta(src)[0]) is None
    from bonsai_runner.inspect import format_report, inspect_file

    assert text in format_report(inspect_file(rot))  # `bonsai inspect` shows it
    assert "Hadamard" not in format_report(inspect_file(src))


def test_plan_counts_the_sign_vectors(tmp_path):
    from bonsai_runner.plan import PlanParams, device_budgets
    from bonsai_runner.plan_model import describe_gguf

    src = _source(tmp_path, "qwen3", "F32", True)
    rot = _convert(src, tmp_path / "rot.gguf", "--hadamard", "64")
    p = PlanParams(n_ctx=64, n_batch=16, n_threads=2)
    for path in (src, rot):
        cpu = device_budgets(describe_gguf(path), p)["CPU"]
        with _core.Model(str(path)) as m:
            mm = m.memory_report()
            with _core.Context(m, n_ctx=64, n_batch=16, n_threads=2) as c:
                cm = c.memory_report()
        assert cpu["weights_bytes"] == mm["weights_bytes"]
        assert cpu["weights_by_type"] == mm["weights_by_type"]
        assert cpu["compute_bytes"] == cm["compute_bytes"]
    n_signs = len(_meta(rot)[0]["prism.hadamard.sign_values"])
    assert n_signs == 64 + 128  # widths n_embd and 128 (attn_output reads n_embd_q = n_ff = 128: one vector)


# ---------------------------------------------------------------- GPU (skipped without a CUDA device)
@pytest.mark.cuda
@pytest.mark.parametrize("act_mode", ["float", "int8"])
@pytest.mark.parametrize("n_gpu", [-1, 1])
def test_rotated_file_on_gpu_matches_cpu(tmp_path, act_mode, n_gpu):
    """hadamard.cu wired into the GPU layers (and the head when every layer is offloaded)."""
    src = _source(tmp_path, "qwen3", "F32", True)
    rot = _convert(src, tmp_path / "rot.gguf", "--hadamard", "64", "--outtype", "q8_0", "--allow-lossy")
    cpu = _logits(rot, TOKENS, act_mode=act_mode)
    m = _core.Model(str(rot), n_gpu_layers=n_gpu)
    with ctx_for(m, act_mode=act_mode) as ctx:
        gpu = ctx.decode(TOKENS, logits="all").astype(np.float64)
    assert rel_err(gpu, cpu) < (1e-4 if act_mode == "float" else 2e-3)


def test_convert_hadamard_from_a_hugging_face_directory(tmp_path, hf_model):
    facts = hf_model(arch="qwen2", hidden=128, ffn=256, n_head=4, n_head_kv=2)
    plain = _convert(facts["dir"], tmp_path / "plain.gguf", "--outtype", "f32")
    rot = _convert(facts["dir"], tmp_path / "rot.gguf", "--outtype", "f32", "--hadamard", "128")
    meta, types = _meta(rot)
    assert meta["prism.hadamard.block_size"] == 128 and types["token_embd.weight"] == "F32"
    assert not list(tmp_path.glob(".*unrotated*"))  # the temporary F32 file is gone
    toks = TOKENS[:24] % 200
    assert rel_err(_logits(rot, toks), _logits(plain, toks)) < 1e-4
    # a ternary output type keeps token_embd / output at F16, as the plain conversion does
    q = _convert(facts["dir"], tmp_path / "rot-q.gguf", "--outtype", "ptq1_0", "--allow-lossy", "--hadamard", "128")
    _, qtypes = _meta(q)
    assert qtypes["token_embd.weight"] == "F16" and qtypes["blk.0.attn_q.weight"] == "PTQ1_0"
