"""Sensitivity metrics: per-tensor output similarity and per-block loss increase on held-out text.

Per tensor, from the calibration Hessian H = 2 X^T X of its inputs (no activations kept):
    cosine  = <W X, Q X> / (||W X|| ||Q X||) = tr(W H Q^T) / sqrt(tr(W H W^T) tr(Q H Q^T))
    rel_err = ||(W - Q) X|| / ||W X||
over all calibration tokens and output features (the outputs flattened), biases excluded.

Per block, the loss increase when only that block is quantized: next-token cross-entropy (nats per
token) of the float model on a few held-out sequences, and of the model whose block i alone uses
the quantized weights. Without holding two blocks at once: while block i is being quantized its
quantized output on the held-out float input is stored as branch i ("only block i quantized so
far"); after the last block, one more sweep loads each float block j once and advances the float
stream and every branch i < j through it; final RMSNorm + output head + cross-entropy then give
loss_i - loss_float. The held-out sequences are few and short, so all branches fit in memory.
"""

from __future__ import annotations

import numpy as np

from .block_forward import rms_norm


def output_metrics(w: np.ndarray, q: np.ndarray, H: np.ndarray) -> tuple[float, float]:
    """(cosine, rel_err) of the layer outputs W X and Q X (see the file header)."""
    w64, q64 = w.astype(np.float64), q.astype(np.float64)
    WH = w64 @ H
    ww = float((WH * w64).sum())
    wq = float((WH * q64).sum())
    qq = float(((q64 @ H) * q64).sum())
    ee = max(ww - 2 * wq + qq, 0.0)
    cos = wq / np.sqrt(ww * qq) if ww > 0 and qq > 0 else (1.0 if ee == 0 else 0.0)
    rel = float(np.sqrt(ee / ww)) if ww > 0 else 0.0
    return float(cos), rel


def cross_entropy(hidden: np.ndarray, tokens: np.ndarray, norm_w: np.ndarray, head: np.ndarray,
                  eps: float) -> float:
    """Mean next-token cross-entropy (nats) of final hidden states [N, T, d] for tokens [N, T]."""
    f, _ = rms_norm(hidden[:, :-1].astype(np.float32), norm_w, eps)
    logits = (f.reshape(-1, f.shape[-1]) @ head.T).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits).sum(axis=1))
    tgt = tokens[:, 1:].reshape(-1)
    return float(np.mean(lse - logits[np.arange(tgt.size), tgt]))


class HeldOut:
    """The held-out float stream, the all-quantized stream and one branch per quantized block."""

    def __init__(self, tokens: np.ndarray, embed: np.ndarray, embed_stored: np.ndarray):
        self.tokens = tokens
        self.fp = embed[tokens].astype(np.float32)
        self.quant = embed_stored[tokens].astype(np.float32)
        self.branches: dict[int, np.ndarray] = {}

    def step(self, i: int, fp_block, q_block) -> None:
        """Block i: fp_block / q_block map hidden states through the float / quantized block."""
        self.branches[i] = q_block(self.fp)
        self.quant = q_block(self.quant)
        self.fp = fp_block(self.fp)

    def losses(self, n_layer: int, load_fp_block, norm_w, head, eps) -> dict:
        """Second sweep (see the file header); returns loss_fp, loss_quantized, per-block deltas.

        load_fp_block(j) returns a function mapping hidden states through float block j.
        """
        states: dict[int, np.ndarray] = {}
        for j in range(n_layer):
            if states:
                fp_block = load_fp_block(j)
                keys = sorted(states)
                n = self.fp.shape[0]
                out = fp_block(np.concatenate([states[i] for i in keys], axis=0))
                for k, i in enumerate(keys):
                    states[i] = out[n * k: n * (k + 1)]
                del fp_block
            if j in self.branches:
                states[j] = self.branches.pop(j)
        loss_fp = cross_entropy(self.fp, self.tokens, norm_w, head, eps)
        deltas = {i: cross_entropy(s, self.tokens, norm_w, head, eps) - loss_fp
                  for i, s in sorted(states.items())}
        return {"loss_fp": loss_fp,
                "loss_quantized": cross_entropy(self.quant, self.tokens, norm_w, head, eps),
                "block_loss_delta": deltas}
