"""CPU matmul / get_rows kernels against a numpy float64 reference, on every available path.

Weights are random bytes (every base-3 / 2-bit code pattern, not only canonical ones) with sane
fp16 scales, dequantized by the numpy reference bonsai_runner.quants.dequantize.

INT8 mode: the reference quantizes x per token exactly like the engine (absmax, round half away
from zero) and sums d_b * isum_b in float64, so agreement is ~1e-6 relative; every SIMD path must
be bit-identical to the scalar path. FLOAT mode: reference W_dequant @ x in float64.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from bonsai_runner import _core, quants
from bonsai_runner.errors import BonsaiError

# name: (engine type id, block elements, block bytes, scale byte offset)
TYPES = {
    "F32": (0, 1, 4, None),
    "F16": (1, 1, 2, None),
    "BF16": (30, 1, 2, None),
    "Q8_0": (8, 32, 34, 0),
    "Q4_0": (2, 32, 18, 0),
    "TQ1_0": (34, 256, 54, 52),
    "TQ2_0": (35, 256, 66, 64),
    "Q2_0": (42, 64, 18, 0),
    "Q2_0_G128": (0x1000 + 42, 128, 34, 0),
    "PQ2_0": (142, 128, 34, 0),
    "PTQ1_0": (143, 128, 28, 26),
}
QUANT = [n for n, t in TYPES.items() if t[3] is not None]
PATHS = _core.cpu_paths()


def dequantize(name: str, w: np.ndarray, cols: int) -> np.ndarray:
    return quants.dequantize(w, name, (w.shape[0], cols)).astype(np.float64)


def random_weight(name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    _, be, bb, off = TYPES[name]
    if name == "F32":
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    if name == "F16":
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if name == "BF16":
        f = rng.standard_normal((rows, cols)).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, size=(rows, cols // be, bb), dtype=np.uint8)
    d = (rng.uniform(0.002, 0.05, size=(rows, cols // be)) * rng.choice([-1, 1], size=(rows, cols // be)))
    blocks[..., off:off + 2] = d.astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def quantize_act(x: np.ndarray):
    amax = np.abs(x).max(axis=1).astype(np.float32)
    s = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    v = (x * iscale[:, None]).astype(np.float64)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -127, 127)
    return q, s.astype(np.float64)


def reference(name: str, w: np.ndarray, cols: int, x: np.ndarray, mode: str):
    """Returns (expected, tolerance scale) as float64 arrays (n_tokens, rows)."""
    wd = dequantize(name, w, cols)
    if mode == "float" or TYPES[name][3] is None:
        return x.astype(np.float64) @ wd.T, np.abs(x.astype(np.float64)) @ np.abs(wd).T
    q, s = quantize_act(x)
    return (q @ wd.T) * s[:, None], (np.abs(q) @ np.abs(wd).T) * s[:, None]


def cols_for(name: str) -> int:
    be = TYPES[name][1]
    return 768 if be == 256 else (be * 5 if be > 1 else 200)


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("mode", ["int8", "float"])
@pytest.mark.parametrize("n_tokens", [1, 3, 17])
def test_matmul_matches_reference_on_every_path(name, mode, n_tokens):
    rng = np.random.default_rng(zlib.crc32(f"{name}/{mode}/{n_tokens}".encode()))
    rows, cols = 37, cols_for(name)
    w = random_weight(name, rows, cols, rng)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    x[0, :5] = 0.0
    want, scale = reference(name, w, cols, x, mode)
    tid = TYPES[name][0]
    scalar = _core.matmul(tid, w, cols, x, mode=mode, threads=1, path="scalar")
    for path in PATHS:
        for threads in (1, 2):
            got = _core.matmul(tid, w, cols, x, mode=mode, threads=threads, path=path)
            assert got.shape == (n_tokens, rows) and got.dtype == np.float32
            err = np.abs(got - want) / (scale + 1e-30)
            assert err.max() < 1e-5, (path, threads, err.max())
            if mode == "int8" and TYPES[name][3] is not None:
                assert np.array_equal(got, scalar), f"{path} differs from scalar ({threads} threads)"


@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("n_tokens", [1, 2, 5, 11, 21])
def test_int8_paths_bit_identical_larger(name, n_tokens):
    rng = np.random.default_rng(7)
    be = TYPES[name][1]
    rows, cols = 67, max(be, 64) * (9 if be < 256 else 5)
    w = random_weight(name, rows, cols, rng)
    x = (rng.standard_normal((n_tokens, cols)) * rng.uniform(0.1, 10, size=(n_tokens, 1))).astype(np.float32)
    tid = TYPES[name][0]
    scalar = _core.matmul(tid, w, cols, x, mode="int8", path="scalar")
    want, scale = reference(name, w, cols, x, "int8")
    assert (np.abs(scalar - want) / (scale + 1e-30)).max() < 1e-5
    for path in PATHS:
        for threads in (1, 2, 3):
            got = _core.matmul(tid, w, cols, x, mode="int8", threads=threads, path=path)
            assert np.array_equal(got, scalar), (path, threads)


@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 9])
def test_one_token_few_rows_bit_identical(name, rows):
    # The one-token tiles read 4 consecutive rows: a thread's short last tile is the full tile that
    # ends at its last row, and a weight of fewer than 4 rows runs one row at a time. An odd block
    # count per row puts a one-block unit at every row's end (the edge loads of PTQ1_0 and Q8_0).
    rng = np.random.default_rng(zlib.crc32(f"few/{name}/{rows}".encode()))
    be = TYPES[name][1]
    cols = be * (3 if be < 256 else 1)
    w = random_weight(name, rows, cols, rng)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    tid = TYPES[name][0]
    scalar = _core.matmul(tid, w, cols, x, mode="int8", path="scalar")
    want, scale = reference(name, w, cols, x, "int8")
    assert (np.abs(scalar - want) / (scale + 1e-30)).max() < 1e-5
    for path in PATHS:
        for threads in (1, 2, 3, 4):
            got = _core.matmul(tid, w, cols, x, mode="int8", threads=threads, path=path)
            assert np.array_equal(got, scalar), (path, threads)


@pytest.mark.parametrize("cols", [64, 1077, 2048])
def test_f16_one_token_rows_independent_of_split(cols):
    # One token of F16 weights is dotted row by row (64-element steps, a masked tail): close to the
    # float64 product, and every row's result is the same whatever rows and threads surround it.
    rng = np.random.default_rng(cols)
    rows = 45
    w = random_weight("F16", rows, cols, rng)
    x = (rng.standard_normal((1, cols)) * 3).astype(np.float32)
    want, scale = reference("F16", w, cols, x, "float")
    for path in PATHS:
        one = _core.matmul(1, w, cols, x, mode="float", threads=1, path=path)
        assert (np.abs(one - want) / (scale + 1e-30)).max() < 1e-5, path
        for threads in (2, 3):
            assert np.array_equal(_core.matmul(1, w, cols, x, mode="float", threads=threads, path=path), one)
        for r0, r1 in ((0, 1), (3, 10), (44, 45)):
            part = _core.matmul(1, np.ascontiguousarray(w[r0:r1]), cols, x, mode="float", path=path)
            assert np.array_equal(part[0], one[0, r0:r1]), (path, r0, r1)


def test_zero_activation_row_gives_zero():
    rng = np.random.default_rng(1)
    w = random_weight("PTQ1_0", 8, 256, rng)
    x = np.zeros((2, 256), np.float32)
    for path in PATHS:
        assert not _core.matmul(143, w, 256, x, path=path).any()


def test_default_path_and_paths_listed():
    assert "scalar" in PATHS
    assert _core.cpu_path() in PATHS


@pytest.mark.parametrize("name", list(TYPES))
def test_get_rows(name):
    rng = np.random.default_rng(3)
    rows, cols = 11, cols_for(name)
    w = random_weight(name, rows, cols, rng)
    ids = np.array([3, 0, 10, 3], np.int32)
    got = _core.get_rows(TYPES[name][0], w, cols, ids)
    want = dequantize(name, w, cols)[ids]
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


def test_bad_shapes_raise():
    rng = np.random.default_rng(2)
    w = random_weight("PTQ1_0", 4, 256, rng)
    x = np.ones((1, 256), np.float32)
    with pytest.raises(BonsaiError, match="bytes per row"):
        _core.matmul(142, w, 256, x)  # PQ2_0 rows are 68 bytes, these are 56
    with pytest.raises(BonsaiError, match="multiple of its block size"):
        _core.matmul(143, w[:, :28], 100, x[:, :100])
    with pytest.raises(BonsaiError, match="unsupported weight type"):
        _core.matmul(12, w, 256, x)
    with pytest.raises(BonsaiError, match="x must be"):
        _core.matmul(143, w, 256, np.ones((1, 128), np.float32))
    with pytest.raises(BonsaiError, match="mode"):
        _core.matmul(143, w, 256, x, mode="int4")
    with pytest.raises(BonsaiError, match="unknown CPU path"):
        _core.matmul(143, w, 256, x, path="neon")
    with pytest.raises(BonsaiError, match="threads"):
        _core.matmul(143, w, 256, x, threads=0)
    with pytest.raises(BonsaiError, match="outside"):
        _core.get_rows(143, w, 256, np.array([4], np.int32))
    # Q2_0 g64 data given as the g128 layout of the same id 42: sizes differ, so it is refused.
    w64 = random_weight("Q2_0", 4, 256, rng)
    with pytest.raises(BonsaiError, match="bytes per row"):
        _core.matmul(0x1000 + 42, w64, 256, x)


def test_non_finite_activations_give_nan_row():
    rng = np.random.default_rng(4)
    w = random_weight("PTQ1_0", 8, 256, rng)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[1, 7] = np.inf
    x[2, 100] = np.nan
    for path in PATHS:
        y = _core.matmul(143, w, 256, x, path=path)
        assert np.isfinite(y[0]).all()
        assert np.isnan(y[1]).all() and np.isnan(y[2]).all()


def test_cpu_path_env_var():
    code = "from bonsai_runner import _core; print(_core.cpu_path())"
    env = dict(os.environ, BONSAI_CPU_PATH="scalar")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "scalar"
    env["BONSAI_CPU_PATH"] = "neon"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown CPU path 'neon'" in bad.stderr
