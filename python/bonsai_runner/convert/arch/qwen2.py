"""The qwen2 family (Qwen1.5, Qwen2, Qwen2.5): GGUF architecture `qwen2`.

The shared decoder plus biases on the q/k/v projections. llama.cpp runs qwen2 with the neox
(rotate-halves) rope, the same layout as Hugging Face, so no row permutation.
"""

from __future__ import annotations

from . import register
from .base import DecoderFamily


@register("Qwen2ForCausalLM")
class Qwen2Family(DecoderFamily):
    gguf_arch = "qwen2"
    qkv_bias = True
