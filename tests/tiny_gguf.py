"""Tiny random models written as GGUF files by the `gguf` package (test fixtures).

`make_hf_weights` draws a 2-layer llama/qwen2/qwen3 model in Hugging Face layout (config dict +
float64 weights under HF names); `write_gguf` stores it as an F32 GGUF with llama.cpp's tensor
names, hyperparameter keys and q/k row permutation for llama — written by the `gguf` package, so
the files are independent of this project's converter and writer. With `vocab=True` it also
writes a minimal SentencePiece-style vocabulary (control tokens, 256 byte tokens, filler pieces) so
that llama.cpp can load the file.
"""

from __future__ import annotations

import gguf
import numpy as np

VOCAB = 300


def make_hf_weights(arch: str, seed: int = 0, tied: bool = False, rope_scaling=None):
    """A random 2-layer HF config + weights (float64); qwen3 gets a head_dim != hidden/heads."""
    rng = np.random.default_rng(seed)
    hidden, n_head, n_kv, n_ff = 64, 4, 2, 96
    head_dim = 32 if arch == "qwen3" else hidden // n_head
    cfg = {"model_type": arch, "hidden_size": hidden, "num_attention_heads": n_head,
           "num_key_value_heads": n_kv, "head_dim": head_dim, "intermediate_size": n_ff,
           "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0 if arch == "llama"
           else 1e6, "vocab_size": VOCAB, "tie_word_embeddings": tied, "rope_scaling": rope_scaling}

    def mat(rows, cols):
        return rng.normal(0.0, 1.0 / np.sqrt(cols), (rows, cols))

    def norm(n):
        return 1.0 + 0.1 * rng.normal(size=n)

    w = {"model.embed_tokens.weight": rng.normal(0.0, 1.0, (VOCAB, hidden)),
         "model.norm.weight": norm(hidden)}
    if not tied:
        w["lm_head.weight"] = mat(VOCAB, hidden)
    for i in range(2):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "self_attn.q_proj.weight"] = mat(n_head * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = mat(n_kv * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = mat(n_kv * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = mat(hidden, n_head * head_dim)
        w[p + "mlp.gate_proj.weight"] = mat(n_ff, hidden)
        w[p + "mlp.up_proj.weight"] = mat(n_ff, hidden)
        w[p + "mlp.down_proj.weight"] = mat(hidden, n_ff)
        if arch == "qwen2":
            for proj, n in (("q", n_head), ("k", n_kv), ("v", n_kv)):
                w[p + f"self_attn.{proj}_proj.bias"] = 0.5 * rng.normal(size=n * head_dim)
        if arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm(head_dim)
    return cfg, w


def _permute_for_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order: per head, rows (0, d/2, 1, d/2+1, ...), so that the pairs HF's
    rotate_half rotates together become adjacent (normal-mode rope)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm"}


def write_gguf(path, cfg, w, permute=True, extra_tensors=None, drop=(), arch=None, vocab=False):
    """Writes the HF weights as an F32 GGUF with llama.cpp names and hyperparameter keys."""
    arch = arch or cfg["model_type"]
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tensors = {"token_embd.weight": w["model.embed_tokens.weight"],
               "output_norm.weight": w["model.norm.weight"]}
    if "lm_head.weight" in w:
        tensors["output.weight"] = w["lm_head.weight"]
    for i in range(cfg["num_hidden_layers"]):
        for hf_name, gg_name in _NAMES.items():
            for kind in ("weight", "bias"):
                t = w.get(f"model.layers.{i}.{hf_name}.{kind}")
                if t is None:
                    continue
                if permute and arch == "llama" and hf_name in ("self_attn.q_proj",
                                                                "self_attn.k_proj"):
                    t = _permute_for_llama_cpp(t, n_head if "q_proj" in hf_name else n_kv)
                tensors[f"blk.{i}.{gg_name}.{kind}"] = t
    tensors.update(extra_tensors or {})
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    if cfg["head_dim"] != cfg["hidden_size"] // n_head:
        writer.add_key_length(cfg["head_dim"])
        writer.add_value_length(cfg["head_dim"])
    if vocab:
        _add_vocab(writer)
    if cfg.get("rope_scaling"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
    for name, t in tensors.items():
        if name not in drop:
            writer.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_vocab(writer) -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581w{i}" for i in range(VOCAB - len(tokens))]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (VOCAB - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
