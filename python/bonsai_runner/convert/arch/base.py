"""What every supported decoder family shares: hyperparameters, GGUF keys, the tensor list.

The llama, qwen2 and qwen3 families are one pre-norm decoder (RMSNorm, rotary attention with
grouped KV heads, SwiGLU MLP) that differ in a few switches: q/k/v biases (qwen2), per-head q/k
RMSNorm (qwen3), an explicit head_dim (qwen3), and how rotary pairs are laid out. A family module
subclasses `DecoderFamily`, sets the switches and registers its Hugging Face architecture names.

`tensor_specs` is the converter's contract (STYLE: "validate before you write"): the full list of
tensors the checkpoint must hold, each with its HF name, llama.cpp name, shape (numpy order) and
role; `validate_tensors` compares it with the checkpoint and reports every missing, extra and
mis-shaped tensor by name in one error before a byte is written.

Rotary layout. llama.cpp's `llama` architecture rotates adjacent pairs (x[2i], x[2i+1]) ("normal"
rope) while Hugging Face Llama rotates halves (x[i], x[i + d/2]). llama.cpp's converter therefore
permutes the rows of q_proj and k_proj (and their biases) inside every head so that HF row
j * d/2 + i lands at 2i + j; `permute_rope_rows` does exactly that. qwen2/qwen3 run the "neox"
(halves) rope in llama.cpp and are written unpermuted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...errors import BonsaiError

# Roles decide output types: 2-D linear weights take the requested type, the token embedding and
# output head follow their own rule, everything 1-D stays F32.
ROLE_TOKEN_EMBD = "token_embd"
ROLE_OUTPUT = "output"
ROLE_LINEAR = "linear"
ROLE_NORM = "norm"
ROLE_BIAS = "bias"
ROLE_ROPE_FREQS = "rope_freqs"
ROLE_CONV = "conv"        # convolution taps (qwen35 ssm_conv1d): F32 like the 1-D tensors
ROLE_PARAM = "param"      # other small per-head parameters (qwen35 ssm_a, ssm_dt.bias): F32
F32_ROLES = (ROLE_NORM, ROLE_BIAS, ROLE_CONV, ROLE_PARAM)

# GGUF value type names passed with metadata (gguf_writer.ValueType member names).
U32, I32, F32, BOOL, STR = "UINT32", "INT32", "FLOAT32", "BOOL", "STRING"


@dataclass(frozen=True)
class TensorSpec:
    hf_name: str              # name in the Hugging Face checkpoint
    gguf_name: str            # llama.cpp name in the GGUF file
    shape: tuple[int, ...]    # numpy order, as stored by Hugging Face ([out, in] for linears)
    role: str
    rope_heads: int = 0       # >0: permute rows for llama's pairwise rope with this many heads
    # float32 HF value -> the value stored in GGUF (qwen35: V-head reorder, 1 + w, -exp(A_log))
    transform: Callable[[np.ndarray], np.ndarray] | None = field(default=None, compare=False)
    rows_only: bool = False   # `transform` only permutes rows (so it applies to packed tensors too)
    # >0: `transform` only permutes whole blocks of this many columns (qwen35 out_proj: V heads),
    # so it applies exactly to a packed tensor whose group divides the block
    cols_block: int = 0
    out_shape: tuple[int, ...] | None = None   # stored shape when `transform` changes it

    @property
    def gguf_shape(self) -> tuple[int, ...]:
        return self.out_shape or self.shape


@dataclass
class HParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int
    head_dim_explicit: bool
    rms_eps: float
    rope_theta: float
    n_ctx: int | None
    tied: bool
    attn_bias: bool
    rope_scaling: dict = field(default_factory=dict)


@dataclass(frozen=True)
class MetaKV:
    key: str
    value: Any
    vtype: str   # gguf_writer.ValueType member name; for arrays, the element type


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorders rows inside each head from HF's rotate-halves layout to llama's adjacent pairs."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise BonsaiError(f"cannot permute {rows} rows for {n_head} rotary heads")
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


MAX_LAYERS = 4096        # far above any released model; bounds the tensor list built from n_layer
MAX_DIM = 2**31 - 1      # the engine's C int


def _need(config: dict, keys: tuple[str, ...], what: str, default=None):
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    if default is not None:
        return default
    raise BonsaiError(f"config.json: missing \"{keys[0]}\" ({what})")


def _as_int(value: Any, key: str, hi: int = MAX_DIM) -> int:
    """A config.json size: an integer (or integral float) in [0, hi], else one BonsaiError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise BonsaiError(f"config.json: \"{key}\" must be an integer in [0, {hi}], got {value!r}; "
                          "fix the file")
    return value


