"""Float32 numpy forward of ONE decoder block (llama / qwen2 / qwen3) on Hugging Face weights.

    a   = rmsnorm(x) * attn_norm                         -> input of q/k/v   ("attn_in")
    q,k,v = a Wq^T (+bq), a Wk^T (+bk), a Wv^T (+bv)     [B, T, heads, head_dim]
    qwen3: q, k = rmsnorm over each head * q_norm / k_norm
    q, k = rope(q), rope(k)                              rotate-halves (HF / neox) layout
    o   = softmax(q k^T / sqrt(head_dim) + causal) v     grouped KV heads -> input of o ("o_in")
    h   = x + o Wo^T
    f   = rmsnorm(h) * ffn_norm                          -> input of gate/up ("ffn_in")
    m   = silu(f Wg^T) * (f Wu^T)                        -> input of down    ("down_in")
    out = h + m Wd^T

Rope: inv_freq_i = theta^(-2i/d) for i < d/2, angle = pos * inv_freq, q' = q cos + rotate_half(q) sin
with rotate_half([x1, x2]) = [-x2, x1] and cos/sin repeated over both halves, exactly as
transformers applies it to the HF weights (no row permutation here). "linear" rope scaling divides
positions by the factor, "llama3" divides each frequency by its factor (arch/llama.py's table).

`BlockWeights` names the block's tensors by short keys (q, k, v, o, gate, up, down, their biases,
the norms); `HF_KEYS` maps them to Hugging Face names. With `keep=True` the forward also returns
the intermediates that refine.py's backward pass needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BonsaiError

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
HF_KEYS = {
    "attn_norm": "input_layernorm.weight",
    "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
}
# Which captured activation feeds each linear layer.
INPUT_OF = {"q": "attn_in", "k": "attn_in", "v": "attn_in", "o": "o_in",
            "gate": "ffn_in", "up": "ffn_in", "down": "down_in"}
# Quantization stages inside a block: layers sharing an input are quantized together, and each
# stage sees the outputs of the already-quantized stages before it.
STAGES = (("q", "k", "v"), ("o",), ("gate", "up"), ("down",))


@dataclass
class BlockConfig:
    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    qk_norm: bool
    inv_freq: np.ndarray     # [head_dim / 2] float64
    pos_scale: float = 1.0   # positions are divided by this ("linear" rope scaling)

    @classmethod
    def from_family(cls, family) -> "BlockConfig":
        hp = family.hp
        d = hp.head_dim
        inv = 1.0 / (hp.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        rs = hp.rope_scaling or {}
        kind = rs.get("rope_type", rs.get("type"))
        pos_scale = 1.0
        if kind == "linear":
            pos_scale = float(rs["factor"])
        elif kind == "llama3":
            from ..convert.arch.llama import llama3_rope_factors

            inv = inv / llama3_rope_factors(rs, hp.rope_theta, d).astype(np.float64)
        elif kind not in (None, "default"):
            raise BonsaiError(f"config.json: rope_scaling {kind!r} is not supported by the "
                              "quantizer's calibration forward (supported: default, linear, "
                              "llama3); quantize a checkpoint without it")
        return cls(hp.n_head, hp.n_head_kv, d, float(hp.rms_eps), bool(family.qk_norm), inv,
                   pos_scale)

    def rope_tables(self, T: int) -> tuple[np.ndarray, np.ndarray]:
        ang = (np.arange(T, dtype=np.float64) / self.pos_scale)[:, None] * self.inv_freq[None]
        ang = np.concatenate([ang, ang], axis=1)
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(normalized * w, 1/rms) over the last axis, in x's precision."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps))
    return (x * r) * w, r


def rotate_half(x: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rotate_half_t(y: np.ndarray) -> np.ndarray:
    """Transpose of rotate_half (for the backward pass)."""
    h = y.shape[-1] // 2
    return np.concatenate([y[..., h:], -y[..., :h]], axis=-1)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x [..., in] @ w[out, in]^T (+ b), as one 2-D product (numpy's batched matmul is slow)."""
    y = (x.reshape(-1, x.shape[-1]) @ np.ascontiguousarray(w.T)).reshape(*x.shape[:-1], w.shape[0])
    return y + b if b is not None else y


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def block_forward(x: np.ndarray, w: dict, cfg: BlockConfig, capture=None, keep: bool = False):
    """Output of the block for hidden states x [B, T, n_embd] (float32).

    capture: None or a callable (name, activations [B*T, features]) called with each linear
    layer's input ("attn_in", "o_in", "ffn_in", "down_in"). keep: also return the intermediates.
    """
    x = np.asarray(x)
    dt = np.float64 if x.dtype == np.float64 else np.float32   # float64 only for gradient checks
    x = x.astype(dt, copy=False)
    B, T, _ = x.shape
    nh, nkv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    cos, sin = (t.astype(dt) for t in cfg.rope_tables(T))
    a, r1 = rms_norm(x, w["attn_norm"], cfg.eps)
    if capture:
        capture("attn_in", a.reshape(B * T, -1))
    q = linear(a, w["q"], w.get("q_bias")).reshape(B, T, nh, hd)
    k = linear(a, w["k"], w.get("k_bias")).reshape(B, T, nkv, hd)
    v = linear(a, w["v"], w.get("v_bias")).reshape(B, T, nkv, hd)
    q_pre, k_pre, rq, rk = q, k, None, None
    if cfg.qk_norm:
        q, rq = rms_norm(q, w["q_norm"], cfg.eps)
        k, rk = rms_norm(k, w["k_norm"], cfg.eps)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    qr = q * c + rotate_half(q) * s
    kr = k * c + rotate_half(k) * s
    rep = nh // nkv
    qh = qr.transpose(0, 2, 1, 3)                                   # [B, nh, T, hd]
    kh = np.repeat(kr.transpose(0, 2, 1, 3), rep, axis=1)
    vh = np.repeat(v.transpose(0, 2, 1, 3), rep, axis=1)
    scores = (qh @ kh.transpose(0, 1, 3, 2)) * dt(1.0 / np.sqrt(hd))
    scores += np.triu(np.full((T, T), -np.inf, dtype=dt), 1)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    att = (p @ vh).transpose(0, 2, 1, 3).reshape(B, T, nh * hd)
    if capture:
        capture("o_in", att.reshape(B * T, -1))
    h = x + linear(att, w["o"])
    f, r2 = rms_norm(h, w["ffn_norm"], cfg.eps)
    if capture:
        capture("ffn_in", f.reshape(B * T, -1))
    g = linear(f, w["gate"])
    u = linear(f, w["up"])
    sg = 1.0 / (1.0 + np.exp(-g))
    m = g * sg * u
    if capture:
        capture("down_in", m.reshape(B * T, -1))
    out = h + linear(m, w["down"])
    if not keep:
        return out
    cache = dict(x=x, a=a, q_pre=q_pre, k_pre=k_pre, q=q, k=k, rq=rq, rk=rk, qh=qh, kh=kh, vh=vh,
                 p=p, att=att, h=h, f=f, r2=r2, g=g, u=u, sg=sg, m=m, cos=c, sin=s)
    return out, cache


def forward_batched(x: np.ndarray, w: dict, cfg: BlockConfig, batch: int, capture=None
                    ) -> np.ndarray:
    """block_forward over [N, T, d] in batches of `batch` sequences (bounds attention memory)."""
    out = np.empty_like(x, dtype=np.float32)
    for i in range(0, x.shape[0], batch):
        out[i:i + batch] = block_forward(x[i:i + batch], w, cfg, capture)
    return out
