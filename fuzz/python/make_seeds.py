"""Writes the seed corpora of the Python-reader fuzzers (fuzz/python/fuzz_*.py) into a directory.

    python fuzz/python/make_seeds.py [OUT]        # default OUT: build/fuzz/python/seeds

OUT/gguf/         small GGUF files: the project's writer (F32, F16, Q8_0, PTQ1_0 tensors, every
                  metadata value type, a fallback table) and a tests/tiny_gguf.py-style file written
                  by the `gguf` package with a SentencePiece vocabulary shrunk to a few tokens
OUT/hf/           HF directories flattened into one "bundle" each (see fuzz_hf.py for the layout):
                  config.json + a safetensors shard of tests/model_factory.py's tiny model, shrunk
OUT/calibration/  JSONL and plain-text calibration files

Seeds are kept to a few KiB so that libFuzzer's mutations reach every header field quickly; nothing
here is committed, the corpora are regenerated from the code.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.append(str(ROOT / "python"))  # a fallback: an installed bonsai_runner (CI) wins

from bonsai_runner.convert.safetensors_file import write_safetensors  # noqa: E402
from bonsai_runner.gguf_writer import GGUFWriter, ValueType  # noqa: E402
from bonsai_runner.quants import quantize  # noqa: E402


def bundle(files: dict[str, bytes]) -> bytes:
    """The fuzz_hf.py input format: repeated (u8 name length, name, u32 size, bytes)."""
    out = b""
    for name, data in files.items():
        n = name.encode()
        out += struct.pack("<B", len(n)) + n + struct.pack("<I", len(data)) + data
    return out


def gguf_seeds(out: Path) -> None:
    rng = np.random.default_rng(0)
    w = GGUFWriter(out / "bonsai_types.gguf", "llama")
    w.add("general.name", "seed model ✓ 你好")
    w.add("llama.block_count", 1)
    w.add("llama.embedding_length", 128)
    w.add("llama.context_length", 64, ValueType.UINT64)
    w.add("llama.rope.freq_base", 10000.0)
    w.add("llama.rope.scale", 1.5, ValueType.FLOAT64)
    w.add("llama.flag", True)
    w.add("llama.small", -3, ValueType.INT8)
    w.add("llama.short", 7, ValueType.UINT16)
    w.add("llama.long", -2**40, ValueType.INT64)
    w.add("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>", "a", "b", "▁c"])
    w.add("tokenizer.ggml.scores", [0.0, 0.0, 0.0, -1.0, -2.0, -3.0])
    w.add("tokenizer.ggml.token_type", [2, 3, 3, 1, 1, 1])
    w.add("bonsai.fallback_table", json.dumps([{"tensor": "blk.0.ffn_down.weight", "type": "Q8_0",
                                                "reason": "down_proj default", "cosine": 0.97}]))
    w.add_tensor("token_embd.weight", rng.standard_normal((6, 128)).astype(np.float32), "F32", (6, 128))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(128).astype(np.float16), "F16", (128,))
    x = rng.standard_normal((2, 128)).astype(np.float32)
    w.add_tensor("blk.0.ffn_down.weight", quantize(x, "Q8_0"), "Q8_0", (2, 128))
    t = np.sign(rng.standard_normal((2, 128))).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", quantize(t, "PTQ1_0"), "PTQ1_0", (2, 128))
    w.write()

    w = GGUFWriter(out / "tiny_vocab.gguf", "qwen2", alignment=64)
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.tokens", ["h", "e", "he", "<|im_end|>"])
    w.add("tokenizer.ggml.merges", ["h e"])
    w.add("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")
    w.add("qwen2.attention.head_count", [4, 4], ValueType.INT32)
    w.add_tensor("output_norm.weight", np.ones(32, np.float32), "F32", (32,))
    w.write()

    import gguf  # the reference writer, as tests/tiny_gguf.py uses it

    g = gguf.GGUFWriter(str(out / "gguf_package.gguf"), "llama")
    g.add_block_count(1)
    g.add_context_length(32)
    g.add_tokenizer_model("llama")
    g.add_token_list(["<unk>", "<s>", "</s>", "<0x41>", "\u2581w"])
    g.add_token_scores([0.0] * 5)
    g.add_token_types([2, 3, 3, 6, 1])
    g.add_bos_token_id(1)
    g.add_tensor("output.weight", rng.standard_normal((5, 8)).astype(np.float32))
    g.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((4, 32)).astype(np.float16))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def hf_seeds(out: Path, tmp: Path) -> None:
    from model_factory import make_hf_model

    facts = make_hf_model(tmp / "m", arch="llama", hidden=32, n_layer=1, n_head=2, ffn=32)
    cfg = (Path(facts["dir"]) / "config.json").read_bytes()
    (out / "tiny_llama.bin").write_bytes(bundle({"config.json": cfg,
                                                 "model.safetensors": _small_shard(tmp)}))
    sharded = {"config.json": cfg}
    a, b = tmp / "a.safetensors", tmp / "b.safetensors"
    write_safetensors(a, {"model.embed_tokens.weight": np.ones((4, 4), np.float16)},
                      {"format": "pt"})
    write_safetensors(b, {"lm_head.weight": ("BF16", np.ones((4, 4), np.uint16)),
                          "model.norm.weight": np.ones(4, np.float32)})
    sharded["model-00001-of-00002.safetensors"] = a.read_bytes()
    sharded["model-00002-of-00002.safetensors"] = b.read_bytes()
    sharded["model.safetensors.index.json"] = json.dumps({"weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "model.norm.weight": "model-00002-of-00002.safetensors"}}).encode()
    (out / "sharded.bin").write_bytes(bundle(sharded))


def _small_shard(tmp: Path) -> bytes:
    p = tmp / "small.safetensors"
    write_safetensors(p, {"model.embed_tokens.weight": np.arange(16, dtype=np.float32).reshape(4, 4),
                          "model.layers.0.self_attn.q_proj.weight": np.ones((4, 4), np.float16),
                          "model.norm.weight": ("BF16", np.full(4, 0x3F80, np.uint16)),
                          "model.step": np.array([3], np.int64)})
    return p.read_bytes()


def calibration_seeds(out: Path) -> None:
    from model_factory import write_calibration

    (out / "samples.jsonl").write_text(
        json.dumps({"text": "def add(a, b):\n    return a + b", "domain": "code"}) + "\n"
        + json.dumps({"text": "你好，世界。"}, ensure_ascii=False) + "\n"
        + json.dumps({"text": "The quick brown fox.", "domain": "prose"}) + "\n", encoding="utf-8")
    (out / "plain.txt").write_text("First paragraph of prose.\n\nSecond one, with a number 42.\n",
                                   encoding="utf-8")
    p = write_calibration(out / "factory.txt", repeats=1)
    if p.stat().st_size > 4096:
        p.write_bytes(p.read_bytes()[:4096])


def main() -> None:
    import tempfile

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "fuzz" / "python" / "seeds"
    for sub in ("gguf", "hf", "calibration"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    gguf_seeds(out / "gguf")
    with tempfile.TemporaryDirectory() as tmp:
        hf_seeds(out / "hf", Path(tmp))
    calibration_seeds(out / "calibration")
    for sub in ("gguf", "hf", "calibration"):
        files = sorted((out / sub).iterdir())
        print(f"{out / sub}: {len(files)} seeds, "
              + ", ".join(f"{f.name} {f.stat().st_size} B" for f in files))


if __name__ == "__main__":
    main()
