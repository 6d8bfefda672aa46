"""How much the model's output cares about each output channel of each linear layer (--target-bpw).

The bit budget of --target-bpw is spent where it lowers the quantized model's divergence from the
float model most per bit, so the pre-pass needs, for every layer and tier, the divergence that the
layer's quantization error causes. To second order, the KL divergence of the next-token
distributions after a small change dz of the logits is KL(p || p') ~ 1/2 dz^T (diag p - p p^T) dz,
and through the layer's output y (dz = J dy) the curvature J^T (diag p - p p^T) J is the model's
Fisher information at y, E_{u ~ p}[g_u g_u^T] with g_u = d(-log p(u))/dy. Keeping its diagonal
and assuming g^2 and dy^2 independent over positions t,

    KL summed over positions ~ 1/2 sum_r F_r * sum_t dy_tr^2 / T,    F_r = sum_t g_tr^2,

with dy = (W - Q) x the layer's output error. With H = 2 X^T X / T (the pipeline's Hessians)
sum_t dy_tr^2 / T = e_r H e_r^T / 2, so the predicted KL per position of a layer quantized to Q is

    sum_r F_r e_r H e_r^T / (4 T)                                          (`predicted_loss`).

Unlike the layer's relative output error it knows that the same relative error costs more in one
layer than in another (a value projection that every later block reads, a layer whose outputs a
later norm amplifies) and which output channels of a layer matter.

F comes from one backward pass of the float model (`output_fisher`): the block inputs kept by the
pre-pass's forward; at the head, one label per position drawn from the float model's own
next-token distribution (the Monte-Carlo estimate of the true Fisher: the labels of the text would
give the "empirical" Fisher, which is not the KL's curvature where the model is unsure), the
cross-entropy of those labels in chunks of HEAD_CHUNK positions (a 152k vocabulary's logits for
all positions at once would not fit); then block by block from the last to the first, each block
re-run with autograd from its kept input (transformers' own layer, hf_layers.py) with hooks on
its linear modules' outputs. It costs about three forward passes of the Fisher's tokens; at most
FISHER_TOKENS calibration tokens (whole sequences) are used, enough for a per-channel mean of
squares, and they bound the kept block inputs (n_layer x tokens x hidden floats: 24 x 8192 x 896
x 4 B = 0.7 GiB for Qwen2.5-0.5B; a 60-layer 5120-wide model keeps them in bfloat16, 5 GiB).
"""

from __future__ import annotations

import numpy as np
import torch

from .hf_layers import HF_KEYS

FISHER_TOKENS = 8192       # calibration tokens (whole sequences) of the Fisher estimate
HEAD_CHUNK = 512           # tokens per chunk of the head's logits
KEEP_BF16_ABOVE = 1 << 30  # kept block inputs above this many bytes in float32 are kept in bfloat16


