"""A float64 numpy forward pass of a Hugging Face Qwen3.5 text model, written from HF's semantics.

It reads the checkpoint's own tensors (Hugging Face names and layouts: grouped V heads, `1 + w`
norms, A_log), not a converted file, so it is an oracle for the converter and the engine alike.
What it computes, layer by layer (x: [T, n_embd]):

    h = rms(x) * (1 + input_layernorm)
    GDN layer (linear_attention):
        qkv = h W_qkv^T; z = h W_z^T; beta = sigmoid(h W_b^T); g = -exp(A_log) * softplus(h W_a^T + dt_bias)
        qkv = silu(causal depthwise conv1d(qkv))    kernel K, K-1 zeros before the first token
        q, k: [T, K_heads, dk]; v: [T, V_heads, dv]; q, k <- x * rsqrt(sum(x^2) + 1e-6) per head
        V head h reads K head h // (V_heads / K_heads) (grouped order); q <- q / sqrt(dk)
        per token, per V head with state S [dk, dv] (zero at the start):
            S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
        o <- rms(o) * norm.weight * silu(z)  (per V head, eps rms_norm_eps); out = o W_out^T
    attention layer (full_attention):
        [q | gate] per head = h W_q^T ([T, heads, 2 * head_dim]); k = h W_k^T; v = h W_v^T
        q, k <- rms(.) * (1 + q_norm / k_norm) per head
        rotate-halves (neox) rope on the first head_dim * partial_rotary_factor dims, theta from
        rope_parameters (text positions are equal in every M-RoPE section: plain partial rope)
        causal softmax(q k^T / sqrt(head_dim)) v, GQA (query head h reads KV head h // (heads / kv));
        out = (o * sigmoid(gate)) W_o^T
    x += out;  x += down(silu(gate(h2)) * up(h2)),  h2 = rms(x) * (1 + post_attention_layernorm)
    logits = (rms(x) * (1 + norm)) W_head^T   (W_head = embed_tokens when tied)
"""

from __future__ import annotations

import numpy as np


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def gdn_mixer(t: dict, p: str, cfg: dict, h: np.ndarray) -> np.ndarray:
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    T = h.shape[0]
    qkv = h @ t[p + "in_proj_qkv.weight"].T
    z = (h @ t[p + "in_proj_z.weight"].T).reshape(T, n_v, dv)
    beta = _sigmoid(h @ t[p + "in_proj_b.weight"].T)                       # [T, n_v]
    g = -np.exp(t[p + "A_log"]) * _softplus(h @ t[p + "in_proj_a.weight"].T + t[p + "dt_bias"])
    w = t[p + "conv1d.weight"][:, 0, :]                                      # [C, K]
    K = w.shape[1]
    padded = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv], axis=0)
    conv = sum(padded[j:j + T] * w[:, j] for j in range(K))
    conv = _silu(conv)
    q = _l2norm(conv[:, :n_k * dk].reshape(T, n_k, dk))
    k = _l2norm(conv[:, n_k * dk:2 * n_k * dk].reshape(T, n_k, dk))
    v = conv[:, 2 * n_k * dk:].reshape(T, n_v, dv)
    rep = n_v // n_k
    q, k = np.repeat(q, rep, axis=1) / np.sqrt(dk), np.repeat(k, rep, axis=1)
    S = np.zeros((n_v, dk, dv))
    o = np.empty((T, n_v, dv))
    for i in range(T):
        S = S * np.exp(g[i])[:, None, None]
        delta = (v[i] - np.einsum("hkv,hk->hv", S, k[i])) * beta[i][:, None]
        S = S + k[i][:, :, None] * delta[:, None, :]
        o[i] = np.einsum("hkv,hk->hv", S, q[i])
    o = _rms(o, cfg["rms_norm_eps"]) * t[p + "norm.weight"] * _silu(z)
    return o.reshape(T, n_v * dv) @ t[p + "out_proj.weight"].T


def _rope_parameters(cfg: dict) -> dict:
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}


def attention_mixer(t: dict, p: str, cfg: dict, h: np.ndarray) -> np.ndarray:
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, rp = cfg["rms_norm_eps"], _rope_parameters(cfg)
    T = h.shape[0]
    qg = (h @ t[p + "q_proj.weight"].T).reshape(T, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
    k = (h @ t[p + "k_proj.weight"].T).reshape(T, nkv, hd)
    v = (h @ t[p + "v_proj.weight"].T).reshape(T, nkv, hd)
    q = _rms(q, eps) * (1.0 + t[p + "q_norm.weight"])
    k = _rms(k, eps) * (1.0 + t[p + "k_norm.weight"])
    rot = int(hd * rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    inv = theta ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):
        lo, hi, rest = x[..., :rot // 2], x[..., rot // 2:rot], x[..., rot:]
        return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin, rest], axis=-1)

    q, k = rope(q), rope(k)
    rep = nh // nkv
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = np.einsum("hts,shd->thd", a, v).reshape(T, nh * hd)
    return (o * _sigmoid(gate)) @ t[p + "o_proj.weight"].T


def layer_types(cfg: dict) -> list[str]:
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    n = cfg.get("full_attention_interval", 4)
    return ["linear_attention" if (i + 1) % n else "full_attention"
            for i in range(cfg["num_hidden_layers"])]


def qwen35_forward(tensors: dict, cfg: dict, ids) -> np.ndarray:
    """Logits [T, vocab] (float64) of the text model for token ids `ids`.

    tensors: Hugging Face names of the CausalLM layout (model.*, lm_head.weight); cfg: the text
    config (config.json of Qwen3_5ForCausalLM, or text_config of the conditional model)."""
    t = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    eps = cfg["rms_norm_eps"]
    x = t["model.embed_tokens.weight"][np.asarray(ids)]
    for i, kind in enumerate(layer_types(cfg)):
        p = f"model.layers.{i}."
        h = _rms(x, eps) * (1.0 + t[p + "input_layernorm.weight"])
        if kind == "linear_attention":
            x = x + gdn_mixer(t, p + "linear_attn.", cfg, h)
        else:
            x = x + attention_mixer(t, p + "self_attn.", cfg, h)
        h = _rms(x, eps) * (1.0 + t[p + "post_attention_layernorm.weight"])
        up = h @ t[p + "mlp.up_proj.weight"].T
        x = x + (_silu(h @ t[p + "mlp.gate_proj.weight"].T) * up) @ t[p + "mlp.down_proj.weight"].T
    x = _rms(x, eps) * (1.0 + t["model.norm.weight"])
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return x @ head.T
