"""The qwen3 family (dense Qwen3): GGUF architecture `qwen3`.

The shared decoder without q/k/v biases, with an RMSNorm over every q and k head (`q_norm`,
`k_norm`, one weight of head_dim) and usually an explicit head_dim that differs from
hidden_size / heads (written as attention.key_length/value_length). Neox rope, no permutation.
"""

from __future__ import annotations

from . import register
from .base import DecoderFamily


@register("Qwen3ForCausalLM")
class Qwen3Family(DecoderFamily):
    gguf_arch = "qwen3"
    qk_norm = True

    def read_hparams(self, c: dict):
        hp = super().read_hparams(c)
        hp.attn_bias = bool(c.get("attention_bias", False))
        return hp
