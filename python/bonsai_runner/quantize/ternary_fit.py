"""Exact importance-weighted ternary fit of one group: min over s, t in {-1,0,1}^n of sum h (w - s t)^2.

Why a sorted threshold search is exact (h_i >= 0 are importance weights, e.g. the calibration
Hessian diagonal). Fix s > 0. Each element is then independent: t_i = sign(w_i) when
h_i (|w_i| - s)^2 < h_i w_i^2, i.e. when |w_i| > s / 2, else 0 (the sign never helps reversed).
So for the optimal s the optimal support is {i : |w_i| > s*/2} -- a threshold on |w| that does not
depend on h. Every threshold set is a prefix of the elements sorted by decreasing |w|, so it is
enough to try each prefix length k: with t = sign(w) on the top k,

    s*(k) = sum_topk h |w| / sum_topk h         (least squares in s)
    error(k) = sum h w^2 - (sum_topk h |w|)^2 / sum_topk h

and the best k maximizes the reduction (sum_topk h|w|)^2 / sum_topk h (k = 0: all zero, s = 0).
A prefix whose weights sum to zero reduces nothing. Ties in |w| are harmless: any prefix through a
tie is a candidate, and the threshold set is one of them. tests/test_quantize.py checks this
against exhaustive search over all 3^n codes with the optimal s for each.

The scale is rounded to float16 (what the file stores) and the codes are then re-chosen for that
stored scale (|w| > s16 / 2), which can only lower the error for the stored scale.
"""

from __future__ import annotations

import numpy as np

FP16_MAX = 65504.0


def to_fp16(s: np.ndarray) -> np.ndarray:
    """Scales as float32 values exactly representable in float16 (clipped to its range)."""
    return np.clip(s, -FP16_MAX, FP16_MAX).astype(np.float16).astype(np.float32)


def fit_ternary_groups(w: np.ndarray, h: np.ndarray | None = None, fp16: bool = True
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Optimal (codes, scales) for groups along the last axis.

    w: [..., n] float weights (one group per row of the last axis); h: [n] or broadcastable to w,
    non-negative importance (None: all ones). Returns codes int8 [..., n] in {-1, 0, 1} and
    scales float32 [...] (>= 0, float16-exact when `fp16`).
    """
    w = np.asarray(w, dtype=np.float64)
    hh = np.ones_like(w) if h is None else np.broadcast_to(np.asarray(h, np.float64), w.shape)
    hh = np.maximum(hh, 0.0)
    a = np.abs(w)
    order = np.argsort(-a, axis=-1, kind="stable")
    a_s = np.take_along_axis(a, order, axis=-1)
    h_s = np.take_along_axis(hh, order, axis=-1)
    num = np.cumsum(h_s * a_s, axis=-1)
    den = np.cumsum(h_s, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(den > 0, num * num / den, 0.0)
        s_k = np.where(den > 0, num / den, 0.0)
    k = np.argmax(gain, axis=-1)
    best = np.take_along_axis(gain, k[..., None], axis=-1)[..., 0]
    s = np.where(best > 0, np.take_along_axis(s_k, k[..., None], axis=-1)[..., 0], 0.0)
    if fp16:
        s = to_fp16(s).astype(np.float64)
    codes = round_ternary(w, s[..., None])
    return codes, s.astype(np.float32)


def round_ternary(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Nearest ternary code of w for scale s >= 0 (broadcast): sign(w) where |w| > s/2."""
    return (np.sign(w) * (np.abs(w) > 0.5 * s) * (s > 0)).astype(np.int8)


def weighted_error(w: np.ndarray, codes: np.ndarray, s: np.ndarray, h=None) -> np.ndarray:
    """sum h (w - s t)^2 over the last axis."""
    w = np.asarray(w, np.float64)
    hh = 1.0 if h is None else np.asarray(h, np.float64)
    return (hh * (w - np.asarray(s, np.float64)[..., None] * codes) ** 2).sum(-1)


def fit_ternary_matrix(w: np.ndarray, group: int, h: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Plain (no error feedback) exact fit of a [rows, cols] matrix, one scale per `group` columns.

    h: [cols] importance (Hessian diagonal). Returns codes int8 [rows, cols], scales [rows, cols/group].
    """
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    hg = None if h is None else np.asarray(h).reshape(1, cols // group, group)
    codes, s = fit_ternary_groups(g, hg)
    return codes.reshape(rows, cols), s
