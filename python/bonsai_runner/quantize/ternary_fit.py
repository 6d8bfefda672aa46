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

Torch tensors in and out; the fit computes in the input's dtype on its device (the quantizer
passes float32; float64 input gives the previous numpy implementation's result exactly,
tests/numpy_quantizer.py is that oracle).

The sort is the fit's cost. On the CPU, float32 groups are sorted by numpy on one float64 key per
element that carries the element's index in its low mantissa bits (_sort_desc): one SIMD sort of
unique keys instead of torch's stable index-tracking sort, measured 3.4x faster on [4864, 128]
(18 vs 61 ms, one thread) and 2.2x on a whole [4864, 896] matrix's groups; the result is
torch.sort(descending=True, stable=True)'s exactly (tests/test_quantize_torch.py).
"""

from __future__ import annotations

import numpy as np
import torch

FP16_MAX = 65504.0


def to_fp16(s: torch.Tensor) -> torch.Tensor:
    """Scales as values exactly representable in float16 (clipped to its range), in s's dtype."""
    return s.clamp(-FP16_MAX, FP16_MAX).to(torch.float16).to(s.dtype)


def fit_ternary_groups(w: torch.Tensor, h: torch.Tensor | None = None, fp16: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal (codes, scales) for groups along the last axis.

    w: [..., n] float weights (one group per row of the last axis); h: [n] or broadcastable to w,
    non-negative importance (None: all ones). Returns codes int8 [..., n] in {-1, 0, 1} and
    scales [...] in w's dtype (>= 0, float16-exact when `fp16`).
    """
    if h is None:
        h = torch.ones(w.shape[-1], dtype=w.dtype, device=w.device)
    hh = torch.broadcast_to(h.to(w.dtype).clamp_min(0.0), w.shape)    # a view, not a copy
    a_s, order = _sort_desc(w.abs())
    h_s = torch.gather(hh, -1, order)
    num = torch.cumsum(h_s * a_s, dim=-1)
    den = torch.cumsum(h_s, dim=-1)
    # den = 0 only on a prefix of zero importance, where num = 0 too: gain 0 there
    gain = num * num / den.clamp_min(torch.finfo(w.dtype).tiny)
    best, k = torch.max(gain, dim=-1, keepdim=True)        # first maximum, as numpy's argmax
    s = torch.where(best[..., 0] > 0, (torch.gather(num, -1, k) / torch.gather(den, -1, k))[..., 0],
                    torch.zeros_like(best[..., 0]))
    if fp16:
        s = to_fp16(s)
    return round_ternary(w, s[..., None]), s


def _sort_desc(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a sorted descending along the last axis, the indices), equal values in index order: the
    result of torch.sort(a, -1, descending=True, stable=True), for a >= 0.

    CPU float32: key = -float64(a) with (n-1-index) OR-ed into its 29 low mantissa bits, which a
    float32 value converted to float64 leaves zero; the bits raise the key's magnitude by less
    than one float32 step, so distinct values keep their order and equal ones sort by index
    (zeros become tiny negative subnormals, still above every non-zero key). The keys are unique,
    so an unstable sort is exact; clearing the bits and negating gives the values back exactly."""
    n = a.shape[-1]
    if a.device.type != "cpu" or a.dtype != torch.float32 or n & (n - 1) or n > 1 << 20 \
            or a.numel() == 0:
        return torch.sort(a, dim=-1, descending=True, stable=True)
    key = np.negative(a.detach().numpy(), dtype=np.float64, order="C")
    bits = key.view(np.int64)
    bits |= np.arange(n - 1, -1, -1, dtype=np.int64)
    key.sort(axis=-1)
    order = np.subtract(n - 1, bits & (n - 1))
    bits &= ~np.int64(n - 1)
    return (torch.from_numpy(np.negative(key, dtype=np.float32, casting="same_kind")),
            torch.from_numpy(order))


def round_ternary(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Nearest ternary code of w for scale s >= 0 (broadcast): sign(w) where |w| > s/2."""
    half = torch.where(s > 0, 0.5 * s, torch.full_like(s, float("inf")))
    return torch.where(w.abs() > half, w.sign(), torch.zeros((), dtype=w.dtype,
                                                              device=w.device)).to(torch.int8)


def weighted_error(w: torch.Tensor, codes: torch.Tensor, s: torch.Tensor, h=None) -> torch.Tensor:
    """sum h (w - s t)^2 over the last axis."""
    hh = 1.0 if h is None else h.to(w.dtype)
    return (hh * (w - s.to(w.dtype)[..., None] * codes.to(w.dtype)) ** 2).sum(-1)


def fit_ternary_matrix(w: torch.Tensor, group: int, h: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain (no error feedback) exact fit of a [rows, cols] matrix, one scale per `group` columns.

    h: [cols] importance (Hessian diagonal). Returns codes int8 [rows, cols], scales [rows, cols/group].
    """
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    hg = None if h is None else h.reshape(1, cols // group, group)
    codes, s = fit_ternary_groups(g, hg)
    return codes.reshape(rows, cols), s
