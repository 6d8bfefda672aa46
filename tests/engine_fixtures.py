"""Tiny random GGUF models of every engine architecture, written directly with the `gguf` package,
plus an independent float64 numpy forward pass over the Hugging Face weight layout.

The fixtures keep the float weights in HF layout (q/k rows in rotate_half order). The GGUF file gets
llama's q/k rows permuted into the adjacent-pair rope layout, as llama.cpp's converter does, and the
reference un-permutes the dequantized file weights again, so the comparison measures the engine
(rope layout included) and not the quantization error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import dequantize, quantize

TYPES = {"F32": Q.F32, "F16": Q.F16, "Q8_0": Q.Q8_0, "TQ1_0": Q.TQ1_0, "TQ2_0": Q.TQ2_0}


@dataclass
class Cfg:
    arch: str = "llama"
    n_vocab: int = 300
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    eps: float = 1e-5
    theta: float = 10000.0
    tied: bool = False
    wtype: str = "F32"        # type of the linear layers
    emb_type: str = "F32"     # type of token_embd / output
    n_ctx_train: int = 512
    rope_freqs: bool = False  # llama3-style rope_freqs.weight frequency factors
    rope_linear: float = 0.0  # linear rope scaling factor (0 = none)
    weights: dict = field(default_factory=dict)  # name -> float64 array in HF layout (filled on write)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate_half row order -> adjacent-pair order (per head: rows (i, i+d/2) become (2i, 2i+1))."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _vocab(n: int):
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(toks) < n:
        a, b = letters[i % 26], letters[(i // 26) % 26]
        toks.append("\u2581" + a + (b if i >= 26 else ""))
        types.append(1)
        i += 1
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(j) for j in range(n - 259)]
    return toks, scores, types


def write_model(path, cfg: Cfg, seed: int = 0) -> Cfg:
    """Writes a random model to `path`; returns cfg with `weights` = the dequantized HF-layout values."""
    rng = np.random.default_rng(seed)
    e, nq, nkv = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    w = GGUFWriter(str(path), cfg.arch)
    a = cfg.arch
    w.add_context_length(cfg.n_ctx_train)
    w.add_embedding_length(e)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_layer_norm_rms_eps(cfg.eps)
    w.add_rope_freq_base(cfg.theta)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_uint32(f"{a}.vocab_size", cfg.n_vocab)
    if cfg.rope_linear:
        w.add_string(f"{a}.rope.scaling.type", "linear")
        w.add_float32(f"{a}.rope.scaling.factor", cfg.rope_linear)
    toks, scores, types = _vocab(cfg.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    ref = {}

    def put(name, arr, ttype="F32", permute_heads=0):
        arr = np.asarray(arr, dtype=np.float32)
        file_arr = _permute(arr, permute_heads) if permute_heads else arr
        qt = TYPES[ttype]
        if qt == Q.F32:
            w.add_tensor(name, file_arr)
            deq = file_arr.astype(np.float64)
        elif qt == Q.F16:
            h = file_arr.astype(np.float16)
            w.add_tensor(name, h)
            deq = h.astype(np.float64)
        else:
            packed = quantize(file_arr, qt)
            w.add_tensor(name, packed, raw_dtype=qt)
            deq = dequantize(packed, qt).reshape(file_arr.shape).astype(np.float64)
        ref[name] = _unpermute(deq, permute_heads) if permute_heads else deq

    def mat(rows, cols, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(cols)
        return rng.standard_normal((rows, cols)) * s

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    put("token_embd.weight", mat(cfg.n_vocab, e, 1.0), cfg.emb_type)
    put("output_norm.weight", norm(e))
    if cfg.rope_freqs:
        put("rope_freqs.weight", 1.0 + np.arange(cfg.head_dim // 2) * 0.5)
    if not cfg.tied:
        put("output.weight", mat(cfg.n_vocab, e), cfg.emb_type)
    perm = cfg.arch == "llama"
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        put(b + "attn_norm.weight", norm(e))
        put(b + "attn_q.weight", mat(nq, e), cfg.wtype, cfg.n_head if perm else 0)
        put(b + "attn_k.weight", mat(nkv, e), cfg.wtype, cfg.n_head_kv if perm else 0)
        put(b + "attn_v.weight", mat(nkv, e), cfg.wtype)
        put(b + "attn_output.weight", mat(e, nq), cfg.wtype)
        if cfg.arch == "qwen2":
            put(b + "attn_q.bias", 0.5 * rng.standard_normal(nq))
            put(b + "attn_k.bias", 0.5 * rng.standard_normal(nkv))
            put(b + "attn_v.bias", 0.5 * rng.standard_normal(nkv))
        if cfg.arch == "qwen3":
            put(b + "attn_q_norm.weight", norm(cfg.head_dim))
            put(b + "attn_k_norm.weight", norm(cfg.head_dim))
        put(b + "ffn_norm.weight", norm(e))
        put(b + "ffn_gate.weight", mat(cfg.n_ff, e), cfg.wtype)
        put(b + "ffn_up.weight", mat(cfg.n_ff, e), cfg.wtype)
        put(b + "ffn_down.weight", mat(e, cfg.n_ff), cfg.wtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cfg.weights = ref
    return cfg


def _rms(x, wt, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * wt


def reference_logits(cfg: Cfg, tokens) -> np.ndarray:
    """float64 logits [n, n_vocab] of a causal forward over `tokens` at positions 0..n-1."""
    W = cfg.weights
    tokens = np.asarray(tokens)
    n, hd = len(tokens), cfg.head_dim
    x = W["token_embd.weight"][tokens].copy()
    inv = cfg.theta ** (-np.arange(0, hd, 2) / hd)
    if cfg.rope_freqs:
        inv = inv / W["rope_freqs.weight"]
    pos = np.arange(n) / (cfg.rope_linear or 1.0)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(t):  # t [n, heads, hd], HF rotate_half
        rot = np.concatenate([-t[..., hd // 2:], t[..., : hd // 2]], -1)
        return t * cos[:, None, :] + rot * sin[:, None, :]

    mask = np.triu(np.full((n, n), -np.inf), 1)
    rep = cfg.n_head // cfg.n_head_kv
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        h = _rms(x, W[b + "attn_norm.weight"], cfg.eps)
        q, k, v = (h @ W[b + f"attn_{c}.weight"].T for c in "qkv")
        if cfg.arch == "qwen2":
            q, k, v = q + W[b + "attn_q.bias"], k + W[b + "attn_k.bias"], v + W[b + "attn_v.bias"]
        q = q.reshape(n, cfg.n_head, hd)
        k = k.reshape(n, cfg.n_head_kv, hd)
        v = v.reshape(n, cfg.n_head_kv, hd)
        if cfg.arch == "qwen3":
            q = _rms(q, W[b + "attn_q_norm.weight"], cfg.eps)
            k = _rms(k, W[b + "attn_k_norm.weight"], cfg.eps)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", p, v).reshape(n, -1)
        x = x + o @ W[b + "attn_output.weight"].T
        h = _rms(x, W[b + "ffn_norm.weight"], cfg.eps)
        g, u = h @ W[b + "ffn_gate.weight"].T, h @ W[b + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[b + "ffn_down.weight"].T
    x = _rms(x, W["output_norm.weight"], cfg.eps)
    out = W["token_embd.weight"] if cfg.tied else W["output.weight"]
    return x @ out.T
