"""Activation-aware equivalent channel scaling before ternary fitting (AWQ / SmoothQuant style).

Why: the exact ternary fit chooses a group's non-zero codes by a threshold on |w| alone (the
calibration importance only moves the scale; ternary_fit.py), so a weight on an input channel that
carries large activations is zeroed as readily as one on a quiet channel. Scaling input column j
of a layer by s_j > 0 and dividing its input by s_j leaves the float function unchanged but lets
the fit keep the salient columns.

Exact transforms used (per block, before its layers are quantized):
    q/k/v     columns * s, input_layernorm weight / s      (the norm output is their only input)
    gate/up   columns * s, post_attention_layernorm / s
    o_proj    columns * s, v_proj rows / s (and v bias / s): the o input of head h is
              softmax(..) v of KV head h // (n_head / n_head_kv), so s is one vector per KV head,
              repeated over the query heads sharing it; v is already quantized when o is reached,
              so 1/s is folded into v's group scales (codes unchanged, scales re-rounded to fp16)
The layer-output error is invariant: with X' = X / s and W' = W s, (W' - Q') X' = (W - Q'/s) X,
so H' = H / (s s^T) measures the same error as before.

Measured on Qwen2.5-Coder-0.5B (12 x 256 calibration tokens): the grid keeps alpha = 0 for q/k/v
and gate/up in every block seen (the plain-fit proxy finds no gain: with only three levels a
column scaled up is clipped as often as it is helped), and picks 0.15-0.45 for o_proj, where the
final GPTQ errors moved by -6% .. +1% (mean over all layers -0.1%); end to end it was worse
(mean KL 2.65 against 2.42 without, 4 x 512 tokens of the built-in evaluation text). Hence
opt-in (--equalize).

Choice of s: s_j = a_j ^ alpha with a_j = sqrt(H_jj / 2) (the RMS of input j over the calibration
tokens), normalized by sqrt(max * min); alpha from a small grid (alpha = 0 is the identity), chosen
per stage by the summed relative layer-output error of the plain importance-weighted ternary fit on
an evenly spaced subset of rows (the error is a sum over rows, so a row subset estimates it
without bias and costs a fraction of the full fit).
"""

from __future__ import annotations

import torch

from .gptq import dequantize, grid
from .ternary_fit import fit_ternary_matrix

ALPHAS = (0.0, 0.15, 0.3, 0.45, 0.6, 0.75)
SEARCH_ROWS = 768


def _rows(w: torch.Tensor, n: int) -> torch.Tensor:
    if w.shape[0] <= n:
        return w
    return w[torch.linspace(0, w.shape[0] - 1, n, dtype=torch.float64).round().long()]


def _stage_error(ws: list[torch.Tensor], H: torch.Tensor, s: torch.Tensor, tier: str) -> float:
    """Summed relative output error of the plain ternary fit of the column-scaled weights."""
    g = grid(tier)
    Hs = H / torch.outer(s, s)
    h = torch.diagonal(Hs).clamp_min(0.0)
    total = 0.0
    for w in ws:
        wsub = _rows(w, SEARCH_ROWS) * s
        codes, scales = fit_ternary_matrix(wsub, g.group, h)
        e = wsub - dequantize(codes, scales, g.group, wsub.dtype)
        num = float(((e @ Hs) * e).sum(dtype=torch.float64))
        den = float(((wsub @ Hs) * wsub).sum(dtype=torch.float64))
        total += (max(num, 0.0) / den) ** 0.5 if den > 0 else 0.0
    return total


def channel_rms(H: torch.Tensor) -> torch.Tensor:
    """Per-input RMS over the calibration tokens from H = 2 X^T X / tokens."""
    return torch.sqrt(torch.diagonal(H).clamp_min(0.0) / 2.0)


def choose_scales(ws: list[torch.Tensor], H: torch.Tensor, tier: str,
                  tie_groups: torch.Tensor | None = None, alphas=ALPHAS
                  ) -> tuple[torch.Tensor, float, float, float]:
    """(s [cols] float32, alpha, error at alpha 0, error at the chosen alpha) for one stage.

    tie_groups: None, or an int tensor [cols] of group ids whose columns must get equal scales
    (o_proj: columns of query heads that share a KV head); the RMS is averaged inside a group."""
    a = channel_rms(H).double()
    if tie_groups is not None:
        tg = tie_groups.to(a.device)
        sums = torch.bincount(tg, weights=a * a)
        cnt = torch.bincount(tg)
        a = torch.sqrt(sums / cnt.clamp_min(1))[tg]
    live = a > 0
    if not bool(live.any()):
        return torch.ones(H.shape[0], device=H.device), 0.0, 0.0, 0.0
    a = torch.where(live, a, a[live].min())
    best = None
    err0 = None
    for alpha in alphas:
        s = a ** alpha
        s = (s / torch.sqrt(s.max() * s.min())).to(torch.float32)
        err = _stage_error(ws, H, s.to(H.dtype), tier)
        if alpha == 0.0:
            err0 = err
        if best is None or err < best[2]:
            best = (s, alpha, err)
    s, alpha, err = best
    if err0 is None:
        err0 = err
    if alpha == 0.0:
        s = torch.ones_like(s)
    return s, float(alpha), float(err0), float(err)


def o_tie_groups(n_head: int, n_head_kv: int, head_dim: int) -> torch.Tensor:
    """Group id of every o_proj input column: (KV head of its query head, dim)."""
    rep = n_head // n_head_kv
    col = torch.arange(n_head * head_dim)
    return (col // head_dim // rep) * head_dim + col % head_dim


def v_row_scales(s_o: torch.Tensor, n_head: int, n_head_kv: int, head_dim: int) -> torch.Tensor:
    """The per-v-row divisor [n_head_kv * head_dim] matching o_proj column scales s_o."""
    rep = n_head // n_head_kv
    return s_o.reshape(n_head, head_dim)[::rep].reshape(-1)
