"""Float64 numpy references of qwen35's Gated DeltaNet ops (SPEC §6a), written from the recurrence
as transformers states it (modeling_qwen3_5: causal_conv1d_update, l2norm, the recurrent gated
delta rule, Qwen3_5RMSNormGated), one token at a time. The engine's CPU ops and their CUDA twins are
checked against these.

Layouts follow the engine: conv weights transposed [kernel][n_ch], conv state [kernel-1][n_ch]
(oldest first), delta state [n_v_heads][dv][dk]; V head h reads K head h % n_k_heads.
"""

from __future__ import annotations

import numpy as np


def silu(x):
    return x / (1.0 + np.exp(-x))


def conv1d_silu_ref(x, w_t, state):
    """x [T, C], w_t [K, C], state [K-1, C] -> (out [T, C], new state)."""
    x = np.asarray(x, np.float64)
    w_t = np.asarray(w_t, np.float64)
    hist = np.asarray(state, np.float64).copy()
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        window = np.concatenate([hist, x[t:t + 1]], axis=0)  # [K, C]
        out[t] = silu((window * w_t).sum(axis=0))
        hist = window[1:]
    return out, hist


def l2_norm_ref(x, eps=1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + eps)


def softplus(u):
    return np.where(u > 20.0, u, np.log1p(np.exp(np.minimum(u, 20.0))))


def gdn_gates_ref(alpha, beta_logit, dt_bias, ssm_a):
    """alpha, beta_logit [T, H] -> (g [T, H], beta [T, H])."""
    alpha = np.asarray(alpha, np.float64)
    g = np.asarray(ssm_a, np.float64) * softplus(alpha + np.asarray(dt_bias, np.float64))
    beta = 1.0 / (1.0 + np.exp(-np.asarray(beta_logit, np.float64)))
    return g, beta


def delta_rule_ref(q, k, v, g, beta, state, scale=None):
    """q, k [T, HK, dk] (L2-normed), v [T, HV, dv], g, beta [T, HV], state [HV, dv, dk]
    -> (out [T, HV, dv], new state)."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    S = np.asarray(state, np.float64).copy()
    T, HK, dk = k.shape
    HV, dv = v.shape[1], v.shape[2]
    if scale is None:
        scale = 1.0 / np.sqrt(dk)
    out = np.empty((T, HV, dv))
    for t in range(T):
        for h in range(HV):
            kh = h % HK
            S[h] *= np.exp(g[t, h])
            delta = beta[t, h] * (v[t, h] - S[h] @ k[t, kh])
            S[h] += np.outer(delta, k[t, kh])
            out[t, h] = scale * (S[h] @ q[t, kh])
    return out, S


def rms_norm_gated_ref(o, w, z, eps):
    o = np.asarray(o, np.float64)
    n = o / np.sqrt((o * o).mean(axis=-1, keepdims=True) + eps)
    return n * np.asarray(w, np.float64) * silu(np.asarray(z, np.float64))


def sigmoid_mul_ref(x, gate):
    return np.asarray(x, np.float64) / (1.0 + np.exp(-np.asarray(gate, np.float64)))
