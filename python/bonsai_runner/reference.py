"""Numpy reference forward pass: the float64 ground truth the engine is tested against.

It runs a GGUF model the way llama.cpp runs it, with none of the engine's shortcuts (no activation
quantization, no fused kernels, no f16 KV cache), so differences against it measure the engine's
error and nothing else.

Weights. Every tensor is dequantized once at load (`bonsai_runner.quants` for this project's types,
`gguf.quants` for the other standard ids such as Q4_K/Q6_K) and kept as float32: the dequantized
value of every GGUF type is exactly a float32 (f16 x small integer products), so nothing is lost,
and a 0.5B model stays at 2 GB instead of 4. Each matrix is widened to float64 only while it is
used; all arithmetic (norms, rope, softmax, matmuls) is float64.

Layout. GGUF tensors are read in numpy order: a linear weight is [n_out, n_in], so y = x @ W.T;
token_embd is [n_vocab, n_embd]; without output.weight the head is token_embd (tied).

Block (llama, qwen2, qwen3), per token row x:
    h   = x + Wo · attn(rope(q), rope(k), v)    with q,k,v = W{q,k,v} · rmsnorm(x) (+ biases)
    out = h + Wdown · (silu(Wgate · rmsnorm(h)) * (Wup · rmsnorm(h)))
  qwen3 applies a per-head RMSNorm (attn_q_norm / attn_k_norm, weight [head_dim]) to q and k
  before rope. Attention is causal with scale 1/sqrt(head_dim); with grouped-query attention query
  head h reads KV head h // (n_head / n_head_kv).

RoPE as ggml applies it, for the first n_rot dims of each head, i = 0 .. n_rot/2 - 1:
    theta_i = freq_scale * pos * freq_base^(-2i / n_rot) / freq_factor_i
  "normal" mode (llama) rotates adjacent pairs (x[2i], x[2i+1]) — the converter permutes the HF
  q/k rows so that this matches HF's rotate_half; "neox" mode (qwen2, qwen3) rotates (x[i],
  x[i + n_rot/2]). freq_scale = 1 / {arch}.rope.scaling.factor for linear scaling; freq_factor
  comes from the optional rope_freqs.weight tensor (llama 3 style scaling), else 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import BonsaiError

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")
_NEOX_ARCHS = ("qwen2", "qwen3")
_HEAD_CHUNK_ROWS = 16384  # output-head rows widened to float64 at a time (bounds the temporary)


@dataclass(frozen=True)
class Hparams:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int
    n_vocab: int
    norm_eps: float
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rope_neox: bool = False

    @classmethod
    def from_metadata(cls, md: dict, n_vocab: int) -> "Hparams":
        arch = _as_str(md.get("general.architecture"))
        if arch not in SUPPORTED_ARCHS:
            raise BonsaiError(f"unsupported architecture {arch!r} (general.architecture); the "
                              f"reference forward runs {', '.join(SUPPORTED_ARCHS)}")

        def key(name, default=None):
            full = f"{arch}.{name}"
            if full in md:
                value = md[full]
                if isinstance(value, (list, tuple, np.ndarray)):
                    values = {float(v) for v in value}
                    if len(values) != 1:
                        raise BonsaiError(f"{full} varies per layer ({sorted(values)}); the "
                                          "reference forward needs one value for all layers")
                    value = values.pop()
                return value
            if default is None:
                raise BonsaiError(f"metadata key {full} is missing; re-convert the model with "
                                  "`bonsai convert`")
            return default

        n_embd = int(key("embedding_length"))
        n_head = int(key("attention.head_count"))
        n_head_kv = int(key("attention.head_count_kv", n_head))
        head_k = int(key("attention.key_length", n_embd // n_head))
        head_v = int(key("attention.value_length", n_embd // n_head))
        n_rot = int(key("rope.dimension_count", head_k))
        scaling = _as_str(key("rope.scaling.type", "linear"))
        if scaling not in ("none", "linear"):
            raise BonsaiError(f"{arch}.rope.scaling.type = {scaling!r} is not supported by the "
                              "reference forward (only none and linear, plus rope_freqs.weight "
                              "factors)")
        factor = float(key("rope.scaling.factor", 0.0)) if scaling == "linear" else 0.0
        if n_head % n_head_kv:
            raise BonsaiError(f"{arch}.attention.head_count ({n_head}) is not a multiple of "
                              f"head_count_kv ({n_head_kv})")
        if n_rot > head_k or n_rot % 2:
            raise BonsaiError(f"{arch}.rope.dimension_count = {n_rot} must be even and at most "
                              f"the head size {head_k}")
        return cls(
            arch=arch, n_layer=int(key("block_count")), n_embd=n_embd,
            n_ff=int(key("feed_forward_length")), n_head=n_head, n_head_kv=n_head_kv,
            n_embd_head_k=head_k, n_embd_head_v=head_v, n_rot=n_rot, n_vocab=n_vocab,
            norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            rope_freq_base=float(key("rope.freq_base", 10000.0)),
            rope_freq_scale=1.0 / factor if factor else 1.0,
            rope_neox=arch in _NEOX_ARCHS,
        )


@dataclass
class ReferenceCache:
    """Keys (after rope) and values of the tokens processed so far, per layer, float64."""

    k: list = field(default_factory=list)  # per layer: [n_past, n_head_kv, head_k]
    v: list = field(default_factory=list)  # per layer: [n_past, n_head_kv, head_v]

    @property
    def n_past(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    def truncate(self, n: int) -> None:
        """Forgets every position >= n (like removing the tail of a llama.cpp KV sequence)."""
        if n < 0 or n > self.n_past:
            raise BonsaiError(f"cannot truncate a cache of {self.n_past} positions to {n}")
        self.k = [k[:n] for k in self.k]
        self.v = [v[:n] for v in self.v]


class ReferenceModel:
    """A llama/qwen2/qwen3 model held as dequantized weights, run in float64 with numpy."""

    def __init__(self, hparams: Hparams, weights: dict[str, np.ndarray]):
        self.hparams = hparams
        self.weights = weights
        self._check_weights()
        freqs = weights.get("rope_freqs.weight")
        self._freq_factors = None if freqs is None else np.asarray(freqs, np.float64).reshape(-1)

    @classmethod
    def from_gguf(cls, path: str | Path) -> "ReferenceModel":
        """Loads and dequantizes every tensor of a GGUF file."""
        from .gguf_reader import open_gguf

        with open_gguf(path) as gf:
            metadata = dict(gf.metadata)
            rotated = sorted(k for k in metadata if k.startswith("prism.hadamard."))
            if rotated:
                raise BonsaiError(f"{path}: weights are Hadamard-rotated ({rotated[0]}); the "
                                  "reference forward does not apply the activation rotation")
            embd = [t for t in gf.tensors if t.name == "token_embd.weight"]
            if not embd:
                raise BonsaiError(f"{path}: tensor token_embd.weight is missing")
            hparams = Hparams.from_metadata(metadata, int(embd[0].shape[0]))
            weights = {t.name: _dequantize_tensor(gf, t) for t in gf.tensors}
        return cls(hparams, weights)

    # -- weights ---------------------------------------------------------------------------------

    def _check_weights(self) -> None:
        hp = self.hparams
        q_out, kv_out = hp.n_head * hp.n_embd_head_k, hp.n_head_kv * hp.n_embd_head_k
        v_out = hp.n_head_kv * hp.n_embd_head_v
        expected = {
            "token_embd.weight": (hp.n_vocab, hp.n_embd),
            "output_norm.weight": (hp.n_embd,),
        }
        for i in range(hp.n_layer):
            b = f"blk.{i}."
            expected.update({
                b + "attn_norm.weight": (hp.n_embd,),
                b + "attn_q.weight": (q_out, hp.n_embd),
                b + "attn_k.weight": (kv_out, hp.n_embd),
                b + "attn_v.weight": (v_out, hp.n_embd),
                b + "attn_output.weight": (hp.n_embd, hp.n_head * hp.n_embd_head_v),
                b + "ffn_norm.weight": (hp.n_embd,),
                b + "ffn_gate.weight": (hp.n_ff, hp.n_embd),
                b + "ffn_up.weight": (hp.n_ff, hp.n_embd),
                b + "ffn_down.weight": (hp.n_embd, hp.n_ff),
            })
            if hp.arch == "qwen3":
                expected[b + "attn_q_norm.weight"] = (hp.n_embd_head_k,)
                expected[b + "attn_k_norm.weight"] = (hp.n_embd_head_k,)
        optional = {"output.weight": (hp.n_vocab, hp.n_embd), "output.bias": (hp.n_vocab,),
                    "rope_freqs.weight": (hp.n_rot // 2,)}
        for i in range(hp.n_layer):
            b = f"blk.{i}."
            optional.update({b + "attn_q.bias": (q_out,), b + "attn_k.bias": (kv_out,),
                             b + "attn_v.bias": (v_out,), b + "attn_output.bias": (hp.n_embd,),
                             b + "ffn_gate.bias": (hp.n_ff,), b + "ffn_up.bias": (hp.n_ff,),
                             b + "ffn_down.bias": (hp.n_embd,)})
        problems = [f"missing tensor {name}" for name in expected if name not in self.weights]
        for name, shape in {**expected, **optional}.items():
            w = self.weights.get(name)
            if w is not None and tuple(w.shape) != shape:
                problems.append(f"tensor {name} has shape {tuple(w.shape)}, expected {shape}")
        if problems:
            raise BonsaiError(f"{hp.arch} model does not match its hyperparameters: "
                              + "; ".join(problems))

    def _w(self, name: str) -> np.ndarray | None:
        w = self.weights.get(name)
        return None if w is None else np.asarray(w, dtype=np.float64)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self._w(name + ".weight").T
        bias = self._w(name + ".bias")
        return y if bias is None else y + bias

    # -- forward ---------------------------------------------------------------------------------

    def new_cache(self) -> ReferenceCache:
        return ReferenceCache()

    def logits(self, tokens, cache: ReferenceCache | None = None,
               start_pos: int | None = None) -> np.ndarray:
        """Logits [n_tokens, n_vocab] (float64) for `tokens`.

        Without a cache the tokens sit at positions 0..n-1. With a cache they continue after the
        cached positions (or after `start_pos` of them: the rest of the cache is dropped first),
        and their keys/values are appended to it.
        """
        hp = self.hparams
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise BonsaiError("logits() needs at least one token")
        if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
            raise BonsaiError(f"token id out of range [0, {hp.n_vocab}): "
                              f"{tokens[(tokens < 0) | (tokens >= hp.n_vocab)][0]}")
        if cache is None:
            if start_pos not in (None, 0):
                raise BonsaiError("start_pos > 0 needs the cache that holds those positions")
            cache = ReferenceCache()
        elif start_pos is not None:
            cache.truncate(start_pos)
        n_past = cache.n_past
        if not cache.k:
            empty_k = np.zeros((0, hp.n_head_kv, hp.n_embd_head_k))
            empty_v = np.zeros((0, hp.n_head_kv, hp.n_embd_head_v))
            cache.k = [empty_k] * hp.n_layer
            cache.v = [empty_v] * hp.n_layer
        pos = np.arange(n_past, n_past + tokens.size, dtype=np.float64)

        x = np.asarray(self.weights["token_embd.weight"][tokens], dtype=np.float64)
        for il in range(hp.n_layer):
            x = self._block(il, x, pos, cache)
        x = _rms_norm(x, self._w("output_norm.weight"), hp.norm_eps)
        return self._head(x)

    def _block(self, il: int, x: np.ndarray, pos: np.ndarray, cache: ReferenceCache) -> np.ndarray:
        hp, b = self.hparams, f"blk.{il}."
        n = x.shape[0]
        cur = _rms_norm(x, self._w(b + "attn_norm.weight"), hp.norm_eps)
        q = self._linear(cur, b + "attn_q").reshape(n, hp.n_head, hp.n_embd_head_k)
        k = self._linear(cur, b + "attn_k").reshape(n, hp.n_head_kv, hp.n_embd_head_k)
        v = self._linear(cur, b + "attn_v").reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        if hp.arch == "qwen3":
            q = _rms_norm(q, self._w(b + "attn_q_norm.weight"), hp.norm_eps)
            k = _rms_norm(k, self._w(b + "attn_k_norm.weight"), hp.norm_eps)
        q = self._rope(q, pos)
        k = self._rope(k, pos)
        cache.k[il] = np.concatenate([cache.k[il], k])
        cache.v[il] = np.concatenate([cache.v[il], v])
        attn = _attention(q, cache.k[il], cache.v[il], int(pos[0]), 1.0 / np.sqrt(hp.n_embd_head_k))
        h = x + self._linear(attn, b + "attn_output")

        cur = _rms_norm(h, self._w(b + "ffn_norm.weight"), hp.norm_eps)
        gate = self._linear(cur, b + "ffn_gate")
        up = self._linear(cur, b + "ffn_up")
        return h + self._linear(_silu(gate) * up, b + "ffn_down")

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Rotates the first n_rot dims of every head of x [n_tokens, n_heads, head_dim]."""
        hp = self.hparams
        half = hp.n_rot // 2
        inv_freq = hp.rope_freq_base ** (-2.0 * np.arange(half) / hp.n_rot)
        if self._freq_factors is not None:
            inv_freq = inv_freq / self._freq_factors
        theta = hp.rope_freq_scale * pos[:, None] * inv_freq[None, :]  # [n_tokens, half]
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        out = x.copy()
        if hp.rope_neox:
            x0, x1 = x[..., :half], x[..., half:hp.n_rot]
            out[..., :half] = x0 * cos - x1 * sin
            out[..., half:hp.n_rot] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., 0:hp.n_rot:2], x[..., 1:hp.n_rot:2]
            out[..., 0:hp.n_rot:2] = x0 * cos - x1 * sin
            out[..., 1:hp.n_rot:2] = x0 * sin + x1 * cos
        return out

    def _head(self, x: np.ndarray) -> np.ndarray:
        name = "output.weight" if "output.weight" in self.weights else "token_embd.weight"
        w = self.weights[name]
        out = np.empty((x.shape[0], w.shape[0]))
        for r0 in range(0, w.shape[0], _HEAD_CHUNK_ROWS):
            chunk = np.asarray(w[r0:r0 + _HEAD_CHUNK_ROWS], dtype=np.float64)
            out[:, r0:r0 + chunk.shape[0]] = x @ chunk.T
        bias = self._w("output.bias")
        return out if bias is None else out + bias


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos0: int,
               scale: float) -> np.ndarray:
    """Causal attention: q [T, H, D] at positions q_pos0.., k [S, Hkv, D] and v [S, Hkv, Dv] at
    positions 0..S-1."""
    n_tok, n_head, d = q.shape
    n_kv, n_head_kv, dv = v.shape
    group = n_head // n_head_kv
    qg = q.reshape(n_tok, n_head_kv, group, d)
    scores = np.einsum("thgd,shd->hgts", qg, k) * scale
    future = np.arange(n_kv)[None, :] > (q_pos0 + np.arange(n_tok))[:, None]
    scores[..., future] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hgts,shd->thgd", p, v).reshape(n_tok, n_head * dv)


def _dequantize_tensor(gf, t) -> np.ndarray:
    """float32 values of one GGUF tensor in numpy shape order (F32 tensors stay views of the
    mapping, which the reader keeps alive)."""
    if t.engine_type is not None:
        values = gf.dequantize_tensor(t.name)
    else:
        import gguf

        try:
            qtype = gguf.GGMLQuantizationType(t.file_id)
        except ValueError:
            raise BonsaiError(f"tensor {t.name}: type {t.type_name} (id {t.file_id}) cannot be "
                              "dequantized by bonsai_runner.quants or the gguf package") from None
        shape = tuple(int(s) for s in t.shape)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        raw = np.asarray(gf.tensor_bytes(t.name)).reshape(rows, -1)
        values = gguf.quants.dequantize(raw, qtype).reshape(shape)
    return np.asarray(values, dtype=np.float32)


def _as_str(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value) if value is not None else ""
