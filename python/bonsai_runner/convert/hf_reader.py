"""Reading a Hugging Face model directory: config.json, safetensors shards, tokenizer files.

A checkpoint is config.json plus either one `model.safetensors` (any `*.safetensors` file when there
is exactly one) or shards listed by `model.safetensors.index.json` ("weight_map": tensor -> file).
Every header is parsed and cross-checked when the directory is opened (a tensor the index promises
but its shard lacks, the same tensor in two shards, a shard that is missing or truncated), so bad
input fails before any output exists. Tensor data is read lazily, one tensor at a time, from
memory-mapped files: a model much larger than RAM converts with one tensor in memory.

Errors name the file (and the tensor, where there is one) and say how to fix it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BonsaiError
from .safetensors_file import FLOAT_DTYPES, SafetensorsFile, TensorEntry

INDEX_NAME = "model.safetensors.index.json"


def read_json(path: str | os.PathLike, what: str | None = None) -> Any:
    """Parses a JSON file; a missing or malformed file is a BonsaiError naming it and the place."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BonsaiError(f"{path}: not found{f' ({what})' if what else ''}") from None
    except UnicodeDecodeError as e:
        raise BonsaiError(f"{path}: not valid UTF-8 text (byte {e.start}); fix or re-download "
                          "the file") from None
    except OSError as e:
        raise BonsaiError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BonsaiError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}; "
                          "fix or re-download the file") from None
    except (RecursionError, ValueError) as e:  # nesting too deep; an integer of > 4300 digits
        raise BonsaiError(f"{path}: unreadable JSON ({type(e).__name__}: {e}); fix or re-download "
                          "the file") from None


class HfCheckpoint:
    """A Hugging Face model directory opened for conversion."""

    def __init__(self, model_dir: str | os.PathLike):
        self.dir = Path(model_dir)
        if not self.dir.is_dir():
            raise BonsaiError(f"{self.dir}: not a directory (expected a Hugging Face model "
                              "directory with config.json and *.safetensors)")
        cfg_path = self.dir / "config.json"
        if not cfg_path.is_file():
            raise BonsaiError(f"{self.dir}: no config.json; a Hugging Face model directory needs "
                              "config.json next to its *.safetensors files")
        self.config: dict = read_json(cfg_path)
        if not isinstance(self.config, dict):
            raise BonsaiError(f"{cfg_path}: expected a JSON object")
        self.files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, str] = {}
        self._open_weights()

    # ----- weights -----

    def _open_weights(self) -> None:
        index = self.dir / INDEX_NAME
        if index.is_file():
            data = read_json(index)
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise BonsaiError(f"{index}: no \"weight_map\" object; re-download the index")
            bad = next((v for v in weight_map.values() if not isinstance(v, str)), None)
            if bad is not None:
                raise BonsaiError(f"{index}: \"weight_map\" maps tensor names to shard file names, "
                                  f"found {bad!r}; re-download the index")
            for fname in sorted(set(weight_map.values())):
                self._open_file(fname, str(index))
            for name, fname in weight_map.items():
                if name not in self.files[fname].entries:
                    raise BonsaiError(f"{self.dir / fname}: tensor {name!r} is listed in {INDEX_NAME} "
                                      "but missing from this shard (incomplete download?)")
            extra = {n: f for f, sf in self.files.items() for n in sf.entries if n not in weight_map}
            for name, fname in extra.items():
                self._where.setdefault(name, fname)
            for name, fname in weight_map.items():
                self._where[name] = fname
            return
        shards = sorted(p.name for p in self.dir.glob("*.safetensors"))
        if not shards:
            hint = " (found PyTorch *.bin weights: save the model with safetensors)" \
                if any(self.dir.glob("*.bin")) else ""
            raise BonsaiError(f"{self.dir}: no *.safetensors weights{hint}")
        if len(shards) > 1 and "model.safetensors" not in shards:
            raise BonsaiError(f"{self.dir}: {len(shards)} safetensors files but no {INDEX_NAME} to "
                              "say which tensors they hold; re-download the index")
        names = ["model.safetensors"] if "model.safetensors" in shards else shards
        for fname in names:
            sf = self._open_file(fname, None)
            for name in sf.entries:
                if name in self._where:
                    raise BonsaiError(f"tensor {name!r} appears in both {self._where[name]} and "
                                      f"{fname}")
                self._where[name] = fname

    def _open_file(self, fname: str, index: str | None) -> SafetensorsFile:
        path = self.dir / fname
        if not path.is_file():
            raise BonsaiError(f"{path}: shard listed in {index} is missing (incomplete download?)")
        sf = SafetensorsFile(path)
        self.files[fname] = sf
        return sf

    def tensor_names(self) -> list[str]:
        return list(self._where)

    def entry(self, name: str) -> TensorEntry:
        try:
            return self.files[self._where[name]].entries[name]
        except KeyError:
            raise BonsaiError(f"{self.dir}: no tensor {name!r}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entry(name).shape

    def dtype(self, name: str) -> str:
        return self.entry(name).dtype

    def file_of(self, name: str) -> Path:
        return self.dir / self._where[name]

    def read_raw(self, name: str) -> np.ndarray:
        self.entry(name)
        return self.files[self._where[name]].read_raw(name)

    def read_float32(self, name: str) -> np.ndarray:
        """The tensor as float32; non-finite values are an error naming the tensor and the file."""
        self.entry(name)
        x = self.files[self._where[name]].read_float32(name)
        bad = ~np.isfinite(x)
        if bad.any():
            raise BonsaiError(f"{self.file_of(name)}: tensor {name!r} holds {int(bad.sum())} NaN/Inf "
                              f"value(s) of {x.size}: the checkpoint is corrupt (re-download or "
                              "re-export it)")
        return x

    def float_source_dtype(self) -> str:
        """The float dtype most weights are stored in ("F16", "BF16" or "F32")."""
        counts: dict[str, int] = {}
        for name in self._where:
            e = self.entry(name)
            if e.dtype in FLOAT_DTYPES:
                counts[e.dtype] = counts.get(e.dtype, 0) + e.nbytes
        return max(counts, key=counts.get) if counts else "F32"

    # ----- config and tokenizer -----

    @property
    def architecture(self) -> str:
        arches = self.config.get("architectures")
        if isinstance(arches, list) and arches and isinstance(arches[0], str):
            return arches[0]
        raise BonsaiError(f"{self.dir / 'config.json'}: no \"architectures\" list naming the model "
                          "class (e.g. \"LlamaForCausalLM\")")

    def optional_json(self, fname: str) -> dict | None:
        path = self.dir / fname
        if not path.is_file():
            return None
        data = read_json(path)
        if not isinstance(data, dict):
            raise BonsaiError(f"{path}: expected a JSON object")
        return data
