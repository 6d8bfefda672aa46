"""Block reconstruction (--calib-steps): Adam on the log-scales of a block's quantized layers.

With the codes T fixed (GPTQ's sweep and the coordinate descent of gptq.coordinate_descent, which
decide each code's rounding against the layer's output error), each quantized weight is
W(theta) = T * (sign0 * exp(theta)) per group (sign0: the sign of the initial scale; groups whose
scale is 0 stay 0). The loss is the block's relative output error on the calibration hidden
states x (the quantized model's inputs):

    L = sum (block(x; W(theta)) - target)^2 / sum (target - x)^2

i.e. the error relative to what the block adds to the residual stream; target is the float
block's output (or the float model's own hidden states after this block). Gradients come from
torch autograd through transformers' forward of the layer (hf_layers.py), so every architecture
it implements is reconstructed through its reference code; torch.optim.Adam takes the steps.

Early stopping: the last eighth of the calibration sequences (at least one; none with fewer than
four, then the loss is measured on all) is held out. Each step uses a batch of `batch` of the
others drawn with `seed` (deterministic) and reports its loss; every steps/8 steps (and after the
last) the scales rounded to float16 are scored on the held-out sequences, and the best seen --
GPTQ's own scales included -- is what the block keeps.

Why the codes are not learned here (measured on Qwen2.5-Coder-0.5B block 0, 12 x 256
calibration, 40 steps of batch 4, the held-out error of GPTQ's block 0.0717; scales alone reach
0.0552): a relaxed rounding variable per weight (AdaRound's rectified sigmoid, anchored at GPTQ's
code and its neighbour toward w / s) moved no code across in 40 steps (0.0623, the soft weights
having soaked up what the scales would have learned); hard codes with a straight-through gradient
under Adam flipped weights en masse (0.72 after 5 steps); moving the codes with the most
negative first-order gain made it worse from as few as 66 codes (0.0557 -> 0.0717: a code step
is too large for a first-order model). The exact per-layer coordinate descent lowers every
ternary layer's output error by 6-14% instead, at a cost near the GPTQ sweep's.
"""

from __future__ import annotations

import numpy as np
import torch


def _split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) sequence indices: the last eighth held out (>= 1) when n >= 4."""
    n_held = max(1, n // 8) if n >= 4 else 0
    idx = np.arange(n)
    return (idx[: n - n_held], idx[n - n_held:]) if n_held else (idx, idx)


def refine_block(x: torch.Tensor, target: torch.Tensor, run, stored: dict, qw: dict,
                 steps: int, lr: float, batch: int, seed: int, log=None) -> dict:
    """Reconstructs the block: learns the scales of `stored` (key -> (LayerResult, info)) in
    place and updates qw with the final weights.

    x, target: [N, T, d] (host or device); run(weights, xb) -> block output of hidden states xb
    with the weights `weights` (key -> tensor) on the device, differentiable. Returns the held-out losses before/after, the loss of
    every step on its batch, the held-out checkpoints and whether the result was kept."""
    from .gptq import grid
    from .ternary_fit import to_fp16

    keys = [k for k, (res, _) in stored.items() if bool(res.codes.any())]
    dev = next(iter(qw.values())).device
    train, held = _split(x.shape[0])

    def loss_on(weights, idx, denom) -> float:
        tot = 0.0
        with torch.no_grad():
            for j in range(0, len(idx), batch):
                ii = torch.from_numpy(idx[j:j + batch])
                y = run(weights, x[ii].to(dev))
                tot += float(((y - target[ii].to(dev)) ** 2).sum(dtype=torch.float64))
        return tot / denom

    d_held = float(sum(float(((target[int(i)] - x[int(i)]) ** 2).sum(dtype=torch.float64))
                       for i in held)) or 1.0
    d_train = float(sum(float(((target[int(i)] - x[int(i)]) ** 2).sum(dtype=torch.float64))
                        for i in train)) or 1.0
    before = loss_on(qw, held, d_held)
    out = {"before": before, "after": before, "steps": [], "checkpoints": [], "kept": False,
           "held_out_sequences": int(len(held)) if held is not train else 0}
    if not keys:
        return out
    res0 = {k: stored[k][0] for k in keys}
    group = {k: grid(res0[k].tier).group for k in keys}
    codes = {k: res0[k].codes.to(torch.float32) for k in keys}
    live = {k: res0[k].scales != 0 for k in keys}
    sign = {k: torch.where(res0[k].scales < 0, -1.0, 1.0) for k in keys}
    theta = {k: torch.nn.Parameter(torch.log(torch.where(live[k], res0[k].scales.abs(),
                                                         torch.ones_like(res0[k].scales))))
             for k in keys}

    def weights(k, fp16: bool = False):
        s = torch.where(live[k], sign[k] * torch.exp(theta[k]), torch.zeros_like(theta[k]))
        if fp16:
            s = to_fp16(s)
        rows, cols = codes[k].shape
        return (codes[k].reshape(rows, -1, group[k]) * s.reshape(rows, -1, 1)).reshape(rows,
                                                                                      cols), s

    opt = torch.optim.Adam([theta[k] for k in keys], lr=lr, betas=(0.9, 0.999), eps=1e-8)
    rng = np.random.default_rng(seed)
    eval_every = max(1, steps // 8)
    trial = dict(qw)
    best = (before, None)
    for step in range(steps):
        ib = np.sort(rng.choice(train, size=min(batch, len(train)), replace=False))
        ii = torch.from_numpy(ib)
        xb, tb = x[ii].to(dev), target[ii].to(dev)
        for k in keys:
            trial[k] = weights(k)[0]
        y = run(trial, xb)
        loss = ((y - tb) ** 2).sum() * (len(train) / len(ib) / d_train)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out["steps"].append(loss.item())
        if log:
            log(f"  step {step + 1}/{steps}: block output error {out['steps'][-1]:.6f} (batch)")
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            with torch.no_grad():
                now = {k: weights(k, fp16=True) for k in keys}
                for k in keys:
                    trial[k] = now[k][0]
                score = loss_on(trial, held, d_held)
            out["checkpoints"].append({"step": step + 1, "held_out": score})
            if log:
                log(f"  step {step + 1}: held-out block output error {score:.6f}")
            if score < best[0]:
                best = (score, {k: now[k][1].detach() for k in keys})
    if best[1] is None:
        return out
    out.update(after=best[0], kept=True,
               best_step=max(c["step"] for c in out["checkpoints"] if c["held_out"] == best[0]))
    for k in keys:
        res0[k].scales = best[1][k].contiguous()
        qw[k] = res0[k].dequantize()
    return out
