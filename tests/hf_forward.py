"""An independent float64 forward pass written directly on Hugging Face weights (test oracle).

It follows the transformers modelling code's conventions, not llama.cpp's: weights keep their HF
names and layout (`model.layers.{i}.self_attn.q_proj.weight`, [out, in]), q/k are NOT permuted, and
rope uses `rotate_half` on the two halves of each head with the frequencies repeated
(cos = cos(concat(freqs, freqs))). A GGUF produced from the same weights gives the same logits under
`bonsai_runner.reference` only if the converter's q/k permutation (llama) and the reference's rope
modes (normal vs neox) agree with this, which is what the tests using it check.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def load_hf(model_dir: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """config.json and every *.safetensors tensor of a HF model directory, as float64."""
    from safetensors.numpy import load_file

    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    weights = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        for name, value in load_file(str(f)).items():
            weights[name] = value.astype(np.float64)
    return cfg, weights


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def hf_logits(cfg: dict, w: dict[str, np.ndarray], tokens) -> np.ndarray:
    """Logits [n_tokens, vocab] of a LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM."""
    model_type = cfg["model_type"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    eps = cfg["rms_norm_eps"]
    theta = cfg.get("rope_theta", 10000.0)
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "default", "linear"):
        raise NotImplementedError(f"rope_scaling {kind} is not modelled by this oracle")
    factor = float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0

    tokens = np.asarray(tokens)
    n = tokens.size
    pos = np.arange(n, dtype=np.float64) / factor
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    freqs = np.outer(pos, inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    mask = np.triu(np.full((n, n), -np.inf), k=1)

    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."

        def lin(name, inp):
            y = inp @ w[p + name + ".weight"].T
            b = w.get(p + name + ".bias")
            return y if b is None else y + b

        h = _rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = lin("self_attn.q_proj", h).reshape(n, n_head, head_dim)
        k = lin("self_attn.k_proj", h).reshape(n, n_kv, head_dim)
        v = lin("self_attn.v_proj", h).reshape(n, n_kv, head_dim)
        if model_type == "qwen3":
            q = _rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = n_head // n_kv
        k = np.repeat(k, rep, axis=1)  # repeat_kv: query head h uses kv head h // rep
        v = np.repeat(v, rep, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim) + mask
        scores -= scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, n_head * head_dim)
        x = x + lin("self_attn.o_proj", attn)

        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = lin("mlp.gate_proj", h)
        x = x + lin("mlp.down_proj", gate / (1.0 + np.exp(-gate)) * lin("mlp.up_proj", h))

    x = _rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings", False):
        head = w["model.embed_tokens.weight"]
    return x @ head.T
