"""The qwen35 family (Qwen3.5 / Qwen3.6 dense; SPEC §6a): GGUF architecture `qwen35`.

A hybrid decoder: layer i is a Gated DeltaNet (GDN, linear attention) layer unless it is a full
attention layer (config.json `layer_types`, else every `full_attention_interval`-th layer). Both
Hugging Face classes convert: `Qwen3_5ForCausalLM` (tensors under `model.*`) and the language model
of `Qwen3_5ForConditionalGeneration` (`text_config` in config.json, tensors under
`model.language_model.*`); the latter's vision encoder (`model.visual.*`) and multi-token-prediction
head (`mtp.*`) are left out and named in one note.

What the file holds follows upstream llama.cpp's converter (its Qwen3_5TextModel), so files
interchange with llama.cpp:
- every `*norm.weight` except the GDN output norm (`linear_attn.norm`, a plain `x * w`) is stored
  as `1 + w`: Hugging Face's Qwen3.5 RMSNorm multiplies by `(1 + w)`, llama.cpp by the weight;
- `ssm_a = -exp(A_log)`; `dt_bias` is `ssm_dt.bias`; conv1d's [conv_dim, 1, kernel] taps are stored
  squeezed, numpy [conv_dim, kernel] (ggml ne {kernel, conv_dim});
- V heads are reordered from Hugging Face's grouped order (V head h reads K head h // (V/K)) to the
  tiled order ggml broadcasts (V head j reads K head j % K): in the v rows of in_proj_qkv, the rows
  of in_proj_z, in_proj_a and in_proj_b, in A_log and dt_bias, conv1d's V channels and the columns
  of out_proj (`tile_v_heads`);
- attention: q_proj keeps query and output gate interleaved per head (2 x head_dim rows per head);
  neox rope on the first head_dim * partial_rotary_factor dims, no row permutation;
- metadata: the usual counts, key/value length, `rope.dimension_count` (the partial rope width),
  `rope.dimension_sections` (M-RoPE sections padded to 4; upstream's default [11, 11, 10, 0] when the
  config has none), the `ssm.*` sizes, `full_attention_interval` and, when config.json lists
  layer_types, `attention.recurrent_layers` (one bool per layer). No `vocab_size` key (upstream
  writes none for qwen35; readers take the embedding's rows).
"""

from __future__ import annotations

import numpy as np

from ...errors import BonsaiError
from . import register
from .base import (BOOL, I32, ROLE_CONV, ROLE_LINEAR, ROLE_NORM, ROLE_OUTPUT, ROLE_PARAM,
                   ROLE_TOKEN_EMBD, U32, DecoderFamily, HParams, MetaKV, TensorSpec, _as_float,
                   _as_int)

DEFAULT_MROPE_SECTIONS = [11, 11, 10, 0]
LAYER_LINEAR, LAYER_FULL = "linear_attention", "full_attention"


def tile_v_heads(x: np.ndarray, axis: int, n_k: int, n_v: int, head_dim: int) -> np.ndarray:
    """Reorders V heads along `axis` from grouped ([K, V/K, head_dim]) to tiled ([V/K, K, head_dim])."""
    rep = n_v // n_k
    y = np.moveaxis(x, axis, 0)
    shape = y.shape
    if shape[0] != n_v * head_dim:
        raise BonsaiError(f"cannot reorder {shape[0]} channels as {n_v} V heads of {head_dim}")
    y = y.reshape(n_k, rep, head_dim, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(y, 0, axis))


def _plus_one(x: np.ndarray) -> np.ndarray:
    return x + np.float32(1.0)


def _neg_exp(x: np.ndarray) -> np.ndarray:
    # exp in float64, rounded once: within an ulp of upstream's torch.exp in float32
    return (-np.exp(x.astype(np.float64))).astype(np.float32)


def text_config(config: dict) -> dict:
    """config.json of either class as one flat dict (text_config's keys over the top level)."""
    tc = config.get("text_config")
    if tc is None:
        return config
    if not isinstance(tc, dict):
        raise BonsaiError(f"config.json: \"text_config\" must be an object, got {tc!r}")
    return {**config, **tc}


