"""The multi-token INT8 matmul (the AVX-512 GEMM of 2 or more tokens) against the scalar kernel.

Every INT8 type must give bit-identical results to the scalar path for any token count (token
tiles of 2..6, one or several), any row count (panels of 32 rows in two halves, partial ones),
column counts that leave a unit partly filled (G = 2 or 4 blocks per unit), 1, 2 and 3 threads
(fewer panels than threads splits token tiles too), and awkward activations (zero rows,
non-finite rows, wide magnitude ranges). The scalar path itself is checked against the float64 reference in
test_matmul.py; here it is the oracle.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from bonsai_runner import _core
from test_matmul import QUANT, TYPES, random_weight, reference

PATHS = [p for p in _core.cpu_paths() if p != "scalar"]


def cols_of(name: str, blocks: int) -> int:
    return TYPES[name][1] * blocks


def check(name: str, rows: int, cols: int, x: np.ndarray, seed: str, threads=(1, 2, 3)) -> None:
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    w = random_weight(name, rows, cols, rng)
    tid = TYPES[name][0]
    want = _core.matmul(tid, w, cols, x, mode="int8", threads=1, path="scalar")
    for path in PATHS:
        for t in threads:
            got = _core.matmul(tid, w, cols, x, mode="int8", threads=t, path=path)
            assert got.shape == want.shape
            assert np.array_equal(got, want, equal_nan=True), (name, path, t, rows, cols, x.shape[0])


@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("n_tokens", [2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 25, 37])
def test_gemm_token_counts(name, n_tokens):
    blocks = 3 if TYPES[name][1] >= 128 else 9  # odd / not a multiple of 4: the last unit is partial
    cols = cols_of(name, blocks)
    rng = np.random.default_rng(n_tokens)
    x = (rng.standard_normal((n_tokens, cols)) * rng.uniform(0.05, 20, size=(n_tokens, 1))).astype(np.float32)
    check(name, 37, cols, x, f"{name}/{n_tokens}")


@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 31, 32, 33, 48, 95])
def test_gemm_row_counts(name, rows):
    cols = cols_of(name, 2 if TYPES[name][1] == 256 else 8)
    x = np.random.default_rng(rows).standard_normal((6, cols)).astype(np.float32)
    check(name, rows, cols, x, f"{name}/rows{rows}")


@pytest.mark.parametrize("name", QUANT)
def test_gemm_long_rows_span_several_chunks(name):
    # more columns than one unpacked chunk of the panel holds (about 24 KiB), plus a partial unit
    be = TYPES[name][1]
    cols = be * (41 if be >= 128 else 161)
    x = np.random.default_rng(5).standard_normal((14, cols)).astype(np.float32)
    check(name, 21, cols, x, f"{name}/long", threads=(1, 2))


@pytest.mark.parametrize("name", ["PTQ1_0", "Q8_0", "Q4_0"])
def test_gemm_special_token_rows(name):
    cols = cols_of(name, 4)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    x[0] = 0.0                      # scale 0: an all-zero output row
    x[3, 5] = np.inf                # non-finite: NaN row, the others untouched
    x[4, 1] = np.nan
    x[6] *= 1e30                    # huge but finite
    x[7] *= 1e-30                   # tiny
    x[8, :] = 0.0
    x[8, 2] = -1.0                  # a single non-zero: q = -127 there
    check(name, 19, cols, x, f"{name}/special")
    y = _core.matmul(TYPES[name][0], random_weight(name, 19, cols, rng), cols, x, mode="int8", threads=2)
    assert not y[0].any() and np.isnan(y[3]).all() and np.isnan(y[4]).all()
    assert np.isfinite(np.delete(y, [3, 4], axis=0)).all()


def test_gemm_matches_float64_reference():
    # end to end (not only against scalar): a prefill-shaped PTQ1_0 product
    name, rows, cols, n_tokens = "PTQ1_0", 40, 640, 30
    rng = np.random.default_rng(3)
    w = random_weight(name, rows, cols, rng)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    want, scale = reference(name, w, cols, x, "int8")
    for path in PATHS:
        got = _core.matmul(TYPES[name][0], w, cols, x, mode="int8", threads=2, path=path)
        assert (np.abs(got - want) / (scale + 1e-30)).max() < 1e-5


@pytest.mark.parametrize("n_tokens", [2, 3, 4, 5, 9, 64, 65])
@pytest.mark.parametrize("cols", [200, 1100])
def test_f16_multi_token_float(n_tokens, cols):
    # F16 weights always use float math; 2..64 tokens take the blocked kernel (4 rows x 4 tokens,
    # columns in chunks of 512, a masked tail): close to the float64 product, independent of the
    # thread split
    rng = np.random.default_rng(n_tokens * 7 + cols)
    rows = 23
    w = random_weight("F16", rows, cols, rng)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    want, scale = reference("F16", w, cols, x, "float")
    for path in _core.cpu_paths():
        one = _core.matmul(1, w, cols, x, mode="float", threads=1, path=path)
        assert (np.abs(one - want) / (scale + 1e-30)).max() < 1e-5, path
        assert np.array_equal(_core.matmul(1, w, cols, x, mode="float", threads=2, path=path), one), path
