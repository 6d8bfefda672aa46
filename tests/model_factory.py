"""Tiny random models in Hugging Face layout, generated at test time (nothing is downloaded).

`make_hf_model(dir, ...)` writes config.json (as transformers writes it for LlamaForCausalLM /
Qwen2ForCausalLM / Qwen3ForCausalLM), safetensors weights under Hugging Face names (one file, or
shards with model.safetensors.index.json), and a tokenizer trained on the spot:
- "spm": a SentencePiece BPE model with byte fallback (sentencepiece.SentencePieceTrainer), saved
  as tokenizer.model + tokenizer_config.json;
- "bpe": a byte-level BPE (tokenizers, Qwen2's split regex + ByteLevel) with the special tokens
  <|endoftext|>, <|im_start|>, <|im_end|> and a ChatML chat template, saved as tokenizer.json +
  tokenizer_config.json.
Both are trained on TRAINING_TEXT (English, Chinese, code, emoji). The embedding has one row per
token unless `vocab` asks for more (padded vocabularies, as Qwen2.5 ships them).

`ternary=True` makes every linear weight exactly s x {-1, 0, +1} per `group` weights along the
input dimension, with scales exact in float16 and bfloat16 (use hidden/ffn multiples of 256 so the
256-blocks of TQ1_0/TQ2_0 fit, and `group=256` for a model they store losslessly).

The returned dict holds the facts tests compare against, the stored values included (as float32,
exactly what the files hold).
"""

from __future__ import annotations

import io
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a small test of the tokenizer and the converter.",
    "Ternary weights are -1, 0 or +1 times a scale; 128 weights share one scale.",
    "def add(a, b):\n    return a + b  # code sample\n",
    "for (int i = 0; i < n; ++i) { sum += x[i] * w[i]; }",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n",
    "你好，世界！今天天气很好。我们一起学习机器学习。",
    "量化模型可以在一张显卡上运行。",
    "Emoji: 🚀 rocket, 🦙 llama, ✅ done, 😀 smile.",
    "Numbers 3 33 333 3333 and 3.14159, dates 2024-01-01.",
    "I've been told he's there; we'll see what they'd say.",
]


def write_calibration(path: Path, repeats: int = 12) -> Path:
    """A JSONL calibration file of TRAINING_TEXT, `repeats` numbered copies of every line."""
    with open(path, "w", encoding="utf-8") as f:
        for i in range(repeats):
            for t in TRAINING_TEXT:
                f.write(json.dumps({"text": f"{t} ({i})"}) + "\n")
    return path

QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                     r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_USER_TOKEN = "<tool_call>"
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPM_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + "
    "eos_token }}{% endif %}{% endfor %}")

ARCH_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM"}


@lru_cache(maxsize=None)
def _spm_model(vocab_size: int = 384) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING_TEXT * 4), model_writer=buf, vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, num_threads=1,
        minloglevel=3, split_digits=True)
    return buf.getvalue()