@register("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
class Qwen35Family(DecoderFamily):
    gguf_arch = "qwen35"
    qk_norm = True

    def __init__(self, config: dict):
        self.conditional = "text_config" in config
        self.prefix = "model.language_model." if self.conditional else "model."
        super().__init__(text_config(config))

    # ----- hyperparameters -----

    def read_hparams(self, c: dict) -> HParams:
        c = dict(c)
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise BonsaiError(f"config.json: \"rope_parameters\" must be an object, got {rope!r}")
        c["rope_scaling"] = {k: v for k, v in rope.items()
                             if k in ("rope_type", "type", "factor", "original_max_position_embeddings")}
        if c.get("rope_theta") is None and rope.get("rope_theta") is not None:
            c["rope_theta"] = rope["rope_theta"]
        c.setdefault("head_dim", 256)                     # transformers' Qwen3.5 default
        hp = super().read_hparams(c)
        if c.get("attention_bias"):
            raise BonsaiError("config.json: attention_bias is set; qwen35 has no q/k/v/o biases "
                              "(neither Qwen3.5 nor llama.cpp's qwen35 use them)")
        hp.attn_bias = False
        self.n_k = _as_int(c.get("linear_num_key_heads", 16), "linear_num_key_heads")
        self.n_v = _as_int(c.get("linear_num_value_heads", 32), "linear_num_value_heads")
        self.dk = _as_int(c.get("linear_key_head_dim", 128), "linear_key_head_dim")
        self.dv = _as_int(c.get("linear_value_head_dim", 128), "linear_value_head_dim")
        self.conv_kernel = _as_int(c.get("linear_conv_kernel_dim", 4), "linear_conv_kernel_dim")
        if min(self.n_k, self.n_v, self.dk, self.dv, self.conv_kernel) <= 0:
            raise BonsaiError("config.json: the linear-attention sizes must be positive")
        if self.n_v % self.n_k:
            raise BonsaiError(f"config.json: linear_num_value_heads ({self.n_v}) is not a multiple "
                              f"of linear_num_key_heads ({self.n_k})")
        prf = _as_float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25)),
                        "partial_rotary_factor")
        self.rope_dim = int(hp.head_dim * prf)
        if not 0 < self.rope_dim <= hp.head_dim or self.rope_dim % 2:
            raise BonsaiError(f"config.json: partial_rotary_factor {prf} gives {self.rope_dim} "
                              f"rotary dims of head_dim {hp.head_dim}; it must be an even number "
                              "in (0, head_dim]")
        sections = rope.get("mrope_section")
        if sections is None:
            self.rope_sections = list(DEFAULT_MROPE_SECTIONS)
        else:
            if not (isinstance(sections, list) and len(sections) <= 4):
                raise BonsaiError(f"config.json: mrope_section must be a list of at most 4 "
                                  f"integers, got {sections!r}")
            self.rope_sections = [_as_int(s, "mrope_section") for s in sections]
            self.rope_sections += [0] * (4 - len(self.rope_sections))
        self.interval = _as_int(c.get("full_attention_interval", 4), "full_attention_interval")
        if self.interval <= 0:
            raise BonsaiError("config.json: full_attention_interval must be positive")
        types = c.get("layer_types")
        self.has_layer_types = types is not None
        if types is None:
            types = [LAYER_LINEAR if (i + 1) % self.interval else LAYER_FULL
                     for i in range(hp.n_layer)]
        if not (isinstance(types, list) and len(types) == hp.n_layer
                and all(t in (LAYER_LINEAR, LAYER_FULL) for t in types)):
            raise BonsaiError(f"config.json: layer_types must list {hp.n_layer} entries, each "
                              f"{LAYER_LINEAR!r} or {LAYER_FULL!r}; got {types!r}")
        self.recurrent = [t == LAYER_LINEAR for t in types]
        return hp

    def rope_scaling_types(self) -> tuple[str, ...]:
        return ("default", "linear", "yarn")

    @property
    def conv_dim(self) -> int:
        return 2 * self.n_k * self.dk + self.n_v * self.dv

    def metadata(self) -> list[MetaKV]:
        a = self.gguf_arch
        kv = [m for m in super().metadata()
              if m.key not in (f"{a}.vocab_size", f"{a}.rope.dimension_count")]
        kv += [
            MetaKV(f"{a}.rope.dimension_count", self.rope_dim, U32),
            MetaKV(f"{a}.rope.dimension_sections", self.rope_sections, I32),
            MetaKV(f"{a}.ssm.conv_kernel", self.conv_kernel, U32),
            MetaKV(f"{a}.ssm.state_size", self.dk, U32),
            MetaKV(f"{a}.ssm.group_count", self.n_k, U32),
            MetaKV(f"{a}.ssm.time_step_rank", self.n_v, U32),
            MetaKV(f"{a}.ssm.inner_size", self.n_v * self.dv, U32),
            MetaKV(f"{a}.full_attention_interval", self.interval, U32),
        ]
        if self.has_layer_types:
            kv.append(MetaKV(f"{a}.attention.recurrent_layers", list(self.recurrent), BOOL))
        return kv

    # ----- tensors -----

    def tensor_specs(self) -> list[TensorSpec]:
        hp, pre = self.hp, self.prefix
        n_k, n_v, dk, dv = self.n_k, self.n_v, self.dk, self.dv
        q_rows, kv_rows = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        qk = 2 * n_k * dk

        def tile_rows(head_dim: int):
            return lambda x: tile_v_heads(x, 0, n_k, n_v, head_dim)

        def tile_qkv(x: np.ndarray) -> np.ndarray:
            return np.concatenate([x[:qk], tile_v_heads(x[qk:], 0, n_k, n_v, dv)], axis=0)

        def tile_conv(x: np.ndarray) -> np.ndarray:
            return tile_qkv(x.reshape(x.shape[0], x.shape[-1]))

        def tile_vec(x: np.ndarray) -> np.ndarray:
            return tile_v_heads(x, 0, n_k, n_v, 1)

        def neg_exp_tiled(x: np.ndarray) -> np.ndarray:
            return _neg_exp(tile_vec(x))

        specs = [TensorSpec(pre + "embed_tokens.weight", "token_embd.weight",
                            (hp.n_vocab, hp.n_embd), ROLE_TOKEN_EMBD)]
        for i in range(hp.n_layer):
            p, g = f"{pre}layers.{i}.", f"blk.{i}."
            specs.append(TensorSpec(p + "input_layernorm.weight", g + "attn_norm.weight",
                                    (hp.n_embd,), ROLE_NORM, transform=_plus_one))
            if self.recurrent[i]:
                la = p + "linear_attn."
                specs += [
                    TensorSpec(la + "in_proj_qkv.weight", g + "attn_qkv.weight",
                               (self.conv_dim, hp.n_embd), ROLE_LINEAR, transform=tile_qkv,
                               rows_only=True),
                    TensorSpec(la + "in_proj_z.weight", g + "attn_gate.weight",
                               (n_v * dv, hp.n_embd), ROLE_LINEAR, transform=tile_rows(dv),
                               rows_only=True),
                    TensorSpec(la + "in_proj_a.weight", g + "ssm_alpha.weight", (n_v, hp.n_embd),
                               ROLE_LINEAR, transform=tile_rows(1), rows_only=True),
                    TensorSpec(la + "in_proj_b.weight", g + "ssm_beta.weight", (n_v, hp.n_embd),
                               ROLE_LINEAR, transform=tile_rows(1), rows_only=True),
                    TensorSpec(la + "conv1d.weight", g + "ssm_conv1d.weight",
                               (self.conv_dim, 1, self.conv_kernel), ROLE_CONV,
                               transform=tile_conv, out_shape=(self.conv_dim, self.conv_kernel)),
                    TensorSpec(la + "dt_bias", g + "ssm_dt.bias", (n_v,), ROLE_PARAM,
                               transform=tile_vec),
                    TensorSpec(la + "A_log", g + "ssm_a", (n_v,), ROLE_PARAM,
                               transform=neg_exp_tiled),
                    TensorSpec(la + "norm.weight", g + "ssm_norm.weight", (dv,), ROLE_NORM),
                    TensorSpec(la + "out_proj.weight", g + "ssm_out.weight", (hp.n_embd, n_v * dv),
                               ROLE_LINEAR,
                               transform=lambda x: tile_v_heads(x, 1, n_k, n_v, dv),
                               cols_block=dv),
                ]
            else:
                sa = p + "self_attn."
                specs += [
                    TensorSpec(sa + "q_proj.weight", g + "attn_q.weight", (2 * q_rows, hp.n_embd),
                               ROLE_LINEAR),
                    TensorSpec(sa + "k_proj.weight", g + "attn_k.weight", (kv_rows, hp.n_embd),
                               ROLE_LINEAR),
                    TensorSpec(sa + "v_proj.weight", g + "attn_v.weight", (kv_rows, hp.n_embd),
                               ROLE_LINEAR),
                    TensorSpec(sa + "o_proj.weight", g + "attn_output.weight", (hp.n_embd, q_rows),
                               ROLE_LINEAR),
                    TensorSpec(sa + "q_norm.weight", g + "attn_q_norm.weight", (hp.head_dim,),
                               ROLE_NORM, transform=_plus_one),
                    TensorSpec(sa + "k_norm.weight", g + "attn_k_norm.weight", (hp.head_dim,),
                               ROLE_NORM, transform=_plus_one),
                ]
            specs += [
                TensorSpec(p + "post_attention_layernorm.weight", g + "post_attention_norm.weight",
                           (hp.n_embd,), ROLE_NORM, transform=_plus_one),
                TensorSpec(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (hp.n_ff, hp.n_embd),
                           ROLE_LINEAR),
                TensorSpec(p + "mlp.up_proj.weight", g + "ffn_up.weight", (hp.n_ff, hp.n_embd),
                           ROLE_LINEAR),
                TensorSpec(p + "mlp.down_proj.weight", g + "ffn_down.weight", (hp.n_embd, hp.n_ff),
                           ROLE_LINEAR),
            ]
        specs.append(TensorSpec(pre + "norm.weight", "output_norm.weight", (hp.n_embd,), ROLE_NORM,
                                transform=_plus_one))
        if not hp.tied:
            specs.append(TensorSpec("lm_head.weight", "output.weight", (hp.n_vocab, hp.n_embd),
                                    ROLE_OUTPUT))
        return specs

    def skipped_part(self, name: str) -> str | None:
        if name.startswith("mtp.") or name.startswith("model.mtp."):
            return "multi-token-prediction head (mtp.*)"
        if self.conditional and name.startswith("model.visual."):
            return "vision encoder (model.visual.*)"
        return None
