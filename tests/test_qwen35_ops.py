"""qwen35's Gated DeltaNet ops on the CPU against float64 numpy references (tests/qwen35_reference.py):
the conv1d step with carried state, L2 norm, the gates, the gated delta rule (one token at a time
and whole prompts, several sequences interleaved in one chunk, threads), the gated output norm and
the attention output gate."""

from __future__ import annotations

import numpy as np
import pytest

from qwen35_reference import (conv1d_silu_ref, delta_rule_ref, gdn_gates_ref, l2_norm_ref, rms_norm_gated_ref,
                              sigmoid_mul_ref)

core = pytest.importorskip("bonsai_runner._core")

RTOL = 2e-5


def close(got, want, tol=RTOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    if want.size == 0:
        return
    scale = max(np.abs(want).max(), 1e-30)
    assert np.abs(got - want).max() <= tol * scale, np.abs(got - want).max() / scale


@pytest.mark.parametrize("kernel", [1, 2, 4])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv1d_silu_matches_reference_and_carries_state(kernel, threads):
    rng = np.random.default_rng(kernel)
    T, C = 7, 200  # C not a multiple of the 64-channel blocks
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((kernel, C)).astype(np.float32)
    state = rng.standard_normal((1, kernel - 1, C)).astype(np.float32)
    out, st = core.gdn_conv1d_silu(x, w, state, threads=threads)
    ref, ref_st = conv1d_silu_ref(x, w, state[0])
    close(out, ref)
    close(st[0], ref_st, 0)
    # token by token gives the same as the whole prompt
    s = state.copy()
    for t in range(T):
        o, s = core.gdn_conv1d_silu(x[t:t + 1], w, s)
        close(o[0], ref[t])


def test_conv1d_interleaved_sequences_use_their_own_state():
    rng = np.random.default_rng(1)
    T, C, K = 8, 24, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((K, C)).astype(np.float32)
    states = rng.standard_normal((3, K - 1, C)).astype(np.float32)
    slots = np.array([0, 2, 0, 1, 2, 2, 0, 1], np.int32)
    out, st = core.gdn_conv1d_silu(x, w, states, slots=slots, threads=2)
    for s in range(3):
        rows = np.flatnonzero(slots == s)
        ref, ref_st = conv1d_silu_ref(x[rows], w, states[s])
        close(out[rows], ref)
        close(st[s], ref_st, 0)


def test_l2_norm_and_gates():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 33)).astype(np.float32)
    close(core.l2_norm_rows(x), l2_norm_ref(x))
    tiny = np.full((1, 8), 1e-5, np.float32)  # eps dominates: not a unit vector
    close(core.l2_norm_rows(tiny), l2_norm_ref(tiny))
    alpha = rng.standard_normal((6, 4)).astype(np.float32) * 10  # softplus past its linear switch
    beta = rng.standard_normal((6, 4)).astype(np.float32) * 3
    dt = rng.standard_normal(4).astype(np.float32)
    a = -np.exp(rng.standard_normal(4)).astype(np.float32)
    g, b = core.gdn_gates(alpha, beta, dt, a)
    g_ref, b_ref = gdn_gates_ref(alpha, beta, dt, a)
    close(g, g_ref)
    close(b, b_ref)


def _delta_inputs(rng, T, hk, hv, dk, dv):
    q = l2_norm_ref(rng.standard_normal((T, hk, dk)))
    k = l2_norm_ref(rng.standard_normal((T, hk, dk)))
    v = rng.standard_normal((T, hv, dv))
    qkv = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1).astype(np.float32)
    g = -np.abs(rng.standard_normal((T, hv))).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (T, hv)).astype(np.float32)
    return q, k, v, qkv, g, beta


@pytest.mark.parametrize("hk,hv,dk,dv", [(1, 1, 16, 16), (2, 4, 16, 8), (2, 6, 128, 128), (3, 3, 20, 12)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gated_delta_rule_matches_recurrence(hk, hv, dk, dv, threads):
    rng = np.random.default_rng(dk + hv)
    T = 9
    q, k, v, qkv, g, beta = _delta_inputs(rng, T, hk, hv, dk, dv)
    state = (rng.standard_normal((1, hv, dv, dk)) * 0.1).astype(np.float32)
    out, st = core.gated_delta_rule(qkv, g, beta, state, hk, hv, dk, dv, threads=threads)
    ref, ref_st = delta_rule_ref(q, k, v, g, beta, state[0])
    close(out, ref.reshape(T, -1), 1e-4)
    close(st[0], ref_st, 1e-4)
    # one token at a time (decode) reaches the same outputs and state as the whole prompt
    s = state.copy()
    for t in range(T):
        o, s = core.gated_delta_rule(qkv[t:t + 1], g[t:t + 1], beta[t:t + 1], s, hk, hv, dk, dv)
        close(o[0], ref[t].reshape(-1), 1e-4)
    close(s[0], ref_st, 1e-4)


def test_gated_delta_rule_interleaved_sequences_and_qkv_stride():
    rng = np.random.default_rng(7)
    T, hk, hv, dk, dv = 10, 2, 4, 16, 16
    q, k, v, qkv, g, beta = _delta_inputs(rng, T, hk, hv, dk, dv)
    padded = np.concatenate([qkv, rng.standard_normal((T, 5)).astype(np.float32)], axis=1)  # row stride > q|k|v
    states = (rng.standard_normal((2, hv, dv, dk)) * 0.1).astype(np.float32)
    slots = np.array([1, 0, 0, 1, 1, 0, 1, 0, 0, 1], np.int32)
    out, st = core.gated_delta_rule(padded, g, beta, states, hk, hv, dk, dv, slots=slots, threads=2)
    for s in range(2):
        rows = np.flatnonzero(slots == s)
        ref, ref_st = delta_rule_ref(q[rows], k[rows], v[rows], g[rows], beta[rows], states[s])
        close(out[rows], ref.reshape(len(rows), -1), 1e-4)
        close(st[s], ref_st, 1e-4)


def test_gated_output_norm_and_attention_gate():
    rng = np.random.default_rng(3)
    o = rng.standard_normal((6, 24)).astype(np.float32)
    z = rng.standard_normal((6, 24)).astype(np.float32) * 4
    w = rng.standard_normal(24).astype(np.float32)
    close(core.rms_norm_gated(o, w, z, 1e-6), rms_norm_gated_ref(o, w, z, 1e-6))
    x = rng.standard_normal(50).astype(np.float32)
    gate = rng.standard_normal(50).astype(np.float32) * 5
    close(core.sigmoid_mul(x, gate), sigmoid_mul_ref(x, gate))


def test_bad_shapes_are_one_clear_error():
    with pytest.raises(core.BonsaiError, match="must agree"):
        core.gdn_conv1d_silu(np.zeros((2, 8), np.float32), np.zeros((4, 9), np.float32), np.zeros((1, 3, 8), np.float32))
    with pytest.raises(core.BonsaiError, match="outside the states"):
        core.gdn_conv1d_silu(np.zeros((2, 8), np.float32), np.zeros((4, 8), np.float32),
                             np.zeros((1, 3, 8), np.float32), slots=np.array([0, 1], np.int32))
    with pytest.raises(core.BonsaiError, match="invalid arguments"):  # 3 V heads on 2 K heads
        core.gated_delta_rule(np.zeros((1, 4 * 8 + 3 * 8), np.float32), np.zeros((1, 3), np.float32),
                              np.zeros((1, 3), np.float32), np.zeros((1, 3, 8, 8), np.float32), 2, 3, 8, 8)
