"""CUDA twins of qwen35's Gated DeltaNet ops (cpp/backends/cuda/gated_delta.cu) against the float64
references of tests/qwen35_reference.py and against the CPU ops (`pytest -m cuda`; skipped without a
BONSAI_CUDA=ON build and a GPU, by conftest.py).

Cases cover single-token decode, prefill chunks, chunks that interleave several sequences' state
slots (the reference runs each sequence on its own, which is what interleaving must equal), head
dims 128, 16 and odd ones, and V heads sharing K heads (n_v_heads = 4, n_k_heads = 2). The host
wrappers place the state slots a few floats apart on the device and fail when a kernel writes into
that gap.

Expected agreement: conv states are copies of inputs (bit-identical); conv, l2 norm, gates, the
gated norm and sigmoid_mul are one rounding chain per value (relative ~1e-6, tested at 1e-5 with a
small absolute floor); the delta rule sums dk products per row in another order than the CPU and
carries that through the tokens (~2e-7 of the largest value in a float32 numpy run of these cases),
tested at 1e-5 of the largest output / state value of the case.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from bonsai_runner import _core
from qwen35_reference import (conv1d_silu_ref, delta_rule_ref, gdn_gates_ref, l2_norm_ref,
                              rms_norm_gated_ref, sigmoid_mul_ref)

pytestmark = pytest.mark.cuda


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _close(op: str, got, want, rtol: float, atol: float) -> None:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{op}: shape {got.shape} != {want.shape}"
    diff = np.abs(got - want)
    bad = diff > atol + rtol * np.abs(want)
    if bad.any():
        i = np.unravel_index(int(np.argmax(diff - rtol * np.abs(want))), diff.shape)
        pytest.fail(f"{op}: {int(bad.sum())}/{diff.size} outside tolerance; max |diff| {diff.max():.3e}, "
                    f"worst at {i}: got {got[i]!r}, want {want[i]!r}")


def _per_slot(run, slots, state, *per_token):
    """Runs `run(state_of_slot, *rows_of_that_slot) -> (out, new_state)` once per sequence."""
    new_state = np.asarray(state, np.float64).copy()
    outs = {}
    for s in np.unique(slots):
        idx = np.nonzero(slots == s)[0]
        outs[s] = (idx, *run(state[s], *(a[idx] for a in per_token)))
    out = np.empty((len(slots),) + outs[slots[0]][1].shape[1:])
    for s, (idx, o, st) in outs.items():
        out[idx] = o
        new_state[s] = st
    return out, new_state


# --- conv1d + SiLU -------------------------------------------------------------------------------

# (n_tokens, n_ch, kernel, n_slots, slot pattern)
CONV_CASES = [
    (1, 100, 4, 2, "last"),          # decode, one sequence in slot 1
    (19, 320, 4, 1, "one"),          # prefill chunk
    (23, 1000, 4, 3, "random"),      # several blocks of channels, interleaved sequences
    (6, 33, 2, 6, "distinct"),       # parallel decode: one token per sequence, odd channel count
    (11, 64, 3, 2, "runs"),          # two sequences in runs
]


def _slots(pattern: str, n_tokens: int, n_slots: int, rng) -> np.ndarray:
    if pattern == "one":
        s = np.zeros(n_tokens)
    elif pattern == "last":
        s = np.full(n_tokens, n_slots - 1)
    elif pattern == "random":
        s = rng.integers(0, n_slots, n_tokens)
    elif pattern == "distinct":
        s = rng.permutation(n_slots)[:n_tokens]
    else:  # runs
        s = (np.arange(n_tokens) * n_slots // n_tokens)[::-1]
    return np.ascontiguousarray(s, np.int32)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"t{c[0]}c{c[1]}k{c[2]}-{c[4]}")
def test_conv1d_silu(case):
    n_tok, n_ch, kernel, n_slots, pattern = case
    rng = _rng("conv", case)
    x = rng.standard_normal((n_tok, n_ch)).astype(np.float32)
    w_t = (0.5 * rng.standard_normal((kernel, n_ch))).astype(np.float32)
    state = rng.standard_normal((n_slots, kernel - 1, n_ch)).astype(np.float32)
    slots = _slots(pattern, n_tok, n_slots, rng)
    want, want_state = _per_slot(lambda st, xs: conv1d_silu_ref(xs, w_t, st), slots, state, x)
    got, got_state = _core.cuda_gdn_conv1d_silu(x, w_t, state, slots)
    _close("conv1d_silu vs reference", got, want, 1e-5, 1e-6)
    assert np.array_equal(got_state, want_state.astype(np.float32)), "conv state differs from the reference"
    cpu, cpu_state = _core.gdn_conv1d_silu(x, w_t, state, slots)
    _close("conv1d_silu vs CPU", got, cpu, 1e-5, 1e-6)
    assert np.array_equal(got_state, cpu_state), "conv state differs from the CPU's"


# --- l2 norm, gates, gated norm, sigmoid_mul -----------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 128), (24, 128), (7, 16), (5, 300)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_l2_norm_rows(shape):
    rng = _rng("l2", shape)
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 10.0, (shape[0], 1))).astype(np.float32)
    got = _core.cuda_l2_norm_rows(x, 1e-6)
    _close("l2_norm_rows vs reference", got, l2_norm_ref(x, 1e-6), 1e-5, 1e-7)
    _close("l2_norm_rows vs CPU", got, _core.l2_norm_rows(x, 1e-6), 1e-5, 1e-7)


@pytest.mark.parametrize("shape", [(1, 4), (37, 48), (5, 3)], ids=lambda s: f"t{s[0]}h{s[1]}")
def test_gdn_gates(shape):
    n_tok, n_heads = shape
    rng = _rng("gates", shape)
    alpha = (4.0 * rng.standard_normal(shape)).astype(np.float32)
    alpha.flat[:: 5] = rng.uniform(15.0, 40.0, alpha.flat[:: 5].shape)  # around and past softplus' cut at 20
    alpha.flat[1:: 7] = rng.uniform(-40.0, -15.0, alpha.flat[1:: 7].shape)
    beta_logit = (3.0 * rng.standard_normal(shape)).astype(np.float32)
    dt_bias = rng.standard_normal(n_heads).astype(np.float32)
    ssm_a = (-np.exp(rng.uniform(-1.0, 1.0, n_heads))).astype(np.float32)
    g, beta = _core.cuda_gdn_gates(alpha, beta_logit, dt_bias, ssm_a)
    want_g, want_beta = gdn_gates_ref(alpha, beta_logit, dt_bias, ssm_a)
    _close("gdn_gates g vs reference", g, want_g, 1e-5, 1e-30)
    _close("gdn_gates beta vs reference", beta, want_beta, 1e-5, 1e-30)
    cpu_g, cpu_beta = _core.gdn_gates(alpha, beta_logit, dt_bias, ssm_a)
    _close("gdn_gates g vs CPU", g, cpu_g, 1e-5, 1e-30)
    _close("gdn_gates beta vs CPU", beta, cpu_beta, 1e-5, 1e-30)


@pytest.mark.parametrize("shape", [(1, 128), (40, 128), (9, 16), (3, 200)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_rms_norm_gated(shape):
    rng = _rng("rmsg", shape)
    o = (rng.standard_normal(shape) * rng.uniform(0.01, 10.0, (shape[0], 1))).astype(np.float32)
    z = (2.0 * rng.standard_normal(shape)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, shape[1]).astype(np.float32)
    got = _core.cuda_rms_norm_gated(o, w, z, 1e-6)
    _close("rms_norm_gated vs reference", got, rms_norm_gated_ref(o, w, z, 1e-6), 1e-5, 1e-6)
    _close("rms_norm_gated vs CPU", got, _core.rms_norm_gated(o, w, z, 1e-6), 1e-5, 1e-6)


@pytest.mark.parametrize("n", [1, 1000, 4 * 256 * 3 + 5])
def test_sigmoid_mul(n):
    rng = _rng("sigmul", n)
    x = rng.standard_normal(n).astype(np.float32)
    gate = (4.0 * rng.standard_normal(n)).astype(np.float32)
    got = _core.cuda_sigmoid_mul(x, gate)
    _close("sigmoid_mul vs reference", got, sigmoid_mul_ref(x, gate), 1e-5, 1e-30)
    _close("sigmoid_mul vs CPU", got, _core.sigmoid_mul(x, gate), 1e-5, 1e-30)


# --- the gated delta rule ------------------------------------------------------------------------

# (n_tokens, n_k_heads, n_v_heads, dk, dv, n_slots, slot pattern, extra qkv columns, decay range)
DELTA_CASES = [
    (1, 2, 4, 128, 128, 2, "last", 0, "typical"),       # decode
    (23, 2, 4, 128, 128, 1, "one", 0, "typical"),       # prefill chunk
    (30, 2, 4, 128, 128, 3, "random", 0, "slow"),       # interleaved sequences, decay near 1
    (5, 2, 4, 128, 128, 6, "distinct", 0, "typical"),   # parallel decode
    (17, 2, 4, 16, 16, 3, "random", 0, "typical"),      # small heads: lanes past dk idle
    (9, 1, 3, 40, 24, 2, "runs", 7, "typical"),         # odd dims, dk != dv, padded qkv rows
    (12, 4, 4, 64, 64, 2, "random", 0, "slow"),         # one V head per K head
]


def _delta_inputs(case):
    n_tok, hk, hv, dk, dv, n_slots, pattern, extra, decay = case
    rng = _rng("delta", case)
    q = l2_norm_ref(rng.standard_normal((n_tok, hk, dk))).astype(np.float32)
    k = l2_norm_ref(rng.standard_normal((n_tok, hk, dk))).astype(np.float32)
    v = rng.standard_normal((n_tok, hv, dv)).astype(np.float32)
    qkv = np.concatenate([q.reshape(n_tok, -1), k.reshape(n_tok, -1), v.reshape(n_tok, -1),
                          rng.standard_normal((n_tok, extra))], axis=1).astype(np.float32)
    lo, hi = (-3.0, -0.05) if decay == "typical" else (-0.02, -1e-4)
    g = rng.uniform(lo, hi, (n_tok, hv)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (n_tok, hv)).astype(np.float32)
    state = (0.3 * rng.standard_normal((n_slots, hv, dv, dk))).astype(np.float32)
    slots = _slots(pattern, n_tok, n_slots, rng)
    return q, k, v, qkv, g, beta, state, slots


@pytest.mark.parametrize("case", DELTA_CASES,
                         ids=lambda c: f"t{c[0]}k{c[1]}v{c[2]}d{c[3]}x{c[4]}-{c[6]}-{c[8]}")
def test_gated_delta_rule(case):
    n_tok, hk, hv, dk, dv = case[:5]
    q, k, v, qkv, g, beta, state, slots = _delta_inputs(case)
    scale = 1.0 / np.sqrt(dk)
    want, want_state = _per_slot(lambda st, *rows: delta_rule_ref(*rows, st, scale), slots, state, q, k, v, g, beta)
    want = want.reshape(n_tok, hv * dv)
    got, got_state = _core.cuda_gated_delta_rule(qkv, g, beta, state, hk, hv, dk, dv, slots)
    assert got.shape == (n_tok, hv * dv) and got_state.shape == state.shape
    out_tol, state_tol = 1e-5 * np.abs(want).max(), 1e-5 * np.abs(want_state).max()
    _close("gated_delta_rule out vs reference", got, want, 0.0, out_tol)
    _close("gated_delta_rule state vs reference", got_state, want_state, 0.0, state_tol)
    untouched = np.setdiff1d(np.arange(state.shape[0]), slots)
    assert np.array_equal(got_state[untouched], state[untouched]), "a slot no token uses changed"
    cpu, cpu_state = _core.gated_delta_rule(qkv, g, beta, state, hk, hv, dk, dv, slots)
    _close("gated_delta_rule out vs CPU", got, cpu, 0.0, out_tol)
    _close("gated_delta_rule state vs CPU", got_state, cpu_state, 0.0, state_tol)


def test_default_slot_and_errors():
    case = DELTA_CASES[4]
    _, hk, hv, dk, dv = case[:5]
    _, _, _, qkv, g, beta, state, slots = _delta_inputs(case)
    zeros = np.zeros_like(slots)
    a, sa = _core.cuda_gated_delta_rule(qkv, g, beta, state, hk, hv, dk, dv)
    b, sb = _core.cuda_gated_delta_rule(qkv, g, beta, state, hk, hv, dk, dv, zeros)
    assert np.array_equal(a, b) and np.array_equal(sa, sb)
    x = np.ones((3, 8), np.float32)
    w_t = np.ones((4, 8), np.float32)
    conv_state = np.ones((2, 3, 8), np.float32)
    a, sa = _core.cuda_gdn_conv1d_silu(x, w_t, conv_state)
    b, sb = _core.cuda_gdn_conv1d_silu(x, w_t, conv_state, np.zeros(3, np.int32))
    assert np.array_equal(a, b) and np.array_equal(sa, sb)
    assert np.array_equal(sa[1], conv_state[1])
    bad = slots.copy()
    bad[-1] = state.shape[0]
    with pytest.raises(_core.BonsaiError, match="slot"):
        _core.cuda_gated_delta_rule(qkv, g, beta, state, hk, hv, dk, dv, bad)
    with pytest.raises(_core.BonsaiError, match="slot"):
        _core.cuda_gdn_conv1d_silu(x, w_t, conv_state, np.array([0, -1, 1], np.int32))
    with pytest.raises(_core.BonsaiError):
        _core.cuda_gated_delta_rule(qkv[:, :-1], g, beta, state, hk, hv, dk, dv, slots)  # row too short for q|k|v
    with pytest.raises(_core.BonsaiError):
        _core.cuda_gated_delta_rule(qkv, g, beta, state, 3, hv, dk, dv, slots)  # 4 V heads over 3 K heads