def fisher_sequences(n_seq: int, seq_len: int) -> int:
    """How many of the calibration sequences the Fisher estimate uses (>= 1)."""
    return max(1, min(n_seq, FISHER_TOKENS // max(seq_len, 1)))


def keep_dtype(n_layer: int, x: torch.Tensor) -> torch.dtype:
    """float32, or bfloat16 when n_layer copies of x would exceed KEEP_BF16_ABOVE bytes."""
    return torch.bfloat16 if n_layer * x.numel() * 4 > KEEP_BF16_ABOVE else torch.float32


def _head_gradient(h: torch.Tensor, tokens: np.ndarray, final_norm, head: torch.Tensor,
                   seed: int) -> tuple[torch.Tensor, float]:
    """(dL/dh [N, T, d] on the host, the mean next-token cross-entropy of `tokens`) where L is the
    summed cross-entropy of labels SAMPLED from the float model's own next-token distribution at
    every position (one per position, torch generator seeded with `seed`): the Monte-Carlo
    estimate of the true Fisher (file header)."""
    N, T, d = h.shape
    dev = head.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    grad = torch.zeros((N, T, d), dtype=torch.float32)
    total, count = 0.0, 0
    tgt_all = torch.from_numpy(np.ascontiguousarray(tokens[:, 1:]).astype(np.int64))
    for n in range(N):
        for t0 in range(0, T, HEAD_CHUNK):
            t1 = min(t0 + HEAD_CHUNK, T)
            hc = h[n, t0:t1].to(dev, torch.float32).requires_grad_(True)
            with torch.enable_grad():
                logits = final_norm(hc) @ head.T
                with torch.no_grad():
                    y = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
                    k = min(t1, T - 1) - t0      # positions with a next token in the text
                    if k > 0:
                        total += float(torch.nn.functional.cross_entropy(
                            logits[:k], tgt_all[n, t0:t0 + k].to(dev), reduction="sum"))
                        count += k
                torch.nn.functional.cross_entropy(logits, y, reduction="sum").backward()
            grad[n, t0:t1] = hc.grad.to("cpu")
    return grad, total / max(count, 1)


def output_fisher(runner, n_layer: int, block_weights, inputs: list[torch.Tensor],
                  final_hidden: torch.Tensor, tokens: np.ndarray, final_norm, head: torch.Tensor,
                  keys_of, progress=None, seed: int = 0
                  ) -> tuple[dict[tuple[int, str], torch.Tensor], float]:
    """({(block, key): F [rows] on the host}, the float model's mean loss on these tokens).

    runner: the pipeline's BlockRunner; block_weights(i) -> block i's float weights (short keys,
    on the device); inputs[i]: block i's input hidden states [N, T, d] (host); final_hidden: the
    last block's output; keys_of(i): the linear keys of block i whose Fisher is wanted;
    progress(i): called after each block."""
    g, loss = _head_gradient(final_hidden, tokens, final_norm, head, seed)
    out: dict[tuple[int, str], torch.Tensor] = {}
    dev = runner.device
    for i in reversed(range(n_layer)):
        w = block_weights(i)
        keys = keys_of(i)
        layer = runner.layers.layers[i]
        acc = {k: None for k in keys}
        hooks = []

        def on_output(key):
            def fwd(mod, args, y):
                def bwd(gy):
                    s = gy.float().reshape(-1, gy.shape[-1]).pow(2).sum(0)
                    acc[key] = s if acc[key] is None else acc[key] + s
                y.register_hook(bwd)
            return fwd

        for k in keys:
            hooks.append(layer.get_submodule(HF_KEYS[k].rsplit(".", 1)[0])
                         .register_forward_hook(on_output(k)))
        x_in = inputs[i]
        g_in = torch.empty((x_in.shape[0],) + tuple(x_in.shape[1:]), dtype=torch.float32)
        try:
            for b in range(0, x_in.shape[0], runner.batch):
                xb = x_in[b:b + runner.batch].to(dev, torch.float32).requires_grad_(True)
                with torch.enable_grad():
                    y = runner.run(i, w, xb)
                    y.backward(g[b:b + runner.batch].to(dev))
                g_in[b:b + xb.shape[0]] = xb.grad.to("cpu")
        finally:
            for h in hooks:
                h.remove()
        for k in keys:
            out[(i, k)] = acc[k].to("cpu")
        g = g_in
        inputs[i] = None          # free the block's kept input as soon as it is used
        del w
        if progress:
            progress(i)
    return out, loss


def predicted_loss(row_err: torch.Tensor, fisher_rows: torch.Tensor, n_tokens: int) -> float:
    """Predicted loss increase per token (nats) of a layer whose rows have output errors
    row_err[r] = e_r H e_r^T (H = 2 X^T X / T), from the output-channel Fisher F (file header)."""
    return float((fisher_rows.to(row_err.dtype) * row_err).sum(dtype=torch.float64)) \
        / (4.0 * max(n_tokens, 1))


__all__ = ["FISHER_TOKENS", "fisher_sequences", "keep_dtype", "output_fisher", "predicted_loss"]
