"""Scale refinement: Adam on the log-scales of a block's quantized layers against the block output.

With the codes T fixed, each quantized weight is W(theta) = T * (sign0 * exp(theta)) per group
(sign0: the sign of the initial scale; groups whose scale is 0 stay 0). The loss is the block's
relative output error on the calibration hidden states x (the quantized-model inputs):

    L = sum (block(x; W(theta)) - target)^2 / sum (target - x)^2

i.e. the error relative to what the block adds to the residual stream; target is the float
block's output (or the float model's own hidden states after this block). Gradients come from
torch autograd through transformers' forward of the layer (hf_layers.py), so every architecture
it implements is refined through its reference code; torch.optim.Adam takes the steps.

Each step uses a batch of `batch` calibration sequences drawn with `seed` (deterministic); the
loss on all sequences is reported after every step. Scales are rounded to float16 at the end, and
kept only if that lowers the full-set loss.
"""

from __future__ import annotations

import numpy as np
import torch


def refine_block(x: torch.Tensor, target: torch.Tensor, run, stored: dict, qw: dict,
                 steps: int, lr: float, batch: int, seed: int, log=None) -> dict:
    """Refines the scales of `stored` (key -> (LayerResult, info)) in place; updates qw.

    x, target: [N, T, d] (host or device); run(weights, xb) -> block output of hidden states xb
    with the weights `weights` (key -> tensor) on the device, differentiable."""
    from .gptq import grid
    from .ternary_fit import to_fp16

    keys = [k for k, (res, _) in stored.items() if bool(res.codes.any())]
    dev = next(iter(qw.values())).device

    def loss_all(weights) -> float:
        tot = 0.0
        with torch.no_grad():
            for b in range(0, x.shape[0], batch):
                y = run(weights, x[b:b + batch].to(dev))
                tot += float(((y - target[b:b + batch].to(dev)) ** 2).sum(dtype=torch.float64))
        return tot / denom

    denom = float(sum(float(((target[b:b + batch] - x[b:b + batch]) ** 2).sum(dtype=torch.float64))
                      for b in range(0, x.shape[0], batch))) or 1.0
    before = loss_all(qw)
    if not keys:
        return {"before": before, "after": before, "steps": [], "kept": False}
    codes = {k: stored[k][0].codes.to(torch.float32) for k in keys}
    group = {k: grid(stored[k][0].tier).group for k in keys}
    live = {k: stored[k][0].scales != 0 for k in keys}
    sign = {k: torch.where(stored[k][0].scales < 0, -1.0, 1.0) for k in keys}
    theta = {k: torch.nn.Parameter(torch.log(torch.where(live[k], stored[k][0].scales.abs(),
                                                         torch.ones_like(stored[k][0].scales))))
             for k in keys}

    def scales(k, th):
        return torch.where(live[k], sign[k] * torch.exp(th), torch.zeros_like(th))

    def weight(k, s):
        rows, cols = codes[k].shape
        return (codes[k].reshape(rows, -1, group[k]) * s.reshape(rows, -1, 1)).reshape(rows, cols)

    opt = torch.optim.Adam([theta[k] for k in keys], lr=lr, betas=(0.9, 0.999), eps=1e-8)
    rng = np.random.default_rng(seed)
    history = []
    trial = dict(qw)
    for _ in range(steps):
        idx = np.sort(rng.choice(x.shape[0], size=min(batch, x.shape[0]), replace=False))
        ii = torch.from_numpy(idx)
        xb, tb = x[ii].to(dev), target[ii].to(dev)
        for k in keys:
            trial[k] = weight(k, scales(k, theta[k]))
        y = run(trial, xb)
        loss = ((y - tb) ** 2).sum() * (x.shape[0] / len(idx) / denom)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for k in keys:
                trial[k] = weight(k, scales(k, theta[k]))
        history.append(loss_all(trial))
        if log:
            log(f"  step {len(history)}/{steps}: block output error {history[-1]:.6f}")
    with torch.no_grad():
        final = {k: to_fp16(scales(k, theta[k])) for k in keys}
        for k in keys:
            trial[k] = weight(k, final[k])
    after = loss_all(trial)
    kept = after < before
    if kept:
        for k in keys:
            stored[k][0].scales = final[k]
            qw[k] = trial[k]
    return {"before": before, "after": after if kept else before, "after_trial": after,
            "steps": history, "kept": kept}
