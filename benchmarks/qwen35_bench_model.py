"""The synthetic Qwen3.5 of `bench_cpu.py --arch qwen35`: a ternary Hugging Face checkpoint.

`write_qwen35_checkpoint(dir, **QWEN35_MODEL)` writes what `Qwen3_5ForCausalLM.save_pretrained`
writes (config.json from transformers' own Qwen3_5TextConfig, one float16 model.safetensors) plus
the byte-level BPE tokenizer of tests/qwen35_factory.py, without building the torch module: the
tensors are drawn with numpy and written one matrix at a time, so the ~1 GB checkpoint takes
seconds and about its own size in memory.

Dimensions (QWEN35_MODEL) are Qwen3.5-27B's scaled to hidden 2048 (27B: hidden 5120, 24 query
heads / 4 KV heads of 256, linear_num_key_heads 16, linear_num_value_heads 48, key/value head
dims 128, intermediate 17408, 64 layers):
- hidden 2048, 8 layers in the 3:1 pattern (transformers' default layer_types: layers 3 and 7
  gated full attention, the other six Gated DeltaNet), FFN 6144;
- attention: 8 query heads / 2 KV heads of head_dim 256 (q_proj holds query and gate: 4096
  rows), partial_rotary_factor 0.25 (rope on 64 dims), rope_theta 1e7;
- GDN: 8 key heads / 16 value heads, key and value head dims 128 (in_proj_qkv 4096 rows,
  in_proj_z and out_proj 2048), conv kernel 4;
- vocabulary: the factory's tokenizer (~330 tokens) padded to 32000 embedding rows (as the llama
  benchmark model; the converter fills the gap with [PAD] tokens); untied output head.

Every linear weight, ssm_alpha / ssm_beta (in_proj_a / in_proj_b) included, is exactly
s x {-1, 0, +1} with one scale per 256 weights along the input (out_proj: one per row, as the
converter reorders its 128-column V heads) and scales exact in float16, so
PTQ1_0, TQ2_0 and Q8_0 hold all of them without loss and every converted file computes the same
function. The other tensors look like a trained model's, so activations stay finite: RMSNorm
weights are zero-centred offsets (Qwen3.5 multiplies by 1 + w), the GDN output norm a plain
weight near 1, A_log = log(uniform(1, 16)), dt_bias small, conv1d taps of std 0.5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

QWEN35_MODEL = {"arch": "qwen35", "hidden": 2048, "ffn": 6144, "n_layer": 8, "n_head": 8,
                "n_head_kv": 2, "head_dim": 256, "n_k_heads": 8, "n_v_heads": 16,
                "k_head_dim": 128, "v_head_dim": 128, "conv_kernel": 4, "vocab": 32000,
                "partial_rotary": 0.25, "tokenizer": "qwen35-bpe", "dtype": "float16",
                "ternary": True, "group": 256, "seed": 0}


def _ternary(rng, rows: int, cols: int, group: int) -> np.ndarray:
    """s x {-1, 0, +1}, one scale per `group` weights of a row; scales k / 2048, k in [32, 64)."""
    t = rng.integers(-1, 2, size=(rows, cols // group, group), dtype=np.int8)
    s = rng.integers(32, 64, size=(rows, cols // group, 1)).astype(np.float32) / 2048.0
    return (t * s).reshape(rows, cols).astype(np.float16)


def _normal(rng, shape, std: float, mean: float = 0.0) -> np.ndarray:
    return (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float16)


def _config(m: dict, tok: dict) -> dict:
    from transformers import Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(
        vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"],
        num_hidden_layers=m["n_layer"], num_attention_heads=m["n_head"],
        num_key_value_heads=m["n_head_kv"], head_dim=m["head_dim"],
        linear_num_key_heads=m["n_k_heads"], linear_num_value_heads=m["n_v_heads"],
        linear_key_head_dim=m["k_head_dim"], linear_value_head_dim=m["v_head_dim"],
        linear_conv_kernel_dim=m["conv_kernel"], max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=tok["eos"],
        pad_token_id=tok["pad"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": m["partial_rotary"]})
    config = cfg.to_dict()
    config["architectures"] = ["Qwen3_5ForCausalLM"]
    config["model_type"] = "qwen3_5_text"
    config["dtype"] = m["dtype"]
    return config


def _tensors(m: dict, layer_types: list[str], rng):
    """(Hugging Face name, float16 array) of every parameter, in save_pretrained's order."""
    h, f, g = m["hidden"], m["ffn"], m["group"]
    q_rows, kv_rows = m["n_head"] * m["head_dim"], m["n_head_kv"] * m["head_dim"]
    n_v, qk = m["n_v_heads"], 2 * m["n_k_heads"] * m["k_head_dim"]
    v_dim = n_v * m["v_head_dim"]
    yield "model.embed_tokens.weight", _normal(rng, (m["vocab"], h), 0.1)
    for i, kind in enumerate(layer_types):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", _normal(rng, (h,), 0.02)
        if kind == "linear_attention":
            la = p + "linear_attn."
            yield la + "in_proj_qkv.weight", _ternary(rng, qk + v_dim, h, g)
            yield la + "in_proj_z.weight", _ternary(rng, v_dim, h, g)
            yield la + "in_proj_a.weight", _ternary(rng, n_v, h, g)
            yield la + "in_proj_b.weight", _ternary(rng, n_v, h, g)
            yield la + "conv1d.weight", _normal(rng, (qk + v_dim, 1, m["conv_kernel"]), 0.5)
            yield la + "dt_bias", _normal(rng, (n_v,), 0.1)
            yield la + "A_log", np.log(rng.uniform(1.0, 16.0, n_v)).astype(np.float16)
            yield la + "norm.weight", _normal(rng, (m["v_head_dim"],), 0.02, mean=1.0)
            # one scale per row: the converter reorders the V heads (128 columns each) of
            # out_proj, so scale groups of 256 columns would not stay aligned
            yield la + "out_proj.weight", _ternary(rng, h, v_dim, v_dim)
        else:
            sa = p + "self_attn."
            yield sa + "q_proj.weight", _ternary(rng, 2 * q_rows, h, g)
            yield sa + "k_proj.weight", _ternary(rng, kv_rows, h, g)
            yield sa + "v_proj.weight", _ternary(rng, kv_rows, h, g)
            yield sa + "o_proj.weight", _ternary(rng, h, q_rows, g)
            yield sa + "q_norm.weight", _normal(rng, (m["head_dim"],), 0.02)
            yield sa + "k_norm.weight", _normal(rng, (m["head_dim"],), 0.02)
        yield p + "post_attention_layernorm.weight", _normal(rng, (h,), 0.02)
        yield p + "mlp.gate_proj.weight", _ternary(rng, f, h, g)
        yield p + "mlp.up_proj.weight", _ternary(rng, f, h, g)
        yield p + "mlp.down_proj.weight", _ternary(rng, h, f, g)
    yield "model.norm.weight", _normal(rng, (h,), 0.02)
    yield "lm_head.weight", _normal(rng, (m["vocab"], h), 0.1)


def write_qwen35_checkpoint(d, **m) -> dict:
    """Writes a checkpoint of QWEN35_MODEL-style dims `m` into directory `d`; returns its config."""
    from safetensors.numpy import save_file

    sys.path.insert(0, str(REPO / "tests"))
    from qwen35_factory import write_qwen35_tokenizer

    for k in ("hidden", "ffn"):
        if m[k] % m["group"]:
            raise ValueError(f"{k} {m[k]} is not a multiple of the scale group {m['group']}")
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    tok = write_qwen35_tokenizer(d)
    if m["vocab"] < tok["n_tokens"]:
        raise ValueError(f"vocab {m['vocab']} is smaller than the tokenizer ({tok['n_tokens']})")
    config = _config(m, tok)
    (d / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    rng = np.random.default_rng(m["seed"])
    tensors = dict(_tensors(m, config["layer_types"], rng))
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return config
