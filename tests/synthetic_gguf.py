"""Random GGUF models written directly from packed bytes — no checkpoint, tokenizer training or
quantizer — for the CUDA tests and the GPU benchmark (numpy and bonsai_runner's own writer only,
so they run on machines without sentencepiece, tokenizers or the gguf package).

Linear layers get random packed blocks of the requested type with one fixed scale per block, chosen
so that every layer's outputs have roughly unit scale: ternary types hold random trit / 2-bit code
bytes, Q8_0 / Q4_0 random integers, F32 / F16 / BF16 normal values. Norm weights are near 1,
qwen2 gets q/k/v biases, qwen3 per-head q/k norms and a head size different from n_embd / n_head.
The vocabulary is a byte-fallback SentencePiece-style list ("llama" tokenizer model).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bonsai_runner.ggml_types import type_info
from bonsai_runner.gguf_writer import GGUFWriter

D_OFFSET = {"PTQ1_0": 26, "TQ1_0": 52, "TQ2_0": 64}   # scale offset inside a block (default 0)


def packed_weight(rng: np.random.Generator, rows: int, cols: int, wtype: str) -> np.ndarray:
    """Random rows x cols weight of `wtype` as the array GGUFWriter.add_tensor takes."""
    s = 1.0 / np.sqrt(cols)
    if wtype == "F32":
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)
    if wtype == "F16":
        return (rng.standard_normal((rows, cols)) * s).astype(np.float16)
    if wtype == "BF16":
        f = (rng.standard_normal((rows, cols)) * s).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16)
    info = type_info(wtype)
    nb = cols // info.block_size
    if wtype == "Q8_0":
        blocks = np.empty((rows, nb, info.type_size), np.uint8)
        blocks[..., 2:] = rng.integers(-127, 128, size=(rows, nb, 32), dtype=np.int8).view(np.uint8)
        d = s / 73.0
    elif wtype == "Q4_0":
        blocks = rng.integers(0, 256, size=(rows, nb, info.type_size), dtype=np.uint8)
        d = s / 4.6
    else:  # ternary / 2-bit: every byte value decodes to valid codes
        blocks = rng.integers(0, 243, size=(rows, nb, info.type_size), dtype=np.uint8)
        d = 1.2 * s
    off = D_OFFSET.get(wtype, 0)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(rows, nb))
    blocks[..., off:off + 2] = (signs * d).astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, nb * info.type_size)


def write_synthetic_model(path: Path, arch: str = "llama", hidden: int = 256, ffn: int = 512, n_layer: int = 4,
                          n_head: int = 4, n_head_kv: int = 2, head_dim: int | None = None, vocab: int = 512,
                          wtype: str = "PTQ1_0", emb_type: str = "F16", tied: bool = False,
                          seed: int = 0, head_type: str | None = None, same_blocks: bool = False) -> Path:
    """head_type: type of output.weight (default emb_type). same_blocks: every block gets the
    random linear weights of block 0 — for benchmark models of billions of weights,
    whose speed does not depend on the values, written in seconds."""
    rng = np.random.default_rng(seed)
    hd = head_dim or (2 * hidden // n_head if arch == "qwen3" else hidden // n_head)
    w = GGUFWriter(str(path), arch)
    for k, v in (("context_length", 4096), ("embedding_length", hidden), ("block_count", n_layer),
                 ("feed_forward_length", ffn), ("attention.head_count", n_head),
                 ("attention.head_count_kv", n_head_kv), ("attention.key_length", hd),
                 ("attention.value_length", hd), ("rope.dimension_count", hd), ("vocab_size", vocab)):
        w.add(f"{arch}.{k}", v)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add(f"{arch}.rope.freq_base", 10000.0 if arch == "llama" else 1000000.0)
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581t{i}" for i in range(vocab - len(toks))]
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", toks)
    w.add("tokenizer.ggml.scores", np.array([0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(vocab - 259)],
                                            np.float32))
    w.add("tokenizer.ggml.token_type", np.array([2, 3, 3] + [6] * 256 + [1] * (vocab - 259), np.int32))
    w.add("tokenizer.ggml.bos_token_id", 1)
    w.add("tokenizer.ggml.eos_token_id", 2)
    w.add("tokenizer.ggml.unknown_token_id", 0)

    def put(name, arr, ttype, shape):
        w.add_tensor(name, arr, ttype, shape)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    emb = packed_weight(rng, vocab, hidden, emb_type)
    if emb_type in ("F32", "F16"):
        emb = (emb * np.sqrt(hidden)).astype(emb.dtype)   # embeddings of unit scale
    put("token_embd.weight", emb, emb_type, (vocab, hidden))
    put("output_norm.weight", norm(hidden), "F32", (hidden,))
    if not tied:
        ht = head_type or emb_type
        put("output.weight", packed_weight(rng, vocab, hidden, ht), ht, (vocab, hidden))
    nq, nkv = n_head * hd, n_head_kv * hd
    first: dict = {}

    def block_weight(name, rows, cols):
        if not same_blocks:
            return packed_weight(rng, rows, cols, wtype)
        if name not in first:
            first[name] = packed_weight(rng, rows, cols, wtype)
        return first[name]

    for i in range(n_layer):
        b = f"blk.{i}."
        put(b + "attn_norm.weight", norm(hidden), "F32", (hidden,))
        put(b + "ffn_norm.weight", norm(hidden), "F32", (hidden,))
        if arch == "qwen2":
            for c, n in (("q", nq), ("k", nkv), ("v", nkv)):
                put(b + f"attn_{c}.bias", (0.5 * rng.standard_normal(n)).astype(np.float32), "F32", (n,))
        if arch == "qwen3":
            put(b + "attn_q_norm.weight", norm(hd), "F32", (hd,))
            put(b + "attn_k_norm.weight", norm(hd), "F32", (hd,))
        for name, rows, cols in (("attn_q", nq, hidden), ("attn_k", nkv, hidden), ("attn_v", nkv, hidden),
                                 ("attn_output", hidden, nq), ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden),
                                 ("ffn_down", hidden, ffn)):
            put(b + name + ".weight", block_weight(name, rows, cols), wtype, (rows, cols))
    w.write()
    return Path(path)
