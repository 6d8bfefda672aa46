"""Scale refinement: Adam on the log-scales of a block's quantized layers against the block output.

With the codes T fixed, each quantized weight is W(theta) = T * (sign0 * exp(theta)) per group
(sign0: the sign of the initial scale; groups whose scale is 0 stay 0). The loss is the block's
relative output error on the calibration hidden states x (the quantized-model inputs):

    L = sum (block(x; W(theta)) - block(x; W_float))^2 / sum (block(x; W_float) - x)^2

i.e. the error relative to what the block adds to the residual stream. Gradients are analytic:
`block_backward` runs the chain rule back through the down/gate/up projections, the SwiGLU, the
second RMSNorm, o_proj, causal softmax attention with grouped KV heads, rope (its transpose is a
rotation by the opposite angle), the qwen3 per-head RMSNorm and the q/k/v projections, giving
dL/dW for every linear weight; dL/dtheta[r, g] = sum over the group of dL/dW * T * s.
(tests/test_quantize.py checks the gradients against finite differences in float64.)

Each step uses a batch of `batch` calibration sequences drawn with `seed` (deterministic); the
loss on all sequences is reported before and after every step. Scales are rounded to float16 at
the end, and kept only if that lowers the full-set loss.
"""

from __future__ import annotations

import numpy as np

from .block_forward import block_forward, forward_batched, rotate_half_t


