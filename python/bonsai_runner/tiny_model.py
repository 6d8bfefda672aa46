"""A tiny random-weight llama model in Hugging Face layout, generated on the spot (`bonsai demo --tiny`).

What it writes into a directory:
- tokenizer.model: a SentencePiece BPE model (byte fallback for the rarest 0.5% of characters,
  digits split) trained with the
  `sentencepiece` package on the texts of the built-in calibration set, and tokenizer_config.json
  (BOS added, a [INST] chat template);
- config.json (LlamaForCausalLM) and model.safetensors in float16: random Gaussian linear weights
  scaled by 1/sqrt(fan-in), norms near 1, embeddings and head at 0.1 std.
The hidden size and FFN width default to multiples of 128 so every linear weight splits into
PTQ1_0's groups of 128. Nothing is downloaded; the same seed gives the same files.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'system' %}"
    "{{ '<<SYS>> ' + message['content'] + ' <</SYS>> ' }}{% else %}{{ message['content'] + "
    "eos_token }}{% endif %}{% endfor %}")


def _training_texts() -> list[str]:
    from .quantize.calibration import default_calibration_file

    texts = []
    with open(default_calibration_file(), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                texts.append(json.loads(line)["text"])
    return texts


def _spm_model(vocab_size: int) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_texts()), model_writer=buf, vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=0.995, num_threads=1,
        minloglevel=3, split_digits=True, max_sentence_length=1 << 16)
    return buf.getvalue()


def make_tiny_model(d: str | Path, hidden: int = 128, ffn: int = 256, n_layer: int = 2,
                    n_head: int = 4, n_head_kv: int = 2, vocab_size: int = 1024,
                    seed: int = 0) -> Path:
    """Writes the model into directory `d` (created); returns its path."""
    import sentencepiece as spm

    from .convert.safetensors_file import write_safetensors

    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    proto = _spm_model(vocab_size)
    (d / "tokenizer.model").write_bytes(proto)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    n_vocab = sp.vocab_size()
    tok_cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
               "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
               "tokenizer_class": "LlamaTokenizer", "model_max_length": 2048,
               "chat_template": CHAT_TEMPLATE}
    (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2), encoding="utf-8")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": ffn, "num_hidden_layers": n_layer,
              "num_attention_heads": n_head, "num_key_value_heads": n_head_kv,
              "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": 2048, "vocab_size": n_vocab,
              "tie_word_embeddings": False, "bos_token_id": sp.bos_id(),
              "eos_token_id": sp.eos_id(), "torch_dtype": "float16", "attention_bias": False,
              "mlp_bias": False}
    (d / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    rng = np.random.default_rng(seed)
    hd = hidden // n_head

    def linear(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float16)

    t = {"model.embed_tokens.weight": (0.1 * rng.standard_normal((n_vocab, hidden))).astype(np.float16)}
    for i in range(n_layer):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(hidden)
        t[p + "self_attn.q_proj.weight"] = linear(n_head * hd, hidden)
        t[p + "self_attn.k_proj.weight"] = linear(n_head_kv * hd, hidden)
        t[p + "self_attn.v_proj.weight"] = linear(n_head_kv * hd, hidden)
        t[p + "self_attn.o_proj.weight"] = linear(hidden, n_head * hd)
        t[p + "post_attention_layernorm.weight"] = norm(hidden)
        t[p + "mlp.gate_proj.weight"] = linear(ffn, hidden)
        t[p + "mlp.up_proj.weight"] = linear(ffn, hidden)
        t[p + "mlp.down_proj.weight"] = linear(hidden, ffn)
    t["model.norm.weight"] = norm(hidden)
    t["lm_head.weight"] = (0.1 * rng.standard_normal((n_vocab, hidden))).astype(np.float16)
    write_safetensors(d / "model.safetensors", t, {"format": "pt"})
    return d
