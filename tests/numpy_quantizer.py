"""The previous numpy (float64) quantizer: exact ternary fit, GPTQ sweep and scale refit, kept as
the test oracle of the torch implementation (python/bonsai_runner/quantize/ternary_fit.py, gptq.py).

It is the code of the quantizer before the move to torch (7770337), unchanged but for imports:
tests/test_quantize_torch.py checks the torch code against it in float64 (same codes, same
scales) and in float32 (same error to a tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bonsai_runner.errors import BonsaiError
from bonsai_runner.quantize.gptq import SCALE_STEPS_LONG, SCALE_STEPS_SHORT

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


@dataclass(frozen=True)
class Grid:
    """How one tier picks a group scale and rounds weights to codes."""

    name: str     # tier name: ptq1_0, q2_0, q4_0, q8_0
    group: int
    qmin: int
    qmax: int

    @property
    def ternary(self) -> bool:
        return self.qmin == -1 and self.qmax == 1

    def group_scale(self, wg: np.ndarray, h: np.ndarray | None) -> np.ndarray:
        """Scales [rows] (float16-exact) for group weights [rows, G]: the exact ternary fit, Q8_0's
        max rule, Q4_0's reference rule without h, else the best candidate scale."""
        if self.ternary:
            return fit_ternary_groups(wg, h)[1]
        if self.name == "q8_0":
            return to_fp16(np.abs(wg).max(axis=1) / 127.0)
        idx = np.argmax(np.abs(wg), axis=1)
        signed_max = wg[np.arange(wg.shape[0]), idx]
        if h is None and self.name == "q4_0":
            return to_fp16(signed_max / -8.0)
        # candidates: the largest magnitude at f x qmin or f x qmax; the first best one wins
        best_s = np.zeros(wg.shape[0])
        best_e = np.full(wg.shape[0], np.inf)
        hh = np.ones(wg.shape[1]) if h is None else np.asarray(h, np.float64)
        ends = [f * self.qmin for f in SCALE_STEPS_LONG] + [f * self.qmax for f in SCALE_STEPS_SHORT]
        for end in ends:
            s = to_fp16(signed_max / end)
            with np.errstate(divide="ignore", invalid="ignore"):
                q = np.where(s[:, None] != 0, np.rint(wg / np.where(s != 0, s, 1.0)[:, None]), 0.0)
            q = np.clip(q, self.qmin, self.qmax)
            e = (hh * (wg - s[:, None] * q) ** 2).sum(1)
            better = e < best_e
            best_s = np.where(better, s, best_s)
            best_e = np.where(better, e, best_e)
        return best_s

    def round(self, w: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Codes (int8) of values w for scales s (same shape, broadcast)."""
        if self.ternary:
            return round_ternary(w, np.abs(s)) * np.where(s < 0, -1, 1).astype(np.int8)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(s != 0, np.rint(w / np.where(s != 0, s, 1.0)), 0.0)
        return np.clip(q, self.qmin, self.qmax).astype(np.int8)


GRIDS = {g.name: g for g in (Grid("ptq1_0", 128, -1, 1), Grid("q2_0", 64, -1, 1),
                             Grid("q2_0_4l", 64, -2, 1), Grid("q4_0", 32, -8, 7),
                             Grid("q8_0", 32, -127, 127))}


def grid(name: str) -> Grid:
    g = GRIDS.get(name)
    if g is None:
        raise BonsaiError(f"unknown quantization tier {name!r}; known: {', '.join(GRIDS)}")
    return g


def dequantize(codes: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    rows, cols = codes.shape
    return (codes.reshape(rows, -1, group).astype(np.float32)
            * scales.reshape(rows, -1, 1).astype(np.float32)).reshape(rows, cols)


def output_error(w: np.ndarray, q: np.ndarray, H: np.ndarray) -> float:
    """Relative layer-output error ||(W - Q) X|| / ||W X|| from H = 2 X^T X."""
    e = (w - q).astype(np.float64)
    w64 = w.astype(np.float64)
    num = float(((e @ H) * e).sum())
    den = float(((w64 @ H) * w64).sum())
    return float(np.sqrt(max(num, 0.0) / den)) if den > 0 else 0.0


def _error_meter(w: np.ndarray, H: np.ndarray):
    """(output_error(w, q, H) as a function of q, tr(W H W^T)), with W H computed once.

    tr(W H W^T) = 2 ||W X||^2 / tokens is the layer's float output energy per token."""
    w64 = w.astype(np.float64)
    WH = w64 @ H
    ww = float((WH * w64).sum())

    def err(q: np.ndarray) -> float:
        q64 = q.astype(np.float64)
        e2 = ww - 2.0 * float((WH * q64).sum()) + float(((q64 @ H) * q64).sum())
        return float(np.sqrt(max(e2, 0.0) / ww)) if ww > 0 else 0.0
    return err, ww


def plain_fit(w: np.ndarray, H: np.ndarray, tier: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) of the plain per-group fit, no error feedback: the exact ternary fit under
    the Hessian diagonal for the ternary tiers, the type's own rounding rule for Q4_0 / Q8_0."""
    g = grid(tier)
    h = np.maximum(np.diag(H), 0.0)
    if g.ternary:
        return fit_ternary_matrix(w, g.group, h)
    return quantize_rtn(w, g, h)


def plain_fit_errors(w: np.ndarray, H: np.ndarray, tiers) -> tuple[dict[str, float], float]:
    """({tier: relative layer-output error of the plain fit}, tr(W H W^T)).

    The cheap per-tier estimate of --target-bpw's pre-pass: one plain fit and one matrix product
    per tier instead of a GPTQ sweep and a refit (Qwen2.5-0.5B down_proj, 896 x 4864: 8.8 s for
    all four tiers against 28 s for GPTQ + refit at PTQ1_0 alone). GPTQ + refit lower a layer's
    error by a similar factor at every tier (policy.py gives the measured factors), so the
    plain-fit errors rank a layer's tiers the way the final errors would."""
    err_of, ww = _error_meter(w, H)
    out = {}
    for t in tiers:
        codes, scales = plain_fit(w, H, t)
        out[t] = err_of(dequantize(codes, scales, grid(t).group))
    return out, ww


def _upper_inverse_cholesky(H: np.ndarray) -> np.ndarray:
    """U upper triangular with U^T U = H^-1 (H symmetric positive definite).

    With J the order reversal and J H J = L L^T: H^-1 = J L^-T L^-1 J = U^T U for U = J L^-1 J,
    which is upper triangular because L^-1 is lower. One Cholesky and one inverse.
    """
    L = np.linalg.cholesky(H[::-1, ::-1])
    return np.linalg.inv(L)[::-1, ::-1].copy()


def quantize_gptq(w: np.ndarray, H: np.ndarray, g: Grid, damp: float = 0.01,
                  block: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ sweep of w [rows, cols] with Hessian H [cols, cols]; returns (codes, scales)."""
    rows, cols = w.shape
    if cols % g.group:
        raise BonsaiError(f"{cols} input columns do not split into groups of {g.group}")
    W = np.array(w, dtype=np.float64)
    H = np.array(H, dtype=np.float64)
    dead = np.diag(H) <= 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    h_diag = np.diag(H).copy()
    H[np.diag_indices(cols)] += damp * float(np.mean(np.diag(H)))
    try:
        U = _upper_inverse_cholesky(H)
    except np.linalg.LinAlgError:
        raise BonsaiError("the calibration Hessian is not positive definite even after damping; "
                          "raise --damp or use more calibration text") from None
    block = max(block // g.group, 1) * g.group
    codes = np.zeros((rows, cols), dtype=np.int8)
    scales = np.zeros((rows, cols // g.group), dtype=np.float32)
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        W1 = W[:, i1:i2].copy()
        E1 = np.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]
        s = None
        for i in range(i2 - i1):
            c = i1 + i
            if c % g.group == 0:
                gi = c // g.group
                s = g.group_scale(W1[:, i:i + g.group], h_diag[c:c + g.group]).astype(np.float64)
                scales[:, gi] = s
            col = W1[:, i]
            q = g.round(col, s)
            codes[:, c] = q
            err = (col - s * q) / U1[i, i]
            W1[:, i:] -= np.outer(err, U1[i, i:])
            E1[:, i] = err
        W[:, i2:] -= E1 @ U[i1:i2, i2:]
    return codes, scales


def refit_scales(w: np.ndarray, codes: np.ndarray, scales: np.ndarray, H: np.ndarray,
                 g: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares group scales per row with the codes fixed (see the file header).

    Returns (codes, scales); for symmetric code ranges a negative scale is turned positive by
    negating its group's codes (same values).
    """
    rows, cols = w.shape
    group = g.group
    ng = cols // group
    chunk = max(1, int(4e6 // (ng * cols)))              # bounds TH below to ~32 MB
    codes = codes.copy()
    H = np.asarray(H, np.float64)
    out = scales.astype(np.float32).copy()
    ridge = 1e-9 * float(np.mean(np.diag(H)) or 1.0)
    for r0 in range(0, rows, chunk):
        r1 = min(r0 + chunk, rows)
        T = codes[r0:r1].astype(np.float64)
        Wr = w[r0:r1].astype(np.float64)
        Tg = T.reshape(r1 - r0, ng, group)
        TH = np.empty((r1 - r0, ng, cols))                        # A_r H: [r, ng, cols]
        for gi in range(ng):
            TH[:, gi] = Tg[:, gi] @ H[gi * group:(gi + 1) * group]
        M = _gram(TH, Tg)
        b = np.matmul(TH, Wr[:, :, None])[..., 0]
        Mr = M.copy()
        Mr[:, np.arange(ng), np.arange(ng)] += ridge
        s_new = to_fp16(np.linalg.solve(Mr, b[..., None])[..., 0]).astype(np.float64)
        s_old = out[r0:r1].astype(np.float64)
        # row error = w H w^T - 2 s.b + s^T M s; the first term is common to both
        better = _quad(M, b, s_new) < _quad(M, b, s_old)
        out[r0:r1][better] = s_new[better].astype(np.float32)
    if g.qmin == -g.qmax:
        neg = out < 0
        if neg.any():
            flip = np.repeat(np.where(neg, -1, 1), group, axis=1).astype(np.int8)
            codes *= flip
            out = np.abs(out)
    return codes, out


def _gram(TH: np.ndarray, Tg: np.ndarray) -> np.ndarray:
    """M[r, g, h] = sum over group h's columns c of TH[r, g, c] * T[r, c]."""
    r, ng, cols = TH.shape
    group = cols // ng
    return np.einsum("rghc,rhc->rgh", TH.reshape(r, ng, ng, group), Tg)


def _quad(M: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Per-row s^T M s - 2 s.b (the row's output error up to a constant)."""
    return np.matmul(np.matmul(s[:, None, :], M), s[:, :, None])[:, 0, 0] - 2 * (s * b).sum(1)


def reference_codes(w: np.ndarray, tier: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) of the reference quantizer (bonsai_runner.quants) for Q8_0 / Q4_0, so a
    tensor quantized without calibration gets exactly the bytes of the reference blocks."""
    from bonsai_runner import quants

    rows, cols = w.shape
    raw = np.asarray(quants.quantize(np.asarray(w, np.float32), tier)).reshape(rows, -1)
    if tier == "q8_0":
        blk = raw.view(np.dtype([("d", "<f2"), ("qs", "i1", (32,))])).reshape(rows, -1)
        codes = blk["qs"].reshape(rows, cols)
    elif tier == "q4_0":
        blk = raw.view(np.dtype([("d", "<f2"), ("qs", "u1", (16,))])).reshape(rows, -1)
        lo, hi = blk["qs"] & 0x0F, blk["qs"] >> 4
        codes = (np.concatenate([lo, hi], axis=-1).astype(np.int16) - 8).reshape(rows, cols)
    else:
        raise BonsaiError(f"no reference block quantizer for tier {tier!r}")
    return codes.astype(np.int8), blk["d"].astype(np.float32)


def quantize_rtn(w: np.ndarray, g: Grid, h: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Plain per-group fit without error feedback (exact ternary fit / the type's rule)."""
    rows, cols = w.shape
    if cols % g.group:
        raise BonsaiError(f"{cols} input columns do not split into groups of {g.group}")
    wg = np.asarray(w, np.float64).reshape(rows, cols // g.group, g.group)
    hg = (np.ones(cols) if g.ternary and h is None else h)
    scales = np.stack([g.group_scale(wg[:, i], None if hg is None
                                     else hg[i * g.group:(i + 1) * g.group])
                       for i in range(wg.shape[1])], 1)
    codes = g.round(wg, scales[..., None].astype(np.float64))
    return codes.reshape(rows, cols), scales.astype(np.float32)


def quantize_absmean(w: np.ndarray, g: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest ternary without data (the RTN baseline, BitNet b1.58's absmean rule):
    per group s = mean |w| (float16), codes = clip(round(w / s), -1, 1), i.e. threshold s / 2."""
    rows, cols = w.shape
    if cols % g.group:
        raise BonsaiError(f"{cols} input columns do not split into groups of {g.group}")
    wg = np.asarray(w, np.float64).reshape(rows, cols // g.group, g.group)
    s = to_fp16(np.abs(wg).mean(axis=2)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s[..., None] > 0, np.rint(wg / np.where(s > 0, s, 1.0)[..., None]), 0.0)
    codes = np.clip(q, -1, 1).astype(np.int8)
    return codes.reshape(rows, cols), s.astype(np.float32)


@dataclass
class LayerResult:
    tier: str
    codes: np.ndarray        # int8 [rows, cols]
    scales: np.ndarray       # float32 (float16-exact) [rows, cols / group]
    err_plain: float         # relative output error of the plain per-group fit
    err_gptq: float          # ... after the GPTQ sweep
    err: float               # ... final (after the least-squares scale refit)

    def dequantize(self) -> np.ndarray:
        return dequantize(self.codes, self.scales, grid(self.tier).group)


def quantize_layer(w: np.ndarray, H: np.ndarray, tier: str, damp: float = 0.01) -> LayerResult:
    """Plain fit (for the log), GPTQ sweep, then least-squares scale refit; keeps the best."""
    g = grid(tier)
    pc, ps = plain_fit(w, H, tier)
    err_of, _ = _error_meter(w, H)
    err_plain = err_of(dequantize(pc, ps, g.group))
    codes, scales = quantize_gptq(w, H, g, damp)
    err_gptq = err_of(dequantize(codes, scales, g.group))
    codes, scales = refit_scales(w, codes, scales, H, g)
    err = err_of(dequantize(codes, scales, g.group))
    if err_plain < err:
        codes, scales, err = pc, ps, err_plain
    return LayerResult(tier, codes, scales, err_plain, err_gptq, err)