def _as_float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(float(value)):
        raise BonsaiError(f"config.json: \"{key}\" must be a finite number, got {value!r}; fix the file")
    return float(value)


class DecoderFamily:
    """A llama-like decoder family. Subclasses set the class attributes below."""

    gguf_arch: str = ""
    hf_architectures: tuple[str, ...] = ()
    rope_pairwise = False      # llama: permute q/k rows for llama.cpp's normal rope
    qkv_bias = False           # qwen2: q/k/v projections carry biases
    qk_norm = False            # qwen3: RMSNorm over each q and k head

    def __init__(self, config: dict):
        self.config = config
        self.hp = self.read_hparams(config)

    # ----- hyperparameters and metadata -----

    def read_hparams(self, c: dict) -> HParams:
        n_embd = _as_int(_need(c, ("hidden_size", "n_embd"), "model width"), "hidden_size")
        n_head = _as_int(_need(c, ("num_attention_heads", "n_head"), "attention heads"),
                         "num_attention_heads")
        n_head_kv = _as_int(_need(c, ("num_key_value_heads",), "KV heads", default=n_head),
                            "num_key_value_heads")
        explicit = c.get("head_dim") is not None
        head_dim = _as_int(c["head_dim"], "head_dim") if explicit else n_embd // max(n_head, 1)
        rope_scaling = c.get("rope_scaling") or {}
        if not isinstance(rope_scaling, dict):
            raise BonsaiError(f"config.json: \"rope_scaling\" must be an object or null, got "
                              f"{rope_scaling!r}; fix the file")
        n_ctx = c.get("max_position_embeddings")
        hp = HParams(
            n_vocab=_as_int(_need(c, ("vocab_size",), "vocabulary size"), "vocab_size"),
            n_embd=n_embd,
            n_layer=_as_int(_need(c, ("num_hidden_layers", "n_layer"), "number of blocks"),
                            "num_hidden_layers", MAX_LAYERS),
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_ff=_as_int(_need(c, ("intermediate_size",), "MLP width"), "intermediate_size"),
            head_dim=head_dim,
            head_dim_explicit=explicit,
            rms_eps=_as_float(_need(c, ("rms_norm_eps",), "RMSNorm epsilon"), "rms_norm_eps"),
            rope_theta=_as_float(c.get("rope_theta") or 10000.0, "rope_theta"),
            n_ctx=_as_int(n_ctx, "max_position_embeddings") if n_ctx else None,
            tied=bool(c.get("tie_word_embeddings", False)),
            attn_bias=self.qkv_bias or bool(c.get("attention_bias", False)),
            rope_scaling=dict(rope_scaling),
        )
        if min(hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_ff) <= 0:
            raise BonsaiError("config.json: sizes must be positive")
        if hp.n_head % hp.n_head_kv:
            raise BonsaiError(f"config.json: num_attention_heads ({hp.n_head}) is not a multiple "
                              f"of num_key_value_heads ({hp.n_head_kv})")
        if not explicit and n_embd % n_head:
            raise BonsaiError(f"config.json: hidden_size ({n_embd}) is not a multiple of "
                              f"num_attention_heads ({n_head}); set head_dim")
        if hp.head_dim % 2:
            raise BonsaiError(f"config.json: head_dim {hp.head_dim} must be even for rotary "
                              "embeddings")
        self.check_rope_scaling(hp.rope_scaling)
        return hp

    def check_rope_scaling(self, rs: dict) -> None:
        kind = rs.get("rope_type", rs.get("type"))
        if kind in (None, "default"):
            return
        if kind in ("linear", "yarn"):
            if not isinstance(rs.get("factor"), (int, float)):
                raise BonsaiError(f"config.json: rope_scaling {kind!r} needs a numeric \"factor\"")
            if kind == "yarn" and not rs.get("original_max_position_embeddings"):
                raise BonsaiError("config.json: rope_scaling 'yarn' needs "
                                  "\"original_max_position_embeddings\"")
            return
        raise BonsaiError(f"config.json: rope_scaling type {kind!r} is not supported for "
                          f"{self.gguf_arch}; supported: {', '.join(self.rope_scaling_types())}")

    def rope_scaling_types(self) -> tuple[str, ...]:
        return ("linear", "yarn")

    def metadata(self) -> list[MetaKV]:
        hp, a = self.hp, self.gguf_arch
        kv = []
        if hp.n_ctx:
            kv.append(MetaKV(f"{a}.context_length", hp.n_ctx, U32))
        kv += [
            MetaKV(f"{a}.embedding_length", hp.n_embd, U32),
            MetaKV(f"{a}.block_count", hp.n_layer, U32),
            MetaKV(f"{a}.feed_forward_length", hp.n_ff, U32),
            MetaKV(f"{a}.attention.head_count", hp.n_head, U32),
            MetaKV(f"{a}.attention.head_count_kv", hp.n_head_kv, U32),
            MetaKV(f"{a}.attention.layer_norm_rms_epsilon", hp.rms_eps, F32),
            MetaKV(f"{a}.rope.freq_base", hp.rope_theta, F32),
            MetaKV(f"{a}.rope.dimension_count", hp.head_dim, U32),
            MetaKV(f"{a}.vocab_size", hp.n_vocab, U32),
        ]
        if hp.head_dim_explicit:
            kv += [MetaKV(f"{a}.attention.key_length", hp.head_dim, U32),
                   MetaKV(f"{a}.attention.value_length", hp.head_dim, U32)]
        rs = hp.rope_scaling
        kind = rs.get("rope_type", rs.get("type"))
        if kind in ("linear", "yarn"):
            kv += [MetaKV(f"{a}.rope.scaling.type", kind, STR),
                   MetaKV(f"{a}.rope.scaling.factor", float(rs["factor"]), F32)]
        if kind == "yarn":
            kv.append(MetaKV(f"{a}.rope.scaling.original_context_length",
                             int(rs["original_max_position_embeddings"]), U32))
        return kv

    # ----- tensors -----

    def tensor_specs(self) -> list[TensorSpec]:
        hp = self.hp
        q_rows, kv_rows = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        q_perm = hp.n_head if self.rope_pairwise else 0
        k_perm = hp.n_head_kv if self.rope_pairwise else 0
        specs = [TensorSpec("model.embed_tokens.weight", "token_embd.weight",
                            (hp.n_vocab, hp.n_embd), ROLE_TOKEN_EMBD)]
        for i in range(hp.n_layer):
            p, g = f"model.layers.{i}.", f"blk.{i}."
            specs += [
                TensorSpec(p + "input_layernorm.weight", g + "attn_norm.weight", (hp.n_embd,),
                           ROLE_NORM),
                TensorSpec(p + "self_attn.q_proj.weight", g + "attn_q.weight",
                           (q_rows, hp.n_embd), ROLE_LINEAR, q_perm),
                TensorSpec(p + "self_attn.k_proj.weight", g + "attn_k.weight",
                           (kv_rows, hp.n_embd), ROLE_LINEAR, k_perm),
                TensorSpec(p + "self_attn.v_proj.weight", g + "attn_v.weight",
                           (kv_rows, hp.n_embd), ROLE_LINEAR),
            ]
            if hp.attn_bias:
                specs += [
                    TensorSpec(p + "self_attn.q_proj.bias", g + "attn_q.bias", (q_rows,),
                               ROLE_BIAS, q_perm),
                    TensorSpec(p + "self_attn.k_proj.bias", g + "attn_k.bias", (kv_rows,),
                               ROLE_BIAS, k_perm),
                    TensorSpec(p + "self_attn.v_proj.bias", g + "attn_v.bias", (kv_rows,),
                               ROLE_BIAS),
                ]
            if self.qk_norm:
                specs += [
                    TensorSpec(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight",
                               (hp.head_dim,), ROLE_NORM),
                    TensorSpec(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight",
                               (hp.head_dim,), ROLE_NORM),
                ]
            specs += [
                TensorSpec(p + "self_attn.o_proj.weight", g + "attn_output.weight",
                           (hp.n_embd, q_rows), ROLE_LINEAR),
                TensorSpec(p + "post_attention_layernorm.weight", g + "ffn_norm.weight",
                           (hp.n_embd,), ROLE_NORM),
                TensorSpec(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (hp.n_ff, hp.n_embd),
                           ROLE_LINEAR),
                TensorSpec(p + "mlp.up_proj.weight", g + "ffn_up.weight", (hp.n_ff, hp.n_embd),
                           ROLE_LINEAR),
                TensorSpec(p + "mlp.down_proj.weight", g + "ffn_down.weight", (hp.n_embd, hp.n_ff),
                           ROLE_LINEAR),
            ]
        specs.append(TensorSpec("model.norm.weight", "output_norm.weight", (hp.n_embd,), ROLE_NORM))
        if not hp.tied:
            specs.append(TensorSpec("lm_head.weight", "output.weight", (hp.n_vocab, hp.n_embd),
                                    ROLE_OUTPUT))
        return specs

    def ignored_tensor(self, name: str) -> bool:
        """Checkpoint tensors that carry no information for the GGUF file."""
        if name.endswith(".rotary_emb.inv_freq"):
            return True
        return self.hp.tied and name == "lm_head.weight"

    def skipped_part(self, name: str) -> str | None:
        """The part of a multi-part checkpoint a checkpoint tensor belongs to when the converter
        deliberately leaves it out (qwen35: the vision encoder, the MTP head), else None. The
        converter names the skipped parts in one note."""
        return None

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        """Tensors computed from hyperparameters (llama3 rope factors), as (gguf name, float32)."""
        return []

    def validate_tensors(self, shapes: dict[str, tuple[int, ...]], where: str) -> list[TensorSpec]:
        """Checks the checkpoint's tensors against `tensor_specs`; reports all problems at once."""
        specs = self.tensor_specs()
        expected = {s.hf_name: s for s in specs}
        missing = [s.hf_name for s in specs if s.hf_name not in shapes]
        extra = [n for n in shapes if n not in expected and not self.ignored_tensor(n)
                 and self.skipped_part(n) is None]
        shaped = [f"{s.hf_name}: {list(shapes[s.hf_name])} (expected {list(s.shape)})"
                  for s in specs if s.hf_name in shapes and tuple(shapes[s.hf_name]) != s.shape]
        if missing or extra or shaped:
            lines = [f"{where}: the checkpoint does not match its config.json "
                     f"({self.gguf_arch}, {self.hp.n_layer} blocks):"]
            if missing:
                lines.append(f"  missing {len(missing)} tensor(s): " + ", ".join(missing))
            if extra:
                lines.append(f"  unexpected {len(extra)} tensor(s): " + ", ".join(extra))
            if shaped:
                lines.append(f"  {len(shaped)} mis-shaped tensor(s): " + "; ".join(shaped))
            lines.append("  fix the checkpoint or its config.json (a partial download or a config "
                         "from another model size are the usual causes)")
            raise BonsaiError("\n".join(lines))
        return specs
