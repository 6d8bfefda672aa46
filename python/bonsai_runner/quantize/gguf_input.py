"""A GGUF file as the quantizer's input: the same interface as convert.hf_reader.HfCheckpoint.

`bonsai quantize --model-dir model.gguf` takes any GGUF whose tensor types the `gguf` package (or
this project's reader, for the ternary ids) can dequantize: F32/F16/BF16, Q8_0, Q4_K_M, ...
- config: a Hugging Face config.json dict built from the `{arch}.*` metadata (export_hf._config;
  architectures llama, qwen2, qwen3; vocab_size = the embedding's rows, tied when the file has
  no output.weight);
- tensors: listed under their Hugging Face names; `read_float32` dequantizes ONE tensor from the
  mapped file when asked, so the pipeline's memory stays bounded by one block as with
  safetensors. llama.cpp's converter permutes the q/k rows of llama-architecture files (rotate
  pairs instead of rotate halves); they are permuted back here, so the block forward, which uses
  the Hugging Face (rotate-halves) layout, is right. qwen2/qwen3 files are stored in HF order;
- tokenizer: tokenizer files rebuilt from the `tokenizer.*` metadata (gguf_tokenizer.py) in a
  temporary directory that lives as long as this object (`close()`); the quantizer tokenizes the
  calibration text with them and copies them into the PTQ1_0 directory, so the output GGUF gets
  the same tokenizer metadata and chat template back.
Lossy source types (Q4_K_M, ...) are quantized from their dequantized values: those values ARE
the model the result is measured against.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..errors import BonsaiError


def is_gguf_file(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert.arch.base.permute_rope_rows: llama's adjacent pairs -> HF halves."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise BonsaiError(f"cannot un-permute {rows} rows for {n_head} rotary heads")
    return np.ascontiguousarray(w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
                                .swapaxes(1, 2).reshape(w.shape))


class GgufCheckpoint:
    """A GGUF file opened as quantizer input (see the file header)."""

    def __init__(self, path: str | os.PathLike):
        from ..convert.gguf_to_gguf import GgufSource
        from ..export_hf import CONFIG_CLASSES, _config, hf_name
        from .gguf_tokenizer import write_tokenizer_files

        self.path = Path(path)
        self.src = GgufSource(self.path)
        md = {kv.key: kv.value for kv in self.src.metadata}
        self.metadata = md
        if any(k.startswith("prism.hadamard.") for k in md):
            raise BonsaiError(f"{self.path} is Hadamard-rotated (prism.hadamard.* keys); the quantizer runs "
                              "the Hugging Face layout, which has no rotation, so the output would be wrong. "
                              "Quantize the unrotated file, or re-type the rotated one with bonsai convert "
                              "--outtype ptq1_0 --allow-lossy (which keeps the rotation)")
        arch = md.get("general.architecture")
        if arch not in CONFIG_CLASSES:
            raise BonsaiError(f"{self.path}: architecture {arch!r} cannot be quantized; supported: "
                              f"{', '.join(CONFIG_CLASSES)}")
        if "rope_freqs.weight" in self.src.names:
            raise BonsaiError(f"{self.path}: rope_freqs.weight (Llama 3.1 rope scaling) is not "
                              "supported for GGUF input; quantize the Hugging Face checkpoint")
        self.arch = arch
        self._raw = dict(zip(self.src.names, self.src.tensors))
        self._hf = {}
        for n in self.src.names:
            try:
                self._hf[hf_name(n)] = n
            except BonsaiError:
                raise BonsaiError(f"{self.path}: tensor {n!r} has no place in the {arch} layout "
                                  "the quantizer knows") from None
        if "token_embd.weight" not in self._raw:
            raise BonsaiError(f"{self.path}: no token_embd.weight; the file is incomplete")
        n_vocab = int(self._raw["token_embd.weight"].shape[0])
        self.config = _config(md, arch, n_vocab, "output.weight" not in self._raw,
                              md.get("tokenizer.ggml.bos_token_id"),
                              md.get("tokenizer.ggml.eos_token_id"))
        dims = md.get(f"{arch}.rope.dimension_count")
        head_dim = self.config.get("head_dim",
                                   self.config["hidden_size"] // self.config["num_attention_heads"])
        if dims is not None and int(dims) != head_dim:
            raise BonsaiError(f"{self.path}: partial rotary embedding ({arch}.rope.dimension_count "
                              f"{dims} of head size {head_dim}) is not supported by the quantizer")
        self.source_types = sorted({t.type_name.upper() for t in self.src.tensors})
        self._tmp = tempfile.mkdtemp(prefix="bonsai-gguf-tokenizer-")
        try:
            write_tokenizer_files(md, self._tmp)
        except BaseException:
            self.close()
            raise
        self.tokenizer_dir = Path(self._tmp)

    # ----- HfCheckpoint's interface -----

    def tensor_names(self) -> list[str]:
        return list(self._hf)

    def _tensor(self, name: str):
        try:
            return self._raw[self._hf[name]]
        except KeyError:
            raise BonsaiError(f"{self.path}: no tensor for {name!r}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensor(name).shape)

    def dtype(self, name: str) -> str:
        return self._tensor(name).type_name.upper()

    def read_float32(self, name: str) -> np.ndarray:
        """One tensor, dequantized to float32 (q/k rows in Hugging Face order)."""
        from ..mapped_pages import release

        t = self._tensor(name)
        x = np.array(t.dequantize(), dtype=np.float32)
        release(t.data)
        bad = ~np.isfinite(x)
        if bad.any():
            raise BonsaiError(f"{self.path}: tensor {self._hf[name]!r} holds {int(bad.sum())} "
                              f"NaN/Inf value(s) of {x.size}: the file is corrupt")
        if self.arch == "llama":
            if name.endswith("self_attn.q_proj.weight") or name.endswith("self_attn.q_proj.bias"):
                x = unpermute_rope_rows(x, self.config["num_attention_heads"])
            elif name.endswith("self_attn.k_proj.weight") or name.endswith("self_attn.k_proj.bias"):
                x = unpermute_rope_rows(x, self.config["num_key_value_heads"])
        return x

    def sample_rows(self, name: str, rows: int = 8) -> np.ndarray:
        """A few rows as float32 (already-ternary detection; row order does not matter there)."""
        return self.read_float32(name)[:rows]

    def describe(self) -> dict:
        return {"gguf": str(self.path), "architecture": self.arch,
                "tensor_types": self.source_types}

    def close(self) -> None:
        tmp, self._tmp = getattr(self, "_tmp", None), None
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    def __del__(self):
        self.close()
