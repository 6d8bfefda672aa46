"""The PTQ1_0 directory: what `bonsai quantize` writes and `bonsai convert` turns into one GGUF.

Specification: docs/ptq1_directory.md. In short, a Hugging Face model directory whose config.json
carries a compressed-tensors `quantization_config` (quant_method "compressed-tensors", format
"pack-quantized", one config group per tier listing its modules as targets, plus a "bonsai"
section: format_version, scheme, tier of each group, activation mode, and with `bonsai quantize
--rotate` the rotation whose rotated rows the weights are: method, block_size, seed, weight_names),
the tokenizer files, and
safetensors in which each quantized module `M` is stored as
    M.weight_packed  int32   [out, in * num_bits / 32]   (ptq1_pack.pack_codes)
    M.weight_scale   float16 [out, in / group]
    M.weight_shape   int64   [2] = [out, in]
while everything else keeps its plain `.weight` / `.bias` (F16/BF16/F32). quant_config.json holds
the per-tensor table (tier, group, scale statistics, sensitivity metrics, fallback reason) and the
bits-per-weight summary.

`Ptq1DirWriter` writes such a directory under a temporary name and renames it when complete.
`Ptq1Dir` reads one, checks every packed triple against its declared tier before anything is
converted (all problems reported at once), and presents the logical tensors (`M.weight` with its
real shape) to the converter, plus the codes of the quantized ones.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import BonsaiError
from ..ggml_types import type_info
from .hf_reader import HfCheckpoint, read_json
from .ptq1_pack import TIERS, PackedTensor, Tier, pack_codes, tier, unpack_codes
from .safetensors_file import DTYPES, _NUMPY_TO_DTYPE

FORMAT_VERSION = 1
QUANT_CONFIG = "quant_config.json"
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", "generation_config.json", "merges.txt", "vocab.json")
SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")
ACTIVATION_MODES = ("int8_per_token", "float")
_PLAIN_BPW = {"F32": 32.0, "F16": 16.0, "BF16": 16.0}


@dataclass
class TensorRecord:
    """One row of quant_config.json's tensor table."""

    tensor: str                      # Hugging Face weight name
    dtype: str                       # tier name ("ptq1_0", "q8_0", ...) or "F16"/"BF16"/"F32"
    shape: list[int]
    group_size: int | None = None
    scale_min: float | None = None
    scale_max: float | None = None
    scale_mean: float | None = None
    cosine: float | None = None
    rel_err: float | None = None
    loss_delta: float | None = None
    fallback_reason: str | None = None

    @property
    def bpw(self) -> float:
        if self.dtype in TIERS:
            return type_info(TIERS[self.dtype].gguf_type).bpw
        return _PLAIN_BPW.get(self.dtype, 16.0)

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, d: dict) -> "TensorRecord":
        known = {k: d.get(k) for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def is_linear(name: str, shape) -> bool:
    """2-D weights other than the token embedding and the output head."""
    return len(shape) == 2 and "embed_tokens" not in name and not name.startswith("lm_head")


def summarize(records: list[TensorRecord]) -> dict:
    """Bits per weight (GGUF sizes, scales included) over the linear layers and the whole file."""
    def bpw(rs):
        n = sum(int(np.prod(r.shape)) for r in rs)
        bits = sum(int(np.prod(r.shape)) * r.bpw for r in rs)
        return (round(bits / n, 4) if n else 0.0), n
    lin, n_lin = bpw([r for r in records if is_linear(r.tensor, r.shape)])
    allb, n_all = bpw(records)
    counts: dict[str, int] = {}
    for r in records:
        counts[r.dtype] = counts.get(r.dtype, 0) + 1
    return {"bpw_linear": lin, "bpw_file": allb, "params_linear": n_lin, "params_total": n_all,
            "tensors_by_type": counts,
            "fallback_count": sum(1 for r in records if r.fallback_reason)}


# ----- writer -----

class Ptq1DirWriter:
    """Writes a PTQ1_0 directory; use as a context manager (an exception removes everything)."""

    def __init__(self, out_dir: str | os.PathLike, config: dict, *, tokenizer_dir=None,
                 scheme: str = "ptq1_0", activation_mode: str = "int8_per_token",
                 calibration: dict | None = None, max_shard_bytes: int = 4 << 30,
                 force: bool = False, rotation: dict | None = None):
        self.out = Path(out_dir)
        if self.out.exists() and not force:
            raise BonsaiError(f"{self.out} already exists; pass --force to replace it")
        if scheme not in TIERS:
            raise BonsaiError(f"unknown scheme {scheme!r}; known tiers: {', '.join(TIERS)}")
        if activation_mode not in ACTIVATION_MODES:
            raise BonsaiError(f"unknown activation mode {activation_mode!r}; known: "
                              f"{', '.join(ACTIVATION_MODES)}")
        self.config = dict(config)
        self.config.pop("quantization_config", None)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else None
        self.scheme, self.activation_mode, self.calibration = scheme, activation_mode, calibration
        self.rotation = rotation       # quantize/rotation.py Rotation.describe(): rotated weights
        self.max_shard_bytes = max_shard_bytes
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-", dir=self.out.parent))
        self.records: list[TensorRecord] = []
        self.targets: dict[str, list[str]] = {t: [] for t in TIERS}
        self.ignore: list[str] = []
        self._pending: dict[str, dict] = {}       # name -> safetensors header entry
        self._pending_bytes = 0
        self._data = None                          # the open data file of the current shard
        self._shards: list[tuple[str, list[str]]] = []
        self._done = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.close()
        return False

    def add_quantized(self, name: str, tier_name: str, codes: np.ndarray, scales: np.ndarray, *,
                      cosine: float | None = None, rel_err: float | None = None,
                      loss_delta: float | None = None, fallback_reason: str | None = None) -> None:
        """Adds the quantized weight `name` (e.g. "model.layers.0.mlp.down_proj.weight")."""
        if not name.endswith(".weight"):
            raise BonsaiError(f"{name}: quantized tensors are module weights ending in .weight")
        t = tier(tier_name)
        p = PackedTensor(t, np.asarray(codes, dtype=np.int8),
                         np.asarray(scales, dtype=np.float16))
        p.check(name)
        module = name[: -len(".weight")]
        s = p.scales.astype(np.float32)
        self._stage(f"{module}.weight_packed", pack_codes(p.codes, t.num_bits))
        self._stage(f"{module}.weight_scale", p.scales)
        self._stage(f"{module}.weight_shape", np.array(p.codes.shape, dtype=np.int64))
        self.targets[t.name].append(module)
        self.records.append(TensorRecord(
            name, t.name, list(p.codes.shape), t.group, float(s.min()), float(s.max()),
            float(s.mean()), cosine, rel_err, loss_delta, fallback_reason))

    def add_plain(self, name: str, data: np.ndarray, dtype: str | None = None, *,
                  fallback_reason: str | None = None) -> None:
        """Adds an unquantized tensor; `dtype` "F32"/"F16"/"BF16" (default: F32 for 1-D, else F16)."""
        x = np.asarray(data)
        dtype = dtype or ("F32" if x.ndim < 2 else "F16")
        if dtype == "F32":
            self._stage(name, np.asarray(x, dtype=np.float32))
        elif dtype == "F16":
            self._stage(name, np.asarray(x, dtype=np.float16))
        elif dtype == "BF16":
            from .safetensors_file import float32_to_bf16_bits
            bits = x if x.dtype == np.uint16 else float32_to_bf16_bits(x.astype(np.float32))
            self._stage(name, ("BF16", bits))
        else:
            raise BonsaiError(f"{name}: plain tensors are F32, F16 or BF16, not {dtype}")
        if name.endswith(".weight") and x.ndim == 2:
            self.ignore.append(name[: -len(".weight")])
        self.records.append(TensorRecord(name, dtype, list(x.shape),
                                         fallback_reason=fallback_reason))

    def _stage(self, name: str, arr) -> None:
        """Streams the tensor's bytes to the shard's data file at once (memory stays bounded by
        one tensor, however large the model); _flush puts the safetensors header in front."""
        if isinstance(arr, tuple):
            dtype, a = arr
        else:
            a = np.asarray(arr)
            dtype = _NUMPY_TO_DTYPE.get(a.dtype.newbyteorder("<"))
            if dtype is None:
                raise BonsaiError(f"tensor {name!r}: numpy dtype {a.dtype} has no safetensors "
                                  "equivalent")
        a = np.ascontiguousarray(a, dtype=DTYPES[dtype])
        if self._pending and self._pending_bytes + a.nbytes > self.max_shard_bytes:
            self._flush()
        if self._data is None:
            self._data = open(self.tmp / ".shard-data", "wb")
        self._data.write(a.tobytes())
        self._pending[name] = {"dtype": dtype, "shape": list(a.shape),
                               "data_offsets": [self._pending_bytes,
                                                self._pending_bytes + a.nbytes]}
        self._pending_bytes += a.nbytes

    def _flush(self) -> None:
        fname = f"shard-{len(self._shards):05d}.safetensors"
        header = {"__metadata__": {"format": "pt"}, **self._pending}
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * (-(8 + len(blob)) % 8)
        data = self.tmp / ".shard-data"
        if self._data is not None:
            self._data.close()
            self._data = None
        with open(self.tmp / fname, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            if data.exists():
                with open(data, "rb") as src:
                    shutil.copyfileobj(src, f, 16 << 20)
        data.unlink(missing_ok=True)
        self._shards.append((fname, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def quantization_config(self) -> dict:
        groups, tiers = {}, {}
        for t in TIERS.values():
            if not self.targets[t.name]:
                continue
            gname = f"group_{len(groups)}"
            groups[gname] = {
                "targets": list(self.targets[t.name]),
                "weights": {"num_bits": t.num_bits, "type": "int", "symmetric": True,
                            "strategy": "group", "group_size": t.group, "dynamic": False,
                            "actorder": None},
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
            tiers[gname] = t.name
        return {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": groups,
            "ignore": list(self.ignore),
            "bonsai": {"format_version": FORMAT_VERSION, "scheme": self.scheme,
                       "group_size": TIERS[self.scheme].group, "tiers": tiers,
                       "activation_mode": self.activation_mode,
                       **({"rotation": self.rotation} if self.rotation is not None else {})},
        }

    def close(self) -> Path:
        """Writes index, config.json, quant_config.json and tokenizer files; renames into place."""
        if self._done:
            return self.out
        try:
            if self._pending or not self._shards:
                self._flush()
            self._finish_shards()
            cfg = dict(self.config)
            cfg["quantization_config"] = self.quantization_config()
            (self.tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n",
                                                  encoding="utf-8")
            qc = {"format_version": FORMAT_VERSION, "scheme": self.scheme,
                  "group_size": TIERS[self.scheme].group, "activation_mode": self.activation_mode,
                  "calibration": self.calibration,
                  "tensors": [r.to_json() for r in self.records],
                  "summary": summarize(self.records)}
            (self.tmp / QUANT_CONFIG).write_text(json.dumps(qc, indent=2) + "\n", encoding="utf-8")
            if self.tokenizer_dir is not None:
                for fname in TOKENIZER_FILES:
                    if (self.tokenizer_dir / fname).is_file():
                        shutil.copy2(self.tokenizer_dir / fname, self.tmp / fname)
            if self.out.exists():
                shutil.rmtree(self.out) if self.out.is_dir() else self.out.unlink()
            os.replace(self.tmp, self.out)
        except BaseException:
            self.abort()
            raise
        self._done = True
        return self.out

    def _finish_shards(self) -> None:
        n = len(self._shards)
        if n == 1:
            os.replace(self.tmp / self._shards[0][0], self.tmp / "model.safetensors")
            return
        weight_map = {}
        for i, (fname, names) in enumerate(self._shards):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(self.tmp / fname, self.tmp / final)
            weight_map.update({name: final for name in names})
        index = {"metadata": {}, "weight_map": weight_map}
        (self.tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n",
                                                               encoding="utf-8")

    def abort(self) -> None:
        if self._data is not None:
            self._data.close()
            self._data = None
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._done = True


# ----- reader -----

def quantization_method(config: dict) -> str | None:
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    return str(qc.get("quant_method", "unknown"))


def is_quantized_dir(path: str | os.PathLike) -> bool:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    data = read_json(cfg)
    return isinstance(data, dict) and quantization_method(data) is not None


@dataclass
class Ptq1Dir:
    """A PTQ1_0 directory opened for conversion (logical tensors + codes of quantized ones)."""

    path: Path
    ckpt: HfCheckpoint = field(init=False)
    bonsai: dict = field(init=False)
    module_tier: dict[str, Tier] = field(init=False)
    shapes: dict[str, tuple[int, ...]] = field(init=False)
    quant_config: dict = field(init=False)
    records: dict[str, TensorRecord] = field(init=False)

    def __post_init__(self):
        self.path = Path(self.path)
        self.ckpt = HfCheckpoint(self.path)
        self._read_quantization_config()
        self._index_tensors()
        self._read_quant_config()

    @property
    def config(self) -> dict:
        return self.ckpt.config

    def _read_quantization_config(self) -> None:
        qc = self.ckpt.config.get("quantization_config")
        where = self.path / "config.json"
        method = quantization_method(self.ckpt.config)
        if method != "compressed-tensors" or not isinstance(qc.get("bonsai"), dict):
            raise BonsaiError(f"{where}: quantization_config of method {method!r} is not a PTQ1_0 "
                              "directory (compressed-tensors with a \"bonsai\" section); quantized "
                              "checkpoints of other tools are not supported: convert the original "
                              "float checkpoint")
        self.bonsai = qc["bonsai"]
        version = self.bonsai.get("format_version")
        if version != FORMAT_VERSION:
            raise BonsaiError(f"{where}: PTQ1_0 directory format_version {version!r} is not "
                              f"supported (this version reads {FORMAT_VERSION})")
        if qc.get("format") not in (None, "pack-quantized"):
            raise BonsaiError(f"{where}: compressed-tensors format {qc.get('format')!r} is not "
                              "supported (only \"pack-quantized\")")
        tiers = self.bonsai.get("tiers") or {}
        self.module_tier = {}
        for gname, group in (qc.get("config_groups") or {}).items():
            if gname not in tiers:
                raise BonsaiError(f"{where}: config group {gname!r} has no tier in "
                                  "quantization_config.bonsai.tiers")
            t = tier(tiers[gname])
            w = group.get("weights") or {}
            want = {"num_bits": t.num_bits, "type": "int", "symmetric": True, "strategy": "group",
                    "group_size": t.group}
            bad = {k: w.get(k) for k, v in want.items() if w.get(k) != v}
            if bad:
                raise BonsaiError(f"{where}: config group {gname!r} (tier {t.name}) has weights "
                                  f"{bad}, expected {want}")
            for module in group.get("targets") or []:
                if module in self.module_tier:
                    raise BonsaiError(f"{where}: module {module!r} is in two config groups")
                self.module_tier[module] = t

    def _index_tensors(self) -> None:
        names = set(self.ckpt.tensor_names())
        problems = []
        self.shapes = {}
        for module, t in self.module_tier.items():
            parts = {s: f"{module}.{s}" for s in SUFFIXES}
            absent = [n for n in parts.values() if n not in names]
            if absent:
                problems.append(f"missing {', '.join(absent)}")
                continue
            names -= set(parts.values())
            shp = self.ckpt.read_raw(parts["weight_shape"])
            if self.ckpt.dtype(parts["weight_shape"]) != "I64" or shp.shape != (2,):
                problems.append(f"{parts['weight_shape']}: expected int64 [2]")
                continue
            out, n_in = (int(v) for v in shp)
            want = {parts["weight_packed"]: ("I32", (out, n_in * t.num_bits // 32)),
                    parts["weight_scale"]: ("F16", (out, n_in // t.group if t.group else 0))}
            if out <= 0 or n_in <= 0 or n_in % t.group:
                problems.append(f"{parts['weight_shape']}: [{out}, {n_in}] is not a matrix whose "
                                f"rows split into groups of {t.group}")
                continue
            for n, (dt, shape) in want.items():
                if self.ckpt.dtype(n) != dt or self.ckpt.shape(n) != shape:
                    problems.append(f"{n}: {self.ckpt.dtype(n)} {list(self.ckpt.shape(n))}, "
                                    f"expected {dt} {list(shape)} for tier {t.name}")
            self.shapes[f"{module}.weight"] = (out, n_in)
        stray = sorted(n for n in names if n.rsplit(".", 1)[-1] in SUFFIXES)
        if stray:
            problems.append("packed tensors of modules no config group lists: " + ", ".join(stray))
        if problems:
            raise BonsaiError(f"{self.path}: malformed PTQ1_0 directory:\n  " + "\n  ".join(problems))
        for n in names:
            self.shapes[n] = self.ckpt.shape(n)

    def _read_quant_config(self) -> None:
        path = self.path / QUANT_CONFIG
        self.quant_config = read_json(path) if path.is_file() else {}
        if not isinstance(self.quant_config, dict):
            raise BonsaiError(f"{path}: expected a JSON object")
        self.records = {}
        for row in self.quant_config.get("tensors") or []:
            if isinstance(row, dict) and isinstance(row.get("tensor"), str):
                self.records[row["tensor"]] = TensorRecord.from_json(row)

    def tier_of(self, name: str) -> Tier | None:
        if not name.endswith(".weight"):
            return None
        return self.module_tier.get(name[: -len(".weight")])

    def packed(self, name: str) -> PackedTensor:
        t = self.tier_of(name)
        module = name[: -len(".weight")]
        out, n_in = self.shapes[name]
        codes = unpack_codes(self.ckpt.read_raw(f"{module}.weight_packed"), t.num_bits, n_in)
        p = PackedTensor(t, codes, np.array(self.ckpt.read_raw(f"{module}.weight_scale")))
        p.check(name)
        return p

    def read_float32(self, name: str) -> np.ndarray:
        if self.tier_of(name) is not None:
            return self.packed(name).dequantize()
        return self.ckpt.read_float32(name)
