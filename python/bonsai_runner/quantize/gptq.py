"""GPTQ-style quantization of one linear layer with error feedback, for every tier of the scheme.

Objective: the layer-output error ||(W - Q) X||^2 = tr((W - Q) H (W - Q)^T) with H = 2 X^T X
accumulated over the calibration tokens (X: [tokens, in]). Columns (input features) are quantized
left to right; the rounding error of column j, divided by the j-th diagonal of the upper Cholesky
factor U of H^-1 (H^-1 = U^T U), is fed back into the not-yet-quantized columns through row j of U
(Frantar et al., GPTQ). Updates are applied eagerly inside a sub-block of 16 columns, and lazily,
as one matrix product each, to the rest of the 128-column block and to the columns after it
(quantize_gptq). H is damped by `damp` x mean(diag H); columns that never see a non-zero input
(diag 0) are set to zero. The damped factor depends on H alone: a stage's layers share it
(prepare_hessian).

The scale of each group is fixed when the group starts, from the error-updated weights: the exact
importance-weighted ternary fit (ternary_fit.py, weights = diag H) for the ternary tiers, the
max rule for Q8_0, a search over candidate scales under diag H for Q4_0 and the four-level Q2_0
(search_scale). Blocks are a multiple of the group size, so a group always lies inside one block
and is fully updated when its scale is chosen.

The tiers: PTQ1_0 (ternary, group 128), Q2_0 (ternary, group 64: the --group-size 64 scheme),
Q2_0_4L (the same Q2_0 blocks with all four codes in use: mainline's Q2_0 decodes code 3 as +2,
so a group holds {-1, 0, 1, 2} x d; the tier's codes are -2..1 with scale s, written as code 1 - c
with d = -s), Q4_0 and Q8_0.

On the coarse tiers (ternary and four-level), after the refit below, two sweeps of cyclic
coordinate descent (coordinate_descent) revisit every code with all the others at their final
values, and the scales are refitted once more.

After the sweep, `refit_scales` re-solves every row's group scales with the codes fixed, by least
squares against the layer output with the full (undamped) H:
    s_r = argmin (w_r - s A_r) H (w_r - s A_r)^T = (A_r H A_r^T)^-1 A_r H w_r,
A_r[g] = row r's codes on group g's columns and zero elsewhere; a row keeps its old scales when the
float16-rounded refit is not better. The products A_r H it forms also give Q H for the weights
before and after the refit (sum_g s_g A_g H), so the errors of both come without another
layer-sized product: per layer W H, the plain fit's E H, the refit's A H and the sweep's updates.

Torch on the quantizer's device. Precision: the weights, the sweep and the refit's products run
in float32; the Cholesky factor of the damped H^-1 and the refit's small per-row ng x ng solves in
float64; the error sums are per-row float32 dots added in float64. Measured (tests/test_quantize_torch.py, against the previous float64 numpy code kept in
tests/numpy_quantizer.py): in float64 this code gives the oracle's codes exactly; in float32 the
plain / GPTQ / refit layer-output errors agree to < 2e-3 relative and > 99% of the codes are the
same (the rest are near-ties of the rounding). The Cholesky stays in float64 because GPTQ feeds
each column's error back through H^-1: an activation Hessian's condition number grows with its
width and with outlier channels, and damping at 1% of the mean diagonal is the only guard (it
bounds the condition number only by ~100 x max/mean of the diagonal). Measured on 896-wide
synthetic Hessians with channel scales exp(k N(0,1)), k = 1..3 (condition 5e3..3e4 after
damping): a float32 factor differs from the float64 one by < 1e-7 relative and the GPTQ error is
the same to 5 digits, so float32 would do there; a 27B's outlier channels can put the condition
orders of magnitude higher, where float32's 6e-8 x condition is no longer small, and the float64
factor of an n x n H costs n^3/3 operations once per stage (shared by its layers), small next to
the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..convert.ptq1_pack import TIERS
from ..errors import BonsaiError
from .ternary_fit import fit_ternary_groups, fit_ternary_matrix, round_ternary, to_fp16


@dataclass(frozen=True)
class Grid:
    """How one tier picks a group scale and rounds weights to codes."""

    name: str     # tier name: ptq1_0, q2_0, q2_0_4l, q4_0, q8_0
    group: int
    qmin: int
    qmax: int

    @property
    def ternary(self) -> bool:
        return self.qmin == -1 and self.qmax == 1

    @property
    def coarse(self) -> bool:
        """At most four levels: rounding steps as large as the weights (coordinate descent pays)."""
        return self.qmax - self.qmin <= 3

    def group_scale(self, wg: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        """Scales [rows] (float16-exact) for group weights [rows, G] under importance h [G]
        (None: all 1): the exact ternary fit for the ternary tiers, the max rule for Q8_0, and
        for the signed grids (Q4_0, the four-level Q2_0) the best of SCALE_STEPS candidate
        scales (search_scale). Q4_0 without h keeps its reference rule (largest magnitude to
        code -8), so a plain Q4_0 tensor gets the reference quantizer's scales."""
        if self.ternary:
            return fit_ternary_groups(wg, h)[1]
        if self.name == "q8_0":
            return to_fp16(wg.abs().amax(dim=1) / 127.0)
        if h is None and self.name == "q4_0":
            idx = torch.argmax(wg.abs(), dim=1, keepdim=True)
            return to_fp16(torch.gather(wg, 1, idx)[:, 0] / self.qmin)
        return search_scale(wg, h, self.qmin, self.qmax)

    def round(self, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Codes (int8) of values w for scales s (same shape, broadcast)."""
        if self.ternary:
            sign = torch.where(s < 0, -1, 1).to(torch.int8)
            return round_ternary(w, s.abs()) * sign
        nz = s != 0
        q = torch.where(nz, torch.round(w / torch.where(nz, s, torch.ones_like(s))),
                        torch.zeros_like(w))
        return q.clamp(self.qmin, self.qmax).to(torch.int8)


# One grid per tier of the packed format (ptq1_pack.TIERS: group and code range), except that
# Q8_0 rounds symmetrically to [-127, 127] (its scale is the largest magnitude / 127, the
# reference rule); its block admits -128, which the quantizer never writes.
GRIDS = {t.name: Grid(t.name, t.group, -127 if t.name == "q8_0" else t.qmin, t.qmax) for t in TIERS.values()}

# search_scale's candidates: the group's largest-magnitude value a goes to f x the code at the
# grid's long end (qmin) or at its short end (qmax), s = a / (f x code). f < 1 leaves headroom,
# f > 1 clips a. Measured on Qwen2.5-Coder-0.5B block 3 (rotated, 12 x 256 calibration, relative
# output error on 12 held-out sequences after GPTQ + refit): the four-level Q2_0 with the max
# rule (a to code -2) q_proj 0.29, gate 0.32, down 0.065; with the search 0.157 / 0.196 / 0.041
# (ternary PTQ1_0: 0.187 / 0.229 / 0.048); Q4_0 3-6% below its max rule on all seven layers
# (q 0.0337 -> 0.0326, up 0.0766 -> 0.0737, down 0.0095 -> 0.0089).
SCALE_STEPS_LONG = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3)
SCALE_STEPS_SHORT = (0.7, 0.8, 0.9, 1.0, 1.1, 1.2)


def search_scale(wg: torch.Tensor, h: torch.Tensor | None, qmin: int, qmax: int) -> torch.Tensor:
    """The float16 scale of each row of wg [rows, G] that minimises sum_j h_j (w_j - s q_j)^2
    over the candidates above, q_j = clamp(round(w_j / s), qmin, qmax); ties keep the first."""
    idx = torch.argmax(wg.abs(), dim=1, keepdim=True)
    a = torch.gather(wg, 1, idx)                                          # [rows, 1], signed
    ends = [f * qmin for f in SCALE_STEPS_LONG] + [f * qmax for f in SCALE_STEPS_SHORT]
    S = to_fp16(a / torch.tensor(ends, dtype=wg.dtype, device=wg.device))  # [rows, K]
    nz = S != 0
    q = torch.round(wg[:, None, :] / torch.where(nz, S, torch.ones_like(S))[..., None])
    q = q.clamp(qmin, qmax) * nz[..., None]
    e = (wg[:, None, :] - q * S[..., None]) ** 2
    err = (e * h if h is not None else e).sum(-1)
    return torch.gather(S, 1, err.argmin(1, keepdim=True))[:, 0]


def grid(name: str) -> Grid:
    g = GRIDS.get(name)
    if g is None:
        raise BonsaiError(f"unknown quantization tier {name!r}; known: {', '.join(GRIDS)}")
    return g


def dequantize(codes: torch.Tensor, scales: torch.Tensor, group: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    rows, cols = codes.shape
    return (codes.reshape(rows, -1, group).to(dtype)
            * scales.reshape(rows, -1, 1).to(dtype)).reshape(rows, cols)


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """sum(a * b): per-row dots in the inputs' dtype, their sum in float64."""
    return float(torch.linalg.vecdot(a, b, dim=-1).sum(dtype=torch.float64))


class ErrorMeter:
    """Relative layer-output error and output cosine of candidate weights q against w under H.

    W H is formed once; each candidate then costs one product (E H, E = W - Q, from the difference
    itself, no cancellation in the error):
        rel_err = sqrt(tr(E H E^T) / tr(W H W^T))
        cosine  = tr(W H Q^T) / sqrt(tr(W H W^T) tr(Q H Q^T)),
    with tr(W H Q^T) = ww - tr(W H E^T) and tr(Q H Q^T) = ww - 2 tr(W H E^T) + tr(E H E^T).
    tr(W H W^T) = 2 ||W X||^2 / tokens is the layer's float output energy per token."""

    def __init__(self, w: torch.Tensor, H: torch.Tensor):
        self.w, self.H = w, H.to(w.dtype)
        self.WH = w @ self.H
        self.ww = _dot(self.WH, w)

    def metrics(self, q: torch.Tensor, qH: torch.Tensor | None = None) -> tuple[float, float]:
        """(rel_err, cosine) of q; qH: Q H when the caller has it (refit_scales), which saves
        the product (E H = W H - Q H then; float32 keeps its error < 1e-4 relative down to
        Q8_0's ~4e-3 output error)."""
        e = self.w - q.to(self.w.dtype)
        eH = e @ self.H if qH is None else self.WH - qH
        ee = max(_dot(eH, e), 0.0)
        we = _dot(self.WH, e)
        ww = self.ww
        qq = ww - 2.0 * we + ee
        rel = float(np.sqrt(ee / ww)) if ww > 0 else 0.0
        cos = (ww - we) / np.sqrt(ww * qq) if ww > 0 and qq > 0 else (1.0 if ee == 0 else 0.0)
        return rel, float(min(cos, 1.0))

    def __call__(self, q: torch.Tensor) -> float:
        return self.metrics(q)[0]


def output_error(w: torch.Tensor, q: torch.Tensor, H: torch.Tensor) -> float:
    """Relative layer-output error ||(W - Q) X|| / ||W X|| from H = 2 X^T X."""
    return ErrorMeter(w, H)(q)


def plain_fit(w: torch.Tensor, H: torch.Tensor, tier: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of the plain per-group fit, no error feedback, under the Hessian diagonal:
    the exact ternary fit for the ternary tiers, Grid.group_scale's rule for the others."""
    g = grid(tier)
    h = torch.diagonal(H).to(w.dtype).clamp_min(0.0)
    if g.ternary:
        return fit_ternary_matrix(w, g.group, h)
    return quantize_rtn(w, g, h)


ESTIMATE_ROWS = 256     # output rows the --target-bpw estimate fits (evenly spaced)


def plain_fit_errors(w: torch.Tensor, H: torch.Tensor, tiers) -> tuple[dict[str, float], float]:
    """({tier: relative layer-output error of the plain fit}, tr(W H W^T)).

    The cheap per-tier estimate of --target-bpw's pre-pass: one plain fit and one matrix product
    per tier instead of a GPTQ sweep and a refit. GPTQ + refit lower a layer's error by a similar
    factor at every tier (policy.py gives the measured factors), so the plain-fit errors rank a
    layer's tiers the way the final errors would. The plain fit is per row, so the relative error
    is estimated on at most ESTIMATE_ROWS evenly spaced rows (the energy scaled to all rows): on
    Qwen2.5-0.5B (the demo's --target-bpw 4.5) that cut the pre-pass from 116 s to 65 s, PPL
    ratio 1.21 -> 1.22 (the same within run-to-run noise)."""
    out, energy, _ = plain_fit_row_errors(w, H, tiers)
    return out, energy


def plain_fit_row_errors(w: torch.Tensor, H: torch.Tensor, tiers
                         ) -> tuple[dict[str, float], float, dict[str, torch.Tensor]]:
    """plain_fit_errors' two results and {tier: per-row output errors e_r H e_r^T [rows]}: the
    sampled rows' errors, each standing for the `step` rows around it (scaled by step), so their
    weighted sums estimate whole-matrix ones (fisher.predicted_loss)."""
    step = -(-w.shape[0] // ESTIMATE_ROWS)
    ws = w[::step]
    err_of = ErrorMeter(ws, H)
    out, rows = {}, {}
    for t in tiers:
        codes, scales = plain_fit(ws, H, t)
        e = ws - dequantize(codes, scales, grid(t).group, w.dtype)
        r = torch.linalg.vecdot(e @ err_of.H, e, dim=-1).clamp_min(0.0)
        out[t] = float(np.sqrt(float(r.sum(dtype=torch.float64)) / err_of.ww)) \
            if err_of.ww > 0 else 0.0
        rows[t] = r * (w.shape[0] / ws.shape[0])
    return out, err_of.ww * (w.shape[0] / ws.shape[0]), rows


def _upper_inverse_cholesky(H: torch.Tensor) -> torch.Tensor:
    """U upper triangular with U^T U = H^-1 (H symmetric positive definite), float64.

    With J the order reversal and J H J = L L^T: H^-1 = J L^-T L^-1 J = U^T U for U = J L^-1 J,
    which is upper triangular because L^-1 is lower. One Cholesky and one triangular inverse.
    """
    L, info = torch.linalg.cholesky_ex(torch.flip(H, (0, 1)))
    if int(info) != 0:
        raise BonsaiError("the calibration Hessian is not positive definite even after damping; "
                          "raise --damp or use more calibration text")
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    Linv = torch.linalg.solve_triangular(L, eye, upper=False)
    return torch.flip(Linv, (0, 1)).contiguous()


@dataclass
class HessianPrep:
    """What a GPTQ sweep takes from one Hessian; the layers of a stage share their input, so the
    pipeline prepares it once per stage (prepare_hessian) and passes it to each layer."""

    dead: torch.Tensor       # [cols] bool: columns that never see a non-zero input (set to 0)
    h_diag: torch.Tensor     # [cols] the Hessian diagonal (dead: 1), the ternary fit's weights
    U: torch.Tensor          # [cols, cols] upper Cholesky factor of the damped H^-1
    damp: float


def prepare_hessian(H: torch.Tensor, damp: float = 0.01, dtype: torch.dtype = torch.float32
                    ) -> HessianPrep:
    """The damped H's inverse Cholesky factor (computed in float64, returned in `dtype`)."""
    H = H.to(torch.float64).clone()
    dead = torch.diagonal(H) <= 0
    H[dead, dead] = 1.0
    h_diag = torch.diagonal(H).to(dtype).clone()
    H.diagonal().add_(damp * float(torch.diagonal(H).mean()))
    U = _upper_inverse_cholesky(H).to(dtype)
    return HessianPrep(dead, h_diag, U, damp)


# The ridge of the layer objective: tr((W - Q)(H + r m I)(W - Q)^T), m = mean(diag H). Damping only
# the inverse that GPTQ feeds the errors through is not enough when the calibration tokens are few
# against the input width: H = 2 X^T X then has rank <= tokens (a down_proj's 4864 inputs from
# 12 x 256 = 3072 tokens), and the refit and coordinate descent, which minimise the undamped
# objective, fit the calibration tokens' noise. The ridge is a prior that the quantized weights
# stay near the float ones in every direction the calibration did not see. Measured on
# Qwen2.5-Coder-0.5B (rotated; relative output error on 12 held-out sequences,
# benchmarks/ridge_study.py): 12 x 256 tokens, block 3 ternary down_proj 0.0692 (r = 0) -> 0.0601 (0.03)
# -> 0.0544 (0.1) -> 0.0500 (0.3) -> 0.0472 (1.0); gate_proj 0.2455 -> 0.2226 (1.0); o_proj
# 0.3085 -> 0.2909 (0.3), 0.2983 (1.0); Q4_0 down_proj 0.0135 -> 0.0095 (1.0). 48 x 256 tokens,
# block 12: down_proj 0.3538 -> 0.3262 (0.3), 0.3252 (1.0); gate_proj 0.1911 -> 0.1871 (0.3);
# o_proj 0.3116 -> 0.3049 (0.1), 0.3260 (1.0); q_proj 0.1940 -> 0.1912 (0.1). The best r grows with
# the input width over the number of tokens, about twice that ratio: `auto_ridge`.
RIDGE_MAX = 1.0
RIDGE_PER_WIDTH = 2.0   # auto ridge = this x input width / calibration tokens


def auto_ridge(cols: int, tokens: int, floor: float = 0.0) -> float:
    """The default ridge: RIDGE_PER_WIDTH x input width / calibration tokens, within
    [floor, RIDGE_MAX]."""
    return min(RIDGE_MAX, max(floor, RIDGE_PER_WIDTH * cols / max(tokens, 1)))


def with_ridge(H: torch.Tensor, ridge: float) -> torch.Tensor:
    """H + ridge x mean(diag H) x I (H itself when ridge is 0)."""
    if ridge <= 0:
        return H
    Hr = H.clone()
    Hr.diagonal().add_(ridge * float(torch.diagonal(H).mean()))
    return Hr


SUB_BLOCK = 16      # columns per eager rank-1 update inside a block (see quantize_gptq)


def quantize_gptq(w: torch.Tensor, H: torch.Tensor, g: Grid, damp: float = 0.01,
                  block: int = 128, prep: HessianPrep | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ sweep of w [rows, cols] with Hessian H [cols, cols]; returns (codes, scales).

    The sweep runs in w's dtype; H^-1's Cholesky factor in float64 (see the file header). It works
    on W^T so that a column is one contiguous row. Three levels of lazy updates, all exact GPTQ
    (only the order of the additions differs): column j's error goes eagerly (rank-1) into the
    rest of its sub-block of SUB_BLOCK columns only; a finished sub-block's errors go into the
    rest of the block as one product; a finished block's into all later columns as one product.
    A group's scale is fitted when the sweep reaches the group's first column, by which time
    every earlier column's error has reached all of the group's columns."""
    rows, cols = w.shape
    if cols % g.group:
        raise BonsaiError(f"{cols} input columns do not split into groups of {g.group}")
    dt = w.dtype
    if prep is None or prep.damp != damp:
        prep = prepare_hessian(H, damp, dt)
    U = prep.U.to(dt)
    h_diag = prep.h_diag.to(dt)
    WT = w.T.contiguous()                                  # [cols, rows]
    WT[prep.dead] = 0.0
    block = max(block // g.group, 1) * g.group
    sub = min(SUB_BLOCK, g.group)
    QT = torch.empty_like(WT)                              # codes (as values), transposed
    ET = torch.empty((block, rows), dtype=dt, device=w.device)
    scales = torch.zeros((rows, cols // g.group), dtype=dt, device=w.device)
    d = torch.diagonal(U).tolist()
    zero = torch.zeros((), dtype=dt, device=w.device)
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        n = i2 - i1
        Wb, Qb, Eb, Ub = WT[i1:i2], QT[i1:i2], ET[:n], U[i1:i2, i1:i2]
        for j0 in range(0, n, sub):
            c0 = i1 + j0
            if c0 % g.group == 0:
                s = g.group_scale(Wb[j0:j0 + g.group].T, h_diag[c0:c0 + g.group])
                scales[:, c0 // g.group] = s
                if g.ternary:            # round_ternary: sign(w) where |w| > s/2, 0 where s = 0
                    half = torch.where(s > 0, 0.5 * s, torch.full_like(s, float("inf")))
            j1 = min(j0 + sub, n)
            for j in range(j0, j1):
                col = Wb[j]
                if g.ternary:
                    torch.where(col.abs() > half, col.sign(), zero, out=Qb[j])
                else:
                    Qb[j] = g.round(col, s)
                torch.addcmul(col, s, Qb[j], value=-1.0, out=Eb[j])
                Eb[j].div_(d[i1 + j])
                if j + 1 < j1:
                    Wb[j + 1:j1].addr_(Ub[j, j + 1:j1], Eb[j], alpha=-1.0)
            if j1 < n:
                Wb[j1:].addmm_(Ub[j0:j1, j1:].T, Eb[j0:j1], alpha=-1.0)
        if i2 < cols:
            WT[i2:].addmm_(U[i1:i2, i2:].T, Eb, alpha=-1.0)
    return QT.T.to(torch.int8).contiguous(), scales


def refit_scales(w: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, H: torch.Tensor,
                 g: Grid) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares group scales per row with the codes fixed (see the file header).

    Returns (codes, scales); for symmetric code ranges a negative scale is turned positive by
    negating its group's codes (same values). The products A_r H run in w's dtype, the per-row
    ng x ng systems are solved in float64.
    """
    codes, out, _, _ = _refit(w, codes, scales, H, g)
    return codes, out


def _refit(w, codes, scales, H, g):
    """refit_scales, and Q H for the weights before and after ([rows, cols] each): Q H =
    sum_g s_g (A_g H), from the products the refit forms anyway (no extra matrix product)."""
    rows, cols = w.shape
    group = g.group
    ng = cols // group
    dt = w.dtype
    chunk = max(1, int(8e6 // (ng * cols)))              # bounds TH below to ~32 MB (float32)
    codes = codes.clone()
    Hd = H.to(dt)
    Hg = Hd.reshape(ng, group, cols)
    out = scales.clone()
    qh_old = torch.empty((rows, cols), dtype=dt, device=w.device)
    qh_new = torch.empty_like(qh_old)
    ridge = 1e-9 * (float(torch.diagonal(H).double().mean()) or 1.0)
    eye = torch.eye(ng, dtype=torch.float64, device=w.device)
    for r0 in range(0, rows, chunk):
        r1 = min(r0 + chunk, rows)
        Tg = codes[r0:r1].to(dt).reshape(r1 - r0, ng, group)
        TH = torch.bmm(Tg.transpose(0, 1), Hg)                            # A_r H: [ng, r, cols]
        M = torch.einsum("grhc,rhc->rgh", TH.reshape(ng, r1 - r0, ng, group), Tg).double()
        b = torch.einsum("grc,rc->rg", TH, w[r0:r1]).double()
        s_new = to_fp16(torch.linalg.solve(M + ridge * eye, b[..., None])[..., 0])
        s_old = out[r0:r1].double()
        # row error = w H w^T - 2 s.b + s^T M s; the first term is common to both
        better = _quad(M, b, s_new) < _quad(M, b, s_old)
        _combine(TH, out[r0:r1], qh_old[r0:r1])
        out[r0:r1][better] = s_new[better].to(dt)
        _combine(TH, out[r0:r1], qh_new[r0:r1])
        del TH
    if g.qmin == -g.qmax:
        neg = out < 0
        if bool(neg.any()):
            flip = torch.where(neg, -1, 1).to(torch.int8).repeat_interleave(group, dim=1)
            codes *= flip
            out = out.abs()
    return codes, out, qh_old, qh_new


def _combine(TH: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    """out[r] = sum_g s[r, g] TH[g, r]: Q H of the rows from their groups' A_g H."""
    torch.mul(TH[0], s[:, :1], out=out)
    for gi in range(1, TH.shape[0]):
        out.addcmul_(TH[gi], s[:, gi:gi + 1])


def _quad(M: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Per-row s^T M s - 2 s.b (the row's output error up to a constant)."""
    return torch.einsum("rg,rgh,rh->r", s, M, s) - 2 * (s * b).sum(1)


CD_BLOCK = 128       # columns whose updates are applied eagerly inside coordinate_descent


def coordinate_descent(w: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                       H: torch.Tensor, g: Grid, sweeps: int = 2) -> tuple[torch.Tensor, int]:
    """Cyclic coordinate descent on the codes with the scales fixed; returns (codes, changed).

    The layer-output error is a sum over rows of quadratics e_r H e_r^T (e_r = q_r - w_r), so with
    every other code of row r fixed, the best value of q_rj is the grid point nearest to
        t_rj = w_rj - ((E H)_rj - e_rj H_jj) / H_jj,
    (the vertex of a one-dimensional parabola), i.e. the code g.round(t_rj, s) with the column's
    group scale: each update lowers the error or keeps it, all rows at once per column. E H is
    kept current: a changed column's difference goes eagerly into the rest of its block of
    CD_BLOCK columns and, once the block is done, into the other columns as one product, so a
    sweep costs about one layer-sized product (rows x cols^2), like the GPTQ sweep. GPTQ decides
    each column once, from the columns before it; the sweeps revisit every column with the final
    values of all others, which is where it gains on ternary grids (rounding steps as large as
    the weights). Columns that never see an input (H_jj = 0) are left as they are."""
    rows, cols = w.shape
    dt = w.dtype
    Hd = H.to(dt)
    hdiag = torch.diagonal(Hd).tolist()
    ST = scales.T.to(dt).repeat_interleave(g.group, dim=0).contiguous()     # [cols, rows]
    if g.ternary:      # round_ternary on the codes' scale: sign(t) where |t| > |s| / 2
        HALF = torch.where(ST != 0, 0.5 * ST.abs(), torch.full_like(ST, float("inf")))
        SIGN = torch.where(ST < 0, -1.0, 1.0).to(dt)
    QT = codes.T.to(dt).contiguous()
    start = QT.clone()
    ET = QT * ST - w.T
    PT = Hd @ ET                                                             # (E H)^T
    zero = torch.zeros((), dtype=dt, device=w.device)
    for _ in range(sweeps):
        before = QT.clone()
        for i1 in range(0, cols, CD_BLOCK):
            i2 = min(i1 + CD_BLOCK, cols)
            D = torch.zeros((i2 - i1, rows), dtype=dt, device=w.device)
            for j in range(i1, i2):
                if hdiag[j] <= 0:
                    continue
                # the parabola's vertex: the current value minus (E H)_j / H_jj
                t = torch.addcmul(ET[j] + w.T[j], PT[j], torch.tensor(-1.0 / hdiag[j], dtype=dt))
                if g.ternary:
                    q = torch.where(t.abs() > HALF[j], t.sign() * SIGN[j], zero)
                else:
                    q = g.round(t, ST[j]).to(dt)
                dv = (q - QT[j]) * ST[j]
                if not bool(dv.any()):
                    continue
                QT[j] = q
                ET[j] += dv
                D[j - i1] = dv
                PT[i1:i2].addmm_(Hd[i1:i2, j:j + 1], dv[None, :])    # addr_ is ~100x slower here
            if i1 > 0:
                PT[:i1].addmm_(Hd[:i1, i1:i2], D)
            if i2 < cols:
                PT[i2:].addmm_(Hd[i2:, i1:i2], D)
        if torch.equal(before, QT):
            break
    return QT.T.to(torch.int8).contiguous(), int((QT != start).sum())


def reference_codes(w: torch.Tensor, tier: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of the reference quantizer (bonsai_runner.quants) for Q8_0 / Q4_0, so a
    tensor quantized without calibration gets exactly the bytes of the reference blocks."""
    from .. import quants

    rows, cols = w.shape
    wn = w.detach().to("cpu", torch.float32).numpy()
    raw = np.asarray(quants.quantize(wn, tier)).reshape(rows, -1)
    if tier == "q8_0":
        blk = raw.view(np.dtype([("d", "<f2"), ("qs", "i1", (32,))])).reshape(rows, -1)
        codes = blk["qs"].reshape(rows, cols)
    elif tier == "q4_0":
        blk = raw.view(np.dtype([("d", "<f2"), ("qs", "u1", (16,))])).reshape(rows, -1)
        lo, hi = blk["qs"] & 0x0F, blk["qs"] >> 4
        codes = (np.concatenate([lo, hi], axis=-1).astype(np.int16) - 8).reshape(rows, cols)
    else:
        raise BonsaiError(f"no reference block quantizer for tier {tier!r}")
    return (torch.from_numpy(codes.astype(np.int8)).to(w.device),
            torch.from_numpy(blk["d"].astype(np.float32)).to(w.device, w.dtype))


def quantize_rtn(w: torch.Tensor, g: Grid, h: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain per-group fit without error feedback (exact ternary fit / the type's rule), under
    the column importances h [cols] when given."""
    rows, cols = w.shape
    if cols % g.group:
        raise BonsaiError(f"{cols} input columns do not split into groups of {g.group}")
    wg = w.reshape(rows, cols // g.group, g.group)
    if g.ternary:
        codes, scales = fit_ternary_groups(wg, None if h is None else h.reshape(-1, g.group))
        return codes.reshape(rows, cols), scales
    hg = None if h is None else h.reshape(-1, g.group)
    scales = torch.stack([g.group_scale(wg[:, i], None if hg is None else hg[i])
                          for i in range(wg.shape[1])], 1)
    codes = g.round(wg, scales[..., None])
    return codes.reshape(rows, cols), scales


def quantize_absmean(w: torch.Tensor, g: Grid) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest ternary without data (the RTN baseline, BitNet b1.58's absmean rule):
    per group s = mean |w| (float16), codes = clip(round(w / s), -1, 1), i.e. threshold s / 2."""
    rows, cols = w.shape
    if cols % g.group:
        raise BonsaiError(f"{cols} input columns do not split into groups of {g.group}")
    wg = w.reshape(rows, cols // g.group, g.group)
    s = to_fp16(wg.abs().mean(dim=2))
    pos = s > 0
    q = torch.where(pos[..., None], torch.round(wg / torch.where(pos, s, torch.ones_like(s))[..., None]),
                    torch.zeros_like(wg))
    return q.clamp(-1, 1).to(torch.int8).reshape(rows, cols), s


@dataclass
class LayerResult:
    tier: str
    codes: torch.Tensor      # int8 [rows, cols], on the quantizer's device
    scales: torch.Tensor     # float16-exact [rows, cols / group]
    err_plain: float | None  # relative output error of the plain per-group fit
    err_gptq: float | None   # ... after the GPTQ sweep
    err: float | None        # ... final (after the least-squares scale refit)
    cosine: float | None = None   # output cosine of the final weights (ErrorMeter)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.codes, self.scales, grid(self.tier).group, dtype)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes int8, scales float32) as numpy arrays on the host, for the writer."""
        return (self.codes.cpu().numpy(), self.scales.to("cpu", torch.float32).numpy())


CD_SWEEPS = 2       # coordinate-descent sweeps after GPTQ on the coarse tiers (see below)


def quantize_layer(w: torch.Tensor, H: torch.Tensor, tier: str, damp: float = 0.01,
                   prep: HessianPrep | None = None, cd_sweeps: int = CD_SWEEPS) -> LayerResult:
    """Plain fit (for the log), GPTQ sweep, least-squares scale refit, and on the coarse tiers
    (ternary, four-level Q2_0) `cd_sweeps` sweeps of coordinate descent on the codes followed by
    another refit; keeps the best. `prep`: prepare_hessian(H, damp), when the caller shares it
    between layers.

    Coordinate descent is for the coarse tiers only: measured on Qwen2.5-Coder-0.5B block 3
    (rotated, 12 x 256 calibration) two sweeps + refit lower the relative output error of
    q/k/v/o/gate/up by 5-7% and of a ternary down_proj by 13% (0.0299 -> 0.0259), two more sweeps
    only 1-2% more; on the four-level Q2_0 by 3-5% (held-out error, q_proj 0.157 -> 0.151); at
    Q4_0 the same two sweeps gain 1-4%, not worth their time (about one more GPTQ sweep per
    layer)."""
    g = grid(tier)
    meter = ErrorMeter(w, H)
    pc, ps = plain_fit(w, H, tier)
    err_plain, cos_plain = meter.metrics(dequantize(pc, ps, g.group, w.dtype))
    codes, scales = quantize_gptq(w, H, g, damp, prep=prep)
    q_gptq = dequantize(codes, scales, g.group, w.dtype)
    codes, scales, qh_gptq, qh = _refit(w, codes, scales, H, g)
    err_gptq = meter.metrics(q_gptq, qh_gptq)[0]
    err, cos = meter.metrics(dequantize(codes, scales, g.group, w.dtype), qh)
    if g.coarse and cd_sweeps:
        c2, _ = coordinate_descent(w, codes, scales, H, g, cd_sweeps)
        c2, s2, _, qh2 = _refit(w, c2, scales, H, g)
        err2, cos2 = meter.metrics(dequantize(c2, s2, g.group, w.dtype), qh2)
        if err2 < err:
            codes, scales, err, cos = c2, s2, err2, cos2
    if err_plain < err:
        codes, scales, err, cos = pc, ps, err_plain, cos_plain
    return LayerResult(tier, codes, scales, err_plain, err_gptq, err, cos)
