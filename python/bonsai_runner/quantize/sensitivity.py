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
Torch tensors throughout; the final norm is the model's own module (hf_layers.HfLayers.final_norm).
"""

from __future__ import annotations

import numpy as np
import torch


def output_metrics(w: torch.Tensor, q: torch.Tensor, H: torch.Tensor) -> tuple[float, float]:
    """(cosine, rel_err) of the layer outputs W X and Q X (see the file header)."""
    from .gptq import ErrorMeter

    rel, cos = ErrorMeter(w, H).metrics(q)
    return cos, rel


def cross_entropy(hidden: torch.Tensor, tokens: np.ndarray, final_norm, head: torch.Tensor
                  ) -> float:
    """Mean next-token cross-entropy (nats) of final hidden states [N, T, d] for tokens [N, T];
    final_norm maps hidden states through the model's final norm."""
    with torch.no_grad():
        f = final_norm(hidden[:, :-1].to(head.device))
        logits = (f.reshape(-1, f.shape[-1]) @ head.T).double()
        tgt = torch.from_numpy(np.ascontiguousarray(tokens[:, 1:]).reshape(-1)).to(head.device)
        return float(torch.nn.functional.cross_entropy(logits, tgt))


HELD_OUT_LEN = 256      # tokens of each held-out sequence (the first ones of the sequence)


def held_out_split(tokens: np.ndarray, held_out: int) -> tuple[np.ndarray, np.ndarray]:
    """(calibration tokens, held-out tokens) of --sensitivity-analysis: the last `held_out`
    sequences (at most a quarter of them, at least one), cut to HELD_OUT_LEN tokens, are held
    out; with a single sequence it is both (the tokens array itself is returned)."""
    n_h = min(held_out, max(tokens.shape[0] // 4, 1))
    held = tokens[-n_h:, :min(tokens.shape[1], HELD_OUT_LEN)]
    return (tokens[:-n_h] if tokens.shape[0] > n_h else tokens), held


class HeldOut:
    """The held-out float stream, the all-quantized stream and one branch per quantized block."""

    def __init__(self, tokens: np.ndarray, embed: torch.Tensor, embed_stored: torch.Tensor):
        self.tokens = tokens
        idx = torch.from_numpy(tokens.astype(np.int64))
        self.fp = embed[idx]
        self.quant = embed_stored[idx]
        self.branches: dict[int, torch.Tensor] = {}

    def step(self, i: int, fp_block, q_block) -> None:
        """Block i: fp_block / q_block map hidden states through the float / quantized block."""
        self.branches[i] = q_block(self.fp)
        self.quant = q_block(self.quant)
        self.fp = fp_block(self.fp)

    def losses(self, n_layer: int, load_fp_block, final_norm, head) -> dict:
        """Second sweep (see the file header); returns loss_fp, loss_quantized, per-block deltas.

        load_fp_block(j) returns a function mapping hidden states through float block j.
        """
        states: dict[int, torch.Tensor] = {}
        for j in range(n_layer):
            if states:
                fp_block = load_fp_block(j)
                keys = sorted(states)
                n = self.fp.shape[0]
                out = fp_block(torch.cat([states[i] for i in keys], dim=0))
                for k, i in enumerate(keys):
                    states[i] = out[n * k: n * (k + 1)]
                del fp_block
            if j in self.branches:
                states[j] = self.branches.pop(j)
        loss_fp = cross_entropy(self.fp, self.tokens, final_norm, head)
        deltas = {i: cross_entropy(s, self.tokens, final_norm, head) - loss_fp
                  for i, s in sorted(states.items())}
        return {"loss_fp": loss_fp,
                "loss_quantized": cross_entropy(self.quant, self.tokens, final_norm, head),
                "block_loss_delta": deltas}