def _rms_back(dy: np.ndarray, n: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Gradient of y = x * r (r = 1/rms(x)) given n = x * r: r * (dy - n * mean(dy * n))."""
    return r * (dy - n * np.mean(dy * n, axis=-1, keepdims=True))


def block_backward(dout: np.ndarray, w: dict, cache: dict, cfg) -> dict[str, np.ndarray]:
    """dL/dW for the block's linear weights given dL/d(output) (see the file header)."""
    B, T, _ = dout.shape
    nh, nkv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    rep = nh // nkv

    def flat(a):
        return a.reshape(B * T, -1)

    grads = {}
    dh = dout
    grads["down"] = flat(dout).T @ flat(cache["m"])
    dm = dout @ w["down"]
    g, u, sg = cache["g"], cache["u"], cache["sg"]
    dg = dm * u * (sg * (1.0 + g * (1.0 - sg)))
    du = dm * g * sg
    f = cache["f"]
    grads["gate"] = flat(dg).T @ flat(f)
    grads["up"] = flat(du).T @ flat(f)
    df = dg @ w["gate"] + du @ w["up"]
    n2 = cache["h"] * cache["r2"]
    dh = dh + _rms_back(df * w["ffn_norm"], n2, cache["r2"])
    att = cache["att"]
    grads["o"] = flat(dh).T @ flat(att)
    datt = (dh @ w["o"]).reshape(B, T, nh, hd).transpose(0, 2, 1, 3)
    p, qh, kh, vh = cache["p"], cache["qh"], cache["kh"], cache["vh"]
    dp = datt @ vh.transpose(0, 1, 3, 2)
    dvh = p.transpose(0, 1, 3, 2) @ datt
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    scale = 1.0 / np.sqrt(hd)
    dqh = (ds @ kh) * scale
    dkh = (ds.transpose(0, 1, 3, 2) @ qh) * scale
    dkr = dkh.reshape(B, nkv, rep, T, hd).sum(axis=2).transpose(0, 2, 1, 3)
    dv = dvh.reshape(B, nkv, rep, T, hd).sum(axis=2).transpose(0, 2, 1, 3)
    dqr = dqh.transpose(0, 2, 1, 3)
    c, s = cache["cos"], cache["sin"]
    dq = dqr * c + rotate_half_t(dqr * s)
    dk = dkr * c + rotate_half_t(dkr * s)
    if cfg.qk_norm:
        dq = _rms_back(dq * w["q_norm"], cache["q_pre"] * cache["rq"], cache["rq"])
        dk = _rms_back(dk * w["k_norm"], cache["k_pre"] * cache["rk"], cache["rk"])
    a = flat(cache["a"])
    grads["q"] = flat(dq).T @ a
    grads["k"] = flat(dk).T @ a
    grads["v"] = flat(dv).T @ a
    return grads


class _Params:
    """Log-scales of the refined layers and the weights they produce."""

    def __init__(self, stored: dict):
        from .gptq import grid

        self.keys = [k for k, (res, _) in stored.items() if not np.all(res.codes == 0)]
        self.stored = stored
        self.group = {k: grid(stored[k][0].tier).group for k in self.keys}
        self.sign, self.theta, self.live = {}, {}, {}
        for k in self.keys:
            s = stored[k][0].scales.astype(np.float64)
            self.live[k] = s != 0
            self.sign[k] = np.where(s < 0, -1.0, 1.0)
            self.theta[k] = np.log(np.where(s != 0, np.abs(s), 1.0))

    def scales(self, k: str) -> np.ndarray:
        return np.where(self.live[k], self.sign[k] * np.exp(self.theta[k]), 0.0)

    def weight(self, k: str, s: np.ndarray | None = None) -> np.ndarray:
        res = self.stored[k][0]
        s = self.scales(k) if s is None else s
        rows, cols = res.codes.shape
        g = self.group[k]
        return (res.codes.reshape(rows, -1, g) * s.reshape(rows, -1, 1)).reshape(rows, cols) \
            .astype(np.float32)


def _loss(x, qw, cfg, target, denom, batch) -> float:
    y = forward_batched(x, qw, cfg, batch)
    return float(((y.astype(np.float64) - target) ** 2).sum() / denom)


def refine_block(x: np.ndarray, w_fp: dict, qw: dict, stored: dict, cfg, steps: int, lr: float,
                 batch: int, seed: int, log=None, target: np.ndarray | None = None) -> dict:
    """Refines the scales of `stored` (key -> (LayerResult, info)) in place; updates qw.

    target: the output to approach (default: the float block on the same inputs x); the
    pipeline passes the float model's own hidden states after this block, so the scales also
    correct the error accumulated in the blocks before."""
    from .ternary_fit import to_fp16

    if target is None:
        target = forward_batched(x, w_fp, cfg, batch)
    target = target.astype(np.float64)
    denom = float(((target - x) ** 2).sum()) or 1.0
    before = _loss(x, qw, cfg, target, denom, batch)
    P = _Params(stored)
    if not P.keys:
        return {"before": before, "after": before, "steps": [], "kept": False}
    m = {k: np.zeros_like(P.theta[k]) for k in P.keys}
    v = {k: np.zeros_like(P.theta[k]) for k in P.keys}
    b1, b2, eps = 0.9, 0.999, 1e-8
    rng = np.random.default_rng(seed)
    history = []
    trial = dict(qw)
    for step in range(1, steps + 1):
        idx = np.sort(rng.choice(x.shape[0], size=min(batch, x.shape[0]), replace=False))
        xb = x[idx]
        for k in P.keys:
            trial[k] = P.weight(k)
        y, cache = block_forward(xb, trial, cfg, keep=True)
        tb = target[idx]
        scale_b = x.shape[0] / len(idx)
        dout = (2.0 * scale_b / denom * (y.astype(np.float64) - tb)).astype(np.float32)
        grads = block_backward(dout, trial, cache, cfg)
        for k in P.keys:
            rows, cols = stored[k][0].codes.shape
            g = P.group[k]
            gw = grads[k].astype(np.float64) * stored[k][0].codes
            gt = gw.reshape(rows, cols // g, g).sum(axis=2) * P.scales(k)
            m[k] = b1 * m[k] + (1 - b1) * gt
            v[k] = b2 * v[k] + (1 - b2) * gt * gt
            mh, vh = m[k] / (1 - b1 ** step), v[k] / (1 - b2 ** step)
            P.theta[k] -= lr * mh / (np.sqrt(vh) + eps)
        for k in P.keys:
            trial[k] = P.weight(k)
        history.append(_loss(x, trial, cfg, target, denom, batch))
        if log:
            log(f"  step {step}/{steps}: block output error {history[-1]:.6f}")
    final = {k: to_fp16(P.scales(k)) for k in P.keys}
    for k in P.keys:
        trial[k] = P.weight(k, final[k].astype(np.float64))
    after = _loss(x, trial, cfg, target, denom, batch)
    kept = after < before
    if kept:
        for k in P.keys:
            stored[k][0].scales = final[k].astype(np.float32)
            qw[k] = trial[k]
    return {"before": before, "after": after if kept else before, "after_trial": after,
            "steps": history, "kept": kept}
