"""CUDA flash attention (cpp/backends/cuda/flash_attention.cu) against a float64 numpy reference
and against the plain CUDA kernel (`pytest -m cuda`; skipped without a BONSAI_CUDA=ON build and a
GPU).

The cache rows are the F16 / Q8_0 values the GPU stores (test_cuda_ops.py checks those bytes),
dequantized by numpy for the reference. Both kernels compute the exact softmax in float32 in
different orders (tiles of cells, split partials merged at the end), so they agree with the
reference and with each other to relative 1e-5 of the output magnitude. The cases cover GQA
ratios 1 / 4 / 8, head sizes 64 / 128 / 256, several sequences with a shared prefix, a prefill
chunk (many query rows, one split) and single-token decode over enough cells that the kernel
splits the cells across blocks (flash-decoding, partials merged by the combine kernel).
"""

from __future__ import annotations

import numpy as np
import pytest

from bonsai_runner import _core, quants
from test_cuda_ops import _attention_ref, _report

pytestmark = pytest.mark.cuda


def _cache(n_cells: int, n_seq: int, shared: int):
    """Cell positions / sequence masks of n_seq sequences filling n_cells, the first `shared`
    cells belonging to every sequence (a shared prompt prefix)."""
    per = n_cells // n_seq
    cpos = np.concatenate([np.arange(per) for _ in range(n_seq)] + [np.arange(n_cells - per * n_seq)])
    cseq = np.concatenate([np.full(per, 1 << s) for s in range(n_seq)] +
                          [np.full(n_cells - per * n_seq, 1)]).astype(np.uint64)
    cseq[:shared] = np.uint64((1 << n_seq) - 1)
    return cpos.astype(np.int32), cseq


def _run(kv, hd, n_head, n_head_kv, n_cells, pos, mask, n_seq, seed):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n_cells, n_head_kv * hd)).astype(np.float32)
    v = rng.standard_normal((n_cells, n_head_kv * hd)).astype(np.float32)
    q = (rng.standard_normal((len(pos), n_head * hd)) * 2).astype(np.float32)
    cpos, cseq = _cache(n_cells, n_seq, shared=min(8, n_cells))
    scale = 1 / np.sqrt(hd)
    pos = np.asarray(pos, np.int32)
    mask = np.asarray(mask, np.uint64)
    args = (q, pos, mask, k, v, cpos, cseq, kv, kv, n_head, n_head_kv, scale)
    flash = _core.cuda_attention(*args, flash=True)
    plain = _core.cuda_attention(*args, flash=False)
    kd = quants.dequantize(_core.cuda_store_kv(k, kv), kv.upper(), k.shape).astype(np.float64)
    vd = quants.dequantize(_core.cuda_store_kv(v, kv), kv.upper(), v.shape).astype(np.float64)
    want = _attention_ref(q, pos, mask, kd, vd, cpos, cseq, n_head, n_head_kv, scale)
    return flash, plain, want


def _check(what, flash, plain, want):
    assert np.all(np.isfinite(flash)), f"{what}: non-finite flash output"
    assert np.allclose(flash, want, rtol=1e-5, atol=1e-5), _report("flash attention", what, flash, want)
    assert np.allclose(flash, plain, rtol=1e-5, atol=1e-5), _report("flash vs plain", what, flash, plain)


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("rep", [1, 4, 8])
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_flash_prefill_chunk(kv, rep, hd):
    """37 query tokens of two sequences over 90 cells (partly their own, causal)."""
    n_head_kv = 2
    n_head = n_head_kv * rep
    pos = list(range(20, 45)) + list(range(33, 45))
    mask = [1] * 25 + [2] * 12
    flash, plain, want = _run(kv, hd, n_head, n_head_kv, 90, pos, mask, 2, seed=hd + rep)
    _check(f"{kv} hd={hd} gqa={rep} prefill", flash, plain, want)


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("rep", [1, 4, 8])
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_flash_decode_split_cells(kv, rep, hd):
    """One query token per sequence (3 sequences) over 1200 cells: the cells are split across
    blocks and the partials merged."""
    n_head_kv = 2
    n_head = n_head_kv * rep
    pos = [399, 250, 399]
    mask = [1, 2, 4]
    flash, plain, want = _run(kv, hd, n_head, n_head_kv, 1200, pos, mask, 3, seed=7 * hd + rep)
    _check(f"{kv} hd={hd} gqa={rep} decode", flash, plain, want)


def test_flash_single_token_long_context_head_256():
    """hd 256 (8-cell tiles), one token over 700 cells of one sequence."""
    flash, plain, want = _run("f16", 256, 4, 1, 700, [699], [1], 1, seed=5)
    _check("f16 hd=256 decode", flash, plain, want)


def test_flash_nothing_visible_gives_zeros():
    q = np.ones((2, 64), np.float32)
    k = np.ones((600, 64), np.float32)
    cpos = np.arange(600, dtype=np.int32)
    cseq = np.ones(600, np.uint64)
    got = _core.cuda_attention(q, np.array([5, 5], np.int32), np.array([2, 4], np.uint64), k, k, cpos, cseq,
                               flash=True)
    assert np.all(got == 0)


def test_flash_rejects_unsupported_head():
    q = np.ones((1, 4 * 300), np.float32)
    k = np.ones((3, 300), np.float32)
    with pytest.raises(_core.BonsaiError, match="head size"):
        _core.cuda_attention(q, np.array([0], np.int32), np.array([1], np.uint64), k, k,
                             np.arange(3, dtype=np.int32), np.ones(3, np.uint64), n_head=4, n_head_kv=1,
                             flash=True)
