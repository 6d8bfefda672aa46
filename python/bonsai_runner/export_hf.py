"""Export a GGUF model as a Hugging Face checkpoint directory (the quantizer's input format).

`bonsai demo` quantizes the real model, which is published only as a GGUF file; the quantizer reads
Hugging Face directories. This exporter writes one from an F32/F16/BF16 GGUF (or any type the engine
dequantizes), for the architectures whose GGUF tensors are stored in Hugging Face order — qwen2 and
qwen3 (llama's q/k rows are permuted by the converter; un-permuting is not implemented, so llama
files are refused):
- config.json (Qwen2ForCausalLM / Qwen3ForCausalLM) from the `{arch}.*` metadata; vocab_size is
  the embedding's row count, tie_word_embeddings is set when the file has no output.weight;
- model.safetensors, float16, written tensor by tensor (header first, then each tensor dequantized
  and written), so memory holds one tensor at a time; names are the inverse of the converter's
  (blk.N.attn_q.weight -> model.layers.N.self_attn.q_proj.weight, ...);
- tokenizer.json (byte-level BPE: the GGUF token list and merges; normal tokens in model.vocab,
  control and user-defined tokens in added_tokens, unused padding tokens left out so the converter
  pads them back; the split regex of tokenizer.ggml.pre) and tokenizer_config.json (special tokens,
  add_bos_token, chat template). No normalizer is written: llama.cpp-style engines apply none.
The directory is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

from .errors import BonsaiError

ARCH_CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# config.json classes per GGUF architecture (the quantizer's GGUF input also takes llama, whose
# q/k rows it un-permutes itself: quantize/gguf_input.py)
CONFIG_CLASSES = {"llama": "LlamaForCausalLM", **ARCH_CLASSES}
BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def hf_name(gguf_name: str) -> str:
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}"
    raise BonsaiError(f"tensor {gguf_name!r} has no Hugging Face name in the qwen2/qwen3 layout; "
                      "this exporter handles only those architectures")


def _config(md: dict, arch: str, n_vocab: int, tied: bool, bos, eos) -> dict:
    def key(k, default=None):
        v = md.get(f"{arch}.{k}", default)
        if v is None:
            raise BonsaiError(f"metadata key {arch}.{k} is missing; the file is incomplete")
        return v

    n_head = int(key("attention.head_count"))
    n_embd = int(key("embedding_length"))
    cfg = {"architectures": [CONFIG_CLASSES[arch]], "model_type": arch,
           "hidden_size": n_embd, "intermediate_size": int(key("feed_forward_length")),
           "num_hidden_layers": int(key("block_count")), "num_attention_heads": n_head,
           "num_key_value_heads": int(key("attention.head_count_kv", n_head)),
           "hidden_act": "silu", "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
           "rope_theta": float(key("rope.freq_base", 10000.0)),
           "max_position_embeddings": int(key("context_length", 4096)),
           "vocab_size": n_vocab, "tie_word_embeddings": tied, "torch_dtype": "float16",
           "use_cache": True, "attention_dropout": 0.0}
    if bos is not None:
        cfg["bos_token_id"] = int(bos)
    if eos is not None:
        cfg["eos_token_id"] = int(eos)
    if arch == "qwen3":
        cfg["head_dim"] = int(md.get(f"{arch}.attention.key_length", n_embd // n_head))
        cfg["attention_bias"] = False
    if arch == "llama":
        head_dim = int(md.get(f"{arch}.attention.key_length", n_embd // n_head))
        if head_dim != n_embd // n_head:
            cfg["head_dim"] = head_dim
        scaling = md.get(f"{arch}.rope.scaling.type")
        if scaling == "linear":
            cfg["rope_scaling"] = {"rope_type": "linear",
                                   "factor": float(key("rope.scaling.factor"))}
        elif scaling not in (None, "none"):
            raise BonsaiError(f"{arch}.rope.scaling.type {scaling!r} is not supported here "
                              "(none or linear); start from the Hugging Face checkpoint")
    return cfg


def _split_regex(pre: str) -> str:
    from .convert.tokenizer_meta import PRE_TOKENIZER_REGEXES

    for regex, name in PRE_TOKENIZER_REGEXES.items():
        if name == pre:
            return regex
    raise BonsaiError(f"tokenizer.ggml.pre {pre!r} has no known split regex; known: "
                      + ", ".join(sorted(PRE_TOKENIZER_REGEXES.values())))


def _tokenizer_files(md: dict) -> tuple[dict, dict]:
    if md.get("tokenizer.ggml.model") != "gpt2":
        raise BonsaiError(f"tokenizer.ggml.model {md.get('tokenizer.ggml.model')!r}: the exporter "
                          "writes byte-level BPE (gpt2) tokenizers only")
    tokens = md.get("tokenizer.ggml.tokens")
    types = md.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens or [])
    merges = md.get("tokenizer.ggml.merges")
    if not tokens or merges is None or len(types) != len(tokens):
        raise BonsaiError("the file's tokenizer metadata is incomplete (tokens, token_type, merges)")
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": ty == TOKEN_CONTROL})
        elif ty != TOKEN_UNUSED:
            vocab[t] = i
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": None,
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": _split_regex(md.get("tokenizer.ggml.pre",
                                                                          "default"))},
               "behavior": "Isolated", "invert": False}, byte_level]},
          "post_processor": byte_level, "decoder": byte_level,
          "model": {"type": "BPE", "dropout": None, "unk_token": None,
                    "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                    "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                    "merges": list(merges)}}

    def tok(key):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    cfg = {"add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
           "add_prefix_space": False,
           "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"}
                                    for a in added},
           "bos_token": tok("bos"), "eos_token": tok("eos"), "pad_token": tok("padding"),
           "unk_token": None, "tokenizer_class": "Qwen2Tokenizer"}
    if isinstance(md.get("tokenizer.chat_template"), str):
        cfg["chat_template"] = md["tokenizer.chat_template"]
    return tj, cfg


def _tensor_f16(r, name: str) -> np.ndarray:
    t = r.tensor(name)
    if t.type_name in ("F32", "F16", "BF16"):
        a = r.tensor_array(name)
    elif r.type_info(name) is not None:
        a = r.dequantize_tensor(name)
    else:
        raise BonsaiError(f"tensor {name} has type {t.type_name}, which this exporter cannot "
                          "dequantize; convert the file to F16 first (bonsai convert --outtype f16 "
                          "--allow-lossy)")
    a = np.asarray(a, dtype=np.float32).reshape(t.shape)
    if not np.all(np.isfinite(a)):
        raise BonsaiError(f"tensor {name} holds NaN or infinite values")
    return a.astype(np.float16)


def _write_safetensors(r, names: list[str], path: Path) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for n in names:
        t = r.tensor(n)
        size = int(np.prod(t.shape)) * 2
        header[hf_name(n)] = {"dtype": "F16", "shape": [int(x) for x in t.shape],
                              "data_offsets": [offset, offset + size]}
        offset += size
    hdr = json.dumps(header).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr)
        for n in names:
            f.write(_tensor_f16(r, n).tobytes())


def export_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, force: bool = False,
              log=None) -> Path:
    """Writes the Hugging Face directory `out_dir` from `gguf_path`; returns its path."""
    from .gguf_reader import open_gguf

    out = Path(out_dir)
    if out.exists() and not force:
        raise BonsaiError(f"{out} already exists; pass force=True to replace it")
    if not Path(gguf_path).is_file():
        raise BonsaiError(f"model file not found: {gguf_path}")
    tmp = out.with_name(out.name + ".tmp")
    with open_gguf(gguf_path) as r:
        md = r.metadata
        arch = md.get("general.architecture")
        if any(k.startswith("prism.hadamard.") for k in md):
            raise BonsaiError(f"{gguf_path} is Hadamard-rotated (prism.hadamard.* keys); a Hugging Face "
                              "checkpoint has no place for the rotation, so export the unrotated file")
        if arch not in ARCH_CLASSES:
            raise BonsaiError(f"architecture {arch!r}: the exporter handles "
                              f"{', '.join(ARCH_CLASSES)} (tensors in Hugging Face order)")
        names = [t.name for t in r.tensors]
        for n in names:
            hf_name(n)
        n_vocab = int(r.tensor("token_embd.weight").shape[0])
        tied = "output.weight" not in names
        tj, tok_cfg = _tokenizer_files(md)
        cfg = _config(md, arch, n_vocab, tied, md.get("tokenizer.ggml.bos_token_id"),
                      md.get("tokenizer.ggml.eos_token_id"))
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
            (tmp / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False),
                                                encoding="utf-8")
            (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2,
                                                                  ensure_ascii=False),
                                                       encoding="utf-8")
            if log:
                log(f"exporting {len(names)} tensors of {gguf_path} as float16 safetensors")
            _write_safetensors(r, names, tmp / "model.safetensors")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
