"""CUDA ops against the CPU reference, one case per op x type (`pytest -m cuda`; skipped without a
BONSAI_CUDA=ON build and a GPU).

Expected agreement (stated per case, failures print the op, the type, the max error and where):
- matmul INT8 mode, quantized weights: the GPU quantizes activations with the CPU's arithmetic and
  sums d_b * isum_b with one fma per block in block order, so the result is expected bit-identical
  to the CPU's (_core.matmul). The test demands >= 90% of outputs bit-identical and every output
  within 2e-3 of its row's magnitude: one activation rounded the other way at an exact .5 tie (if a
  compiler contracted x * (127/amax) - trunc(...) into an fma on one side) moves a whole token's
  outputs by ~1/127 of one term, while a wrong unpacking moves them by O(1). The share of
  bit-identical outputs is printed on failure.
- matmul FLOAT mode and F32/F16/BF16 weights: f32 sums in another order: relative 1e-5 of the
  magnitude sum |x| @ |W|.
- get_rows, cache store (F16 / Q8_0 bytes): bit-identical to the CPU dequantizer / quantizer.
- rms_norm, rope, swiglu, attention: a float64 numpy reference, relative 1e-5 (attention: the
  cache rows are the F16 / Q8_0 values the GPU stored, dequantized by numpy).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from bonsai_runner import _core, quants
from test_matmul import TYPES, random_weight

pytestmark = pytest.mark.cuda

MATMUL_SHAPES = [(1, 37), (3, 64), (9, 16), (17, 5)]   # (n_tokens, rows): vector, small and >8 tokens


def _cols(name: str) -> int:
    be = TYPES[name][1]
    return max(be, 256) * 2 if be > 1 else 160


def _report(op: str, name: str, got: np.ndarray, want: np.ndarray) -> str:
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    i = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    return (f"{op} {name}: max |diff| {diff.max() if diff.size else 0:.3e} at {i} "
            f"(got {got[i] if diff.size else None}, want {want[i] if diff.size else None}), "
            f"{int((diff > 0).sum())}/{diff.size} differ")


@pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=lambda s: f"t{s[0]}r{s[1]}")
@pytest.mark.parametrize("name", list(TYPES))
def test_matmul_int8_matches_cpu(name, shape):
    n_tok, rows = shape
    rng = np.random.default_rng(zlib.crc32(f"{name}{shape}".encode()))
    cols = _cols(name)
    w = random_weight(name, rows, cols, rng)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    tid = TYPES[name][0]
    want = _core.matmul(tid, w, cols, x, mode="int8", threads=1)
    got = _core.cuda_matmul(tid, w, cols, x, mode="int8")
    assert got.shape == want.shape
    if TYPES[name][3] is None:  # float weights: float math on both sides
        mag = np.abs(x.astype(np.float64)) @ np.abs(quants.dequantize(w, name, (rows, cols))).T
        assert np.all(np.abs(got - want) <= 1e-5 * mag + 1e-30), _report("matmul(int8->float)", name, got, want)
        return
    check_int8("matmul(int8)", name, got, want)


def check_int8(op: str, name: str, got: np.ndarray, want: np.ndarray) -> None:
    same = np.mean(got.view(np.uint32) == want.view(np.uint32))
    scale = np.abs(want).max(axis=1, keepdims=True) + 1e-30
    assert same >= 0.9 and np.all(np.abs(got - want) <= 2e-3 * scale), \
        _report(op, name, got, want) + f"; bit-identical {same:.4%}"


@pytest.mark.parametrize("name", list(TYPES))
def test_matmul_float_matches_cpu(name):
    rng = np.random.default_rng(len(name) * 7919)
    cols, rows, n_tok = _cols(name), 23, 10
    w = random_weight(name, rows, cols, rng)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    tid = TYPES[name][0]
    want = _core.matmul(tid, w, cols, x, mode="float", threads=1)
    got = _core.cuda_matmul(tid, w, cols, x, mode="float")
    mag = np.abs(x.astype(np.float64)) @ np.abs(quants.dequantize(w, name, (rows, cols))).T
    assert np.all(np.abs(got - want) <= 1e-5 * mag + 1e-30), _report("matmul(float)", name, got, want)


def test_matmul_long_rows_and_many_rows():
    """Rows of 14336 Q8_0 columns (448 blocks: the shared-memory sizing) and 70000 output rows."""
    rng = np.random.default_rng(5)
    for name, rows, cols, n_tok in (("Q8_0", 7, 14336, 12), ("PTQ1_0", 70000, 128, 2)):
        w = random_weight(name, rows, cols, rng)
        x = rng.standard_normal((n_tok, cols)).astype(np.float32)
        want = _core.matmul(TYPES[name][0], w, cols, x, mode="int8", threads=2)
        got = _core.cuda_matmul(TYPES[name][0], w, cols, x, mode="int8")
        check_int8("matmul(int8, big)", name, got, want)


def test_matmul_zero_and_nonfinite_activations():
    rng = np.random.default_rng(9)
    w = random_weight("PTQ1_0", 8, 256, rng)
    x = np.zeros((3, 256), np.float32)
    x[1] = rng.standard_normal(256)
    x[2, 5] = np.inf
    got = _core.cuda_matmul(143, w, 256, x, mode="int8")
    want = _core.matmul(143, w, 256, x, mode="int8", threads=1)
    assert np.all(got[0] == 0) and np.all(np.isnan(got[2])) and np.all(np.isnan(want[2]))
    check_int8("matmul(int8, zero row)", "PTQ1_0", got[1:2], want[1:2])


@pytest.mark.parametrize("name", list(TYPES))
def test_get_rows_bit_identical(name):
    rng = np.random.default_rng(3 + len(name))
    cols, rows = _cols(name), 50
    w = random_weight(name, rows, cols, rng)
    ids = np.array([0, 49, 7, 7, 23], np.int32)
    want = _core.get_rows(TYPES[name][0], w, cols, ids)
    got = _core.cuda_get_rows(TYPES[name][0], w, cols, ids)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), _report("get_rows", name, got, want)
    with pytest.raises(_core.BonsaiError, match="outside"):
        _core.cuda_get_rows(TYPES[name][0], w, cols, np.array([50], np.int32))


def test_rms_norm():
    rng = np.random.default_rng(11)
    for n in (64, 896, 5120):
        x = (rng.standard_normal((7, n)) * 3).astype(np.float32)
        w = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        x64 = x.astype(np.float64)
        want = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + 1e-6) * w
        got = _core.cuda_rms_norm(x, w, 1e-6)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6), _report("rms_norm", f"n={n}", got, want)


def _rope_ref(x, pos, n_head, n_rot, neox, theta, freq_scale, ff):
    n, width = x.shape
    hd = width // n_head
    half = n_rot // 2
    inv = theta ** (-2.0 * np.arange(half) / n_rot)
    if ff is not None:
        inv = inv / ff
    ang = pos[:, None].astype(np.float64) * freq_scale * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    h = x.astype(np.float64).reshape(n, n_head, hd).copy()
    if neox:
        a, b = h[..., :half].copy(), h[..., half:n_rot].copy()
        h[..., :half], h[..., half:n_rot] = a * c - b * s, a * s + b * c
    else:
        a, b = h[..., 0:n_rot:2].copy(), h[..., 1:n_rot:2].copy()
        h[..., 0:n_rot:2], h[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
    return h.reshape(n, width)


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("variant", ["plain", "partial", "factors", "linear"])
def test_rope(neox, variant):
    rng = np.random.default_rng(13)
    n_head, hd = 4, 64
    n_rot = 32 if variant == "partial" else hd
    ff = (1 + np.arange(n_rot // 2) * 0.25).astype(np.float32) if variant == "factors" else None
    fs = 0.25 if variant == "linear" else 1.0
    x = rng.standard_normal((6, n_head * hd)).astype(np.float32)
    pos = np.array([0, 1, 5, 100, 2047, 30000], np.int32)
    got = _core.cuda_rope(x, pos, n_head, n_rot, neox, 10000.0, fs, ff)
    want = _rope_ref(x, pos, n_head, n_rot, neox, 10000.0, fs, ff)
    assert np.allclose(got, want, rtol=1e-5, atol=2e-5), _report("rope", f"{variant} neox={neox}", got, want)


def test_swiglu():
    rng = np.random.default_rng(17)
    g = (rng.standard_normal(10000) * 4).astype(np.float32)
    u = rng.standard_normal(10000).astype(np.float32)
    got = _core.cuda_swiglu(g, u)
    g64 = g.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * u
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), _report("swiglu", "f32", got, want)


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_store_kv_bit_identical(kv):
    rng = np.random.default_rng(19)
    rows = (rng.standard_normal((5, 128)) * 2).astype(np.float32)
    rows[1, :32] = 0.0                      # an all-zero Q8_0 block
    got = _core.cuda_store_kv(rows, kv)
    tid = 1 if kv == "f16" else 8
    want = _core.quantize(tid, rows)
    assert np.array_equal(got, want.reshape(got.shape)), f"store_kv {kv}: {(got != want.reshape(got.shape)).sum()} bytes differ"


def _attention_ref(q, pos, mask, k, v, cpos, cseq, n_head, n_head_kv, scale):
    n, hd = q.shape[0], q.shape[1] // n_head
    rep = n_head // n_head_kv
    out = np.zeros((n, n_head * hd))
    for t in range(n):
        vis = ((cseq & mask[t]) != 0) & (cpos <= pos[t])
        for h in range(n_head):
            g = h // rep
            if not vis.any():
                continue
            kk = k[vis, g * hd:(g + 1) * hd]
            vv = v[vis, g * hd:(g + 1) * hd]
            s = kk @ q[t, h * hd:(h + 1) * hd].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h * hd:(h + 1) * hd] = (p / p.sum()) @ vv
    return out


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_attention_multi_sequence(kv, hd):
    rng = np.random.default_rng(23 + hd)
    n_head, n_head_kv, cells = 4, 2, 40
    k = rng.standard_normal((cells, n_head_kv * hd)).astype(np.float32)
    v = rng.standard_normal((cells, n_head_kv * hd)).astype(np.float32)
    cpos = np.concatenate([np.arange(20), np.arange(20)]).astype(np.int32)      # two sequences
    cseq = np.array([1] * 20 + [2] * 20, np.uint64)
    cseq[:5] |= np.uint64(2)                                                 # a shared prefix
    q = rng.standard_normal((5, n_head * hd)).astype(np.float32)
    pos = np.array([0, 7, 19, 3, 19], np.int32)
    mask = np.array([1, 1, 1, 2, 2], np.uint64)
    scale = 1 / np.sqrt(hd)
    got = _core.cuda_attention(q, pos, mask, k, v, cpos, cseq, kv, kv, n_head, n_head_kv, scale)
    # the reference reads the cache rows exactly as the GPU stored them (checked on their own above)
    kd = quants.dequantize(_core.cuda_store_kv(k, kv), kv.upper(), k.shape).astype(np.float64)
    vd = quants.dequantize(_core.cuda_store_kv(v, kv), kv.upper(), v.shape).astype(np.float64)
    want = _attention_ref(q, pos, mask, kd, vd, cpos, cseq, n_head, n_head_kv, scale)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5), _report("attention", f"{kv} hd={hd}", got, want)


def test_attention_nothing_visible_gives_zeros():
    q = np.ones((1, 64), np.float32)
    k = np.ones((3, 64), np.float32)
    got = _core.cuda_attention(q, np.array([0], np.int32), np.array([4], np.uint64), k, k,
                               np.array([0, 1, 2], np.int32), np.array([1, 1, 2], np.uint64))
    assert np.all(got == 0)
