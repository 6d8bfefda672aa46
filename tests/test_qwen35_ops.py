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


C = 64  # the engine's default chunk length


def _chunk_inputs(rng, T, hk, dk, decay):
    hv = 2 * hk  # GQA-style: two V heads per K head
    q, k, v, qkv, g, beta = _delta_inputs(rng, T, hk, hv, dk, dk)
    if decay == "weak":
        g = -rng.uniform(0.0, 0.02, (T, hv)).astype(np.float32)  # e^g near 1: the state keeps everything
    else:
        g = -rng.uniform(4.0, 6.0, (T, hv)).astype(np.float32)  # e^g ~ e^-5: exp(G_i - G_j) underflows across a chunk
    return q, k, v, qkv, g, beta, hv


# Tolerance: float32 round-off of sums over dk + chunk terms of bounded size (q, k unit vectors,
# the state update I - beta k k^T is a contraction), about 1e-6 relative; 1e-4 of the output's
# largest magnitude leaves margin for 300 tokens, while a wrong decay factor, a dropped token or a
# missing carried-state term changes outputs by percent.
CHUNK_TOL = 1e-4


@pytest.mark.parametrize("T", [1, C - 1, C, C + 1, 3 * C + 5, 300])
@pytest.mark.parametrize("dk", [64, 128])
@pytest.mark.parametrize("decay", ["weak", "strong"])
def test_chunked_delta_rule_equals_recurrence(T, dk, decay):
    rng = np.random.default_rng(T * 7 + dk + (decay == "weak"))
    hk = 2
    q, k, v, qkv, g, beta, hv = _chunk_inputs(rng, T, hk, dk, decay)
    state = (rng.standard_normal((1, hv, dk, dk)) * 0.3).astype(np.float32)
    ref, ref_st = delta_rule_ref(q, k, v, g, beta, state[0])
    # chunk C (runs >= C chunked, tail by the step) and a single chunk of the whole run (T < C too)
    for chunk in sorted({C, 32, T}):
        out, st = core.gated_delta_rule(qkv, g, beta, state, hk, hv, dk, dk, threads=2, chunk=chunk)
        close(out, ref.reshape(T, -1), CHUNK_TOL)
        close(st[0], ref_st, CHUNK_TOL)
    step_out, step_st = core.gated_delta_rule(qkv, g, beta, state, hk, hv, dk, dk, threads=2, chunk=0)
    close(step_out, ref.reshape(T, -1), CHUNK_TOL)
    close(step_st[0], ref_st, CHUNK_TOL)


def test_chunked_delta_rule_two_sequences_in_one_batch():
    rng = np.random.default_rng(11)
    T, hk, dk = 2 * C + 40, 2, 64
    q, k, v, qkv, g, beta, hv = _chunk_inputs(rng, T, hk, dk, "weak")
    states = (rng.standard_normal((2, hv, dk, dk)) * 0.3).astype(np.float32)
    # slot 1 for C + 10 tokens (one chunk + a stepped tail), slot 0 for C + 5, then slot 1 again
    slots = np.array([1] * (C + 10) + [0] * (C + 5) + [1] * (T - 2 * C - 15), np.int32)
    out, st = core.gated_delta_rule(qkv, g, beta, states, hk, hv, dk, dk, slots=slots, threads=2, chunk=C)
    for s in range(2):
        rows = np.flatnonzero(slots == s)
        ref, ref_st = delta_rule_ref(q[rows], k[rows], v[rows], g[rows], beta[rows], states[s])
        close(out[rows], ref.reshape(len(rows), -1), CHUNK_TOL)
        close(st[s], ref_st, CHUNK_TOL)


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
