"""The llama family (Llama 1/2/3, Mistral): GGUF architecture `llama`.

Differences from the shared decoder (arch/base.py): llama.cpp runs `llama` with the pairwise
("normal") rope, so q_proj/k_proj rows are permuted (see base.permute_rope_rows), and the Llama 3.1
"llama3" rope scaling is stored as a `rope_freqs.weight` F32 tensor of per-frequency divisors,
computed as llama.cpp's converter does:

    freq_i   = 1 / theta^(2i / d)                      i < d/2, d = head_dim
    wavelen  = 2 pi / freq_i
    factor_i = 1                 if wavelen < L / high_freq_factor
             = factor            if wavelen > L / low_freq_factor
             = 1 / ((1 - s) / factor + s),  s = (L / wavelen - low) / (high - low)   otherwise
with L = original_max_position_embeddings (defaults 8192, factor 8, low 1, high 4), all in float32.
"""

from __future__ import annotations

import math

import numpy as np

from . import register
from .base import DecoderFamily


def llama3_rope_factors(rope_scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    f32 = np.float32
    freqs = f32(1.0) / (f32(theta) ** (np.arange(0, head_dim, 2, dtype=f32) / f32(head_dim)))
    factor = f32(rope_scaling.get("factor", 8.0))
    low = f32(rope_scaling.get("low_freq_factor", 1.0))
    high = f32(rope_scaling.get("high_freq_factor", 4.0))
    old_ctx = f32(rope_scaling.get("original_max_position_embeddings", 8192))
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    out = np.empty(len(freqs), dtype=f32)
    for i, freq in enumerate(freqs):
        wavelen = f32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out[i] = 1.0
        elif wavelen > low_wavelen:
            out[i] = factor
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out[i] = f32(1.0) / ((f32(1.0) - smooth) / factor + smooth)
    return out


@register("LlamaForCausalLM", "MistralForCausalLM")
class LlamaFamily(DecoderFamily):
    gguf_arch = "llama"
    rope_pairwise = True

    def rope_scaling_types(self) -> tuple[str, ...]:
        return ("linear", "yarn", "llama3")

    def check_rope_scaling(self, rs: dict) -> None:
        if rs.get("rope_type", rs.get("type")) == "llama3":
            return
        super().check_rope_scaling(rs)

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        rs = self.hp.rope_scaling
        if rs.get("rope_type", rs.get("type")) != "llama3":
            return []
        return [("rope_freqs.weight",
                 llama3_rope_factors(rs, self.hp.rope_theta, self.hp.head_dim))]