@lru_cache(maxsize=None)
def _bpe_json(vocab_size: int = 320) -> str:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, \
        processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAINING_TEXT * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BPE_SPECIALS])
    tok.add_tokens([AddedToken(BPE_USER_TOKEN, special=False, normalized=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok.to_str()


def write_tokenizer(d: Path, kind: str) -> dict:
    """Writes the tokenizer files; returns {n_tokens, bos, eos, ...}."""
    if kind == "spm":
        import sentencepiece as spm

        proto = _spm_model()
        (d / "tokenizer.model").write_bytes(proto)
        sp = spm.SentencePieceProcessor(model_proto=proto)
        cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
               "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
               "tokenizer_class": "LlamaTokenizer", "model_max_length": 2048,
               "chat_template": SPM_TEMPLATE}
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        return {"n_tokens": sp.vocab_size(), "bos": sp.bos_id(), "eos": sp.eos_id(),
                "unk": sp.unk_id(), "chat_template": SPM_TEMPLATE}
    if kind == "bpe":
        text = _bpe_json()
        (d / "tokenizer.json").write_text(text, encoding="utf-8")
        tj = json.loads(text)
        ids = {a["content"]: a["id"] for a in tj["added_tokens"]}
        decoder = {str(a["id"]): {"content": a["content"], "special": a["special"],
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "single_word": False} for a in tj["added_tokens"]}
        cfg = {"add_bos_token": False, "add_prefix_space": False,
               "added_tokens_decoder": decoder, "bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "unk_token": None,
               "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768,
               "chat_template": CHATML_TEMPLATE}
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        n = max(max(tj["model"]["vocab"].values()), max(ids.values())) + 1
        return {"n_tokens": n, "bos": ids["<|endoftext|>"], "eos": ids["<|im_end|>"],
                "pad": ids["<|endoftext|>"], "chat_template": CHATML_TEMPLATE}
    raise ValueError(f"unknown tokenizer kind {kind!r}")


def _fp_exact_scales(rng, shape) -> np.ndarray:
    """Scales exact in float16 and bfloat16: 6 significant bits, magnitudes around 0.02."""
    return (rng.integers(32, 64, size=shape) / 2048.0).astype(np.float32)


def _ternary_matrix(rng, rows: int, cols: int, group: int) -> np.ndarray:
    t = rng.integers(-1, 2, size=(rows, cols // group, group)).astype(np.float32)
    s = _fp_exact_scales(rng, (rows, cols // group, 1))
    return (t * s).reshape(rows, cols)


def _store(x: np.ndarray, dtype: str):
    """(value as stored, as float32; what to hand to the safetensors writer)."""
    from bonsai_runner.convert.safetensors_file import bf16_bits_to_float32, float32_to_bf16_bits

    x = x.astype(np.float32)
    if dtype == "float32":
        return x, x
    if dtype == "float16":
        h = x.astype(np.float16)
        return h.astype(np.float32), h
    if dtype == "bfloat16":
        bits = float32_to_bf16_bits(x)
        return bf16_bits_to_float32(bits), ("BF16", bits)
    raise ValueError(dtype)


def make_hf_model(d, arch: str = "llama", hidden: int = 64, n_layer: int = 2, n_head: int = 4,
                  n_head_kv: int = 2, ffn: int = 128, vocab: int | None = None, tied: bool = False,
                  tokenizer: str = "spm", dtype: str = "float16", ternary: bool = False,
                  group: int = 128, seed: int = 0, shards: int = 1, head_dim: int | None = None,
                  rope_scaling: dict | None = None) -> dict:
    """Writes a tiny random `arch` model into directory `d`; returns the facts tests check."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tok = write_tokenizer(d, tokenizer)
    n_vocab = vocab or tok["n_tokens"]
    if n_vocab < tok["n_tokens"]:
        raise ValueError("vocab must be at least the tokenizer's size")
    if head_dim is None and arch == "qwen3":
        head_dim = 2 * hidden // n_head
    hd = head_dim or hidden // n_head
    config = {
        "architectures": [ARCH_CLASSES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6 if arch != "llama" else 1e-5,
        "rope_theta": 10000.0 if arch == "llama" else 1000000.0,
        "max_position_embeddings": 2048,
        "vocab_size": n_vocab,
        "tie_word_embeddings": tied,
        "bos_token_id": tok["bos"],
        "eos_token_id": tok["eos"],
        "torch_dtype": dtype,
        "transformers_version": "4.51.0",
        "use_cache": True,
        "attention_dropout": 0.0,
    }
    if arch == "qwen3":
        config["head_dim"] = hd
        config["attention_bias"] = False
    if arch == "llama":
        config["attention_bias"] = False
        config["mlp_bias"] = False
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    (d / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")

    def linear(rows, cols):
        if ternary:
            return _ternary_matrix(rng, rows, cols, group)
        return rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    q_rows, kv_rows = n_head * hd, n_head_kv * hd
    raw: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((n_vocab, hidden)).astype(np.float32) * 0.1}
    for i in range(n_layer):
        p = f"model.layers.{i}."
        raw[p + "input_layernorm.weight"] = norm(hidden)
        raw[p + "self_attn.q_proj.weight"] = linear(q_rows, hidden)
        raw[p + "self_attn.k_proj.weight"] = linear(kv_rows, hidden)
        raw[p + "self_attn.v_proj.weight"] = linear(kv_rows, hidden)
        if arch == "qwen2":
            for n, r in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
                raw[p + f"self_attn.{n}_proj.bias"] = 0.1 * rng.standard_normal(r).astype(np.float32)
        if arch == "qwen3":
            raw[p + "self_attn.q_norm.weight"] = norm(hd)
            raw[p + "self_attn.k_norm.weight"] = norm(hd)
        raw[p + "self_attn.o_proj.weight"] = linear(hidden, q_rows)
        raw[p + "post_attention_layernorm.weight"] = norm(hidden)
        raw[p + "mlp.gate_proj.weight"] = linear(ffn, hidden)
        raw[p + "mlp.up_proj.weight"] = linear(ffn, hidden)
        raw[p + "mlp.down_proj.weight"] = linear(hidden, ffn)
    raw["model.norm.weight"] = norm(hidden)
    if not tied:
        raw["lm_head.weight"] = rng.standard_normal((n_vocab, hidden)).astype(np.float32) * 0.1

    values, stored = {}, {}
    for name, x in raw.items():
        values[name], stored[name] = _store(x, dtype)
    files = _write_weights(d, stored, shards)
    return {"dir": d, "arch": arch, "config": config, "n_vocab": n_vocab,
            "n_tokens": tok["n_tokens"], "tokenizer": tokenizer, "tokens": tok, "dtype": dtype,
            "ternary": ternary, "group": group, "head_dim": hd, "tied": tied,
            "tensors": values, "files": files}


def _write_weights(d: Path, stored: dict, shards: int) -> list[str]:
    names = list(stored)
    use_package = not any(isinstance(v, tuple) for v in stored.values())
    if shards <= 1:
        _save(d / "model.safetensors", stored, use_package)
        return ["model.safetensors"]
    parts = [names[i::shards] for i in range(shards)]
    files, weight_map = [], {}
    for i, part in enumerate(parts):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        _save(d / fname, {n: stored[n] for n in part}, use_package)
        files.append(fname)
        weight_map.update({n: fname for n in part})
    total = sum((v[1] if isinstance(v, tuple) else v).nbytes for v in stored.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return files


def _save(path: Path, tensors: dict, use_package: bool) -> None:
    """F16/F32 through the `safetensors` package (an independent writer); BF16 through ours."""
    if use_package:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})
    else:
        from bonsai_runner.convert.safetensors_file import write_safetensors

        write_safetensors(path, tensors, metadata={"format": "pt"})
