"""GGUF -> GGUF re-typing, exact unless --allow-lossy.

Reading: bonsai_runner.gguf_reader (the C++ reader: every metadata value with its exact GGUF type,
tensors as zero-copy views; Q2_0 = 42 resolved by size, PQ2_0 = 142, PTQ1_0 = 143), with
gguf.GGUFReader as the fallback for a file the C++ reader refuses (its error is the one reported
when both do). Same values and types from both; the C++ one reads Qwen2.5-0.5B's 151k-token
vocabulary in 0.13 s where gguf.GGUFReader's Python field parser takes 16-18 s.
Dequantization: gguf.quants for the standard ids, bonsai_runner.quants for the ternary ones.

Output types of the tensors (a 1-D tensor is always F32, and so are convolution taps,
qwen35's ssm_conv1d, as llama.cpp's converter keeps them):
    auto                    every tensor keeps its type (metadata-only rewrite); types this
                            project cannot write (Q4_K, Q6_K, ...) need an explicit out type
    f32 / f16 / bf16 / q8_0 every 2-D tensor
    ternary types           the ternary tensors of a ternary file (PTQ1_0 -> Q2_0 for mainline
                            llama.cpp, ...); its Q8_0/Q4_0/F16 fallback tensors keep their types.
                            In a file without ternary tensors: every linear weight.
    q4_0                    linear weights; token embedding and output head keep their type
A tensor whose kept type cannot be written (Q6_K output head, ...) becomes F16.
Every conversion must reproduce the source values exactly (re-decoded and compared, tensor by
tensor, before anything is written), except with --allow-lossy; same-type copies and -> F32 are
exact by construction. Metadata is carried over: general.file_type is recomputed, the bonsai.*
scheme and fallback table follow the new types.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import BonsaiError
from ..ggml_types import TYPES, type_info
from .arch.base import STR, U32, MetaKV
from .gguf_out import add_metadata, check_outfile, open_writer
from .outtypes import (FILE_TYPE, OUTTYPES, TERNARY_OUTTYPES, check_embed_type, file_type_of,
                       fits_block)
from .plan import (PlannedTensor, RawTensor, find_lossy, lossy_error, needs_verification,
                   write_plan)
from .tensor_codec import decode

_SKIP_KEYS = ("general.architecture", "general.alignment", "general.file_type",
              "general.quantization_version")
_EMBD_OUT = ("token_embd.weight", "output.weight")
_ALWAYS_F32 = (".ssm_conv1d.weight",)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


class GgufSource:
    """A GGUF file's metadata (typed) and tensors (raw bytes, decodable)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise BonsaiError(f"{self.path}: no such file")
        self.metadata: list[MetaKV] = []
        self.tensors: list[RawTensor] = []
        self.names: list[str] = []
        try:
            self._read_with_bonsai()
        except BonsaiError as first:
            self.metadata, self.tensors, self.names = [], [], []
            try:
                self._read_with_gguf()
            except Exception:       # gguf-py's errors on a bad file are of any kind
                raise first from None

    def _read_with_gguf(self) -> None:
        import gguf

        r = gguf.GGUFReader(str(self.path))
        for key, f in r.fields.items():
            if key.startswith("GGUF."):
                continue
            main = f.types[0]
            vt = f.types[-1] if main == gguf.GGUFValueType.ARRAY else main
            if main == gguf.GGUFValueType.ARRAY and len(f.types) > 2:
                raise BonsaiError(f"{self.path}: nested array in {key} is not supported")
            self.metadata.append(MetaKV(key, f.contents(), vt.name))
        for t in r.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            tname = t.tensor_type.name.lower()
            raw = np.asarray(t.data).reshape(-1).view(np.uint8)
            self._add(t.name, tname, raw, shape)

    def _read_with_bonsai(self) -> None:
        from ..gguf_reader import open_gguf

        g = open_gguf(str(self.path))
        for key, value in g.metadata.items():
            vtype, elem = g.value_type(key)
            self.metadata.append(MetaKV(key, value, (elem or vtype).name))
        for t in g.tensors:
            self._add(t.name, t.type_name.lower(), np.asarray(g.tensor_bytes(t.name)),
                      tuple(t.shape))

    def _add(self, name: str, tname: str, raw: np.ndarray, shape: tuple[int, ...]) -> None:
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        data = raw.reshape(rows, -1) if raw.size % max(rows, 1) == 0 else raw
        self.tensors.append(RawTensor(tname, data, shape, _dequantizer(tname, data, shape, name)))
        self.names.append(name)

    def meta(self, key: str, default=None):
        for kv in self.metadata:
            if kv.key == key:
                return kv.value
        return default


def _dequantizer(tname: str, data: np.ndarray, shape, name: str) -> Callable[[], np.ndarray]:
    def run():
        if tname in TYPES:
            return decode(data, tname, shape)
        import gguf
        from gguf.quants import dequantize

        try:
            qt = gguf.GGMLQuantizationType[tname.upper()]
            return np.asarray(dequantize(data, qt), dtype=np.float32).reshape(shape)
        except (KeyError, NotImplementedError) as e:
            raise BonsaiError(f"{name}: cannot dequantize tensor type {tname.upper()} ({e})") \
                from None
    return run


def _out_type(name: str, src_type: str, shape, outtype: str, file_ternary: bool) -> str:
    if outtype == "auto":
        return src_type
    if len(shape) < 2 or name.endswith(_ALWAYS_F32):
        return "f32"
    if outtype in ("f32", "f16", "bf16", "q8_0"):
        return outtype
    src_ternary = src_type in TYPES and type_info(src_type).ternary
    if outtype in TERNARY_OUTTYPES:
        if file_ternary:
            return outtype if src_ternary else src_type
        return src_type if name in _EMBD_OUT else outtype
    if outtype == "q4_0":
        return src_type if name in _EMBD_OUT else outtype
    raise BonsaiError(f"unknown --outtype {outtype!r}")


def convert_gguf(src: str | Path, outfile: str | Path, outtype: str, *, allow_lossy: bool = False,
                 force: bool = False, model_name: str | None = None, progress: bool = True,
                 log: Callable[[str], None] = _stderr, hadamard: int | None = None,
                 hadamard_seed: int = 0, embd_type: str | None = None,
                 embed_type: str | None = None) -> Path:
    """Re-types the GGUF file `src` into `outfile`; exact unless `allow_lossy`. With `hadamard` = B,
    folds the prism.hadamard rotation into it (hadamard_fold.py). A rotated input keeps its
    rotation keys, which stay true: re-typing changes no tensor's basis. `embd_type` replaces the
    kept type of token_embd / output.weight (the directory path's temporary F32 file);
    `embed_type` (--embed-type) is their type whatever `outtype` says, rounded without asking."""
    outtype = outtype.lower()
    if outtype not in OUTTYPES:
        raise BonsaiError(f"unknown --outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    check_embed_type(embed_type)
    src = Path(src)
    out = check_outfile(outfile, force, [src])
    source = GgufSource(src)
    arch = source.meta("general.architecture")
    if not isinstance(arch, str):
        raise BonsaiError(f"{src}: no general.architecture key; not a model file")
    file_ternary = any(t.type_name in TYPES and type_info(t.type_name).ternary
                       for t in source.tensors)
    items, fell_back, unwritable = [], [], set()
    for name, t in zip(source.names, source.tensors):
        ot = _out_type(name, t.type_name, t.shape, outtype, file_ternary)
        chosen = name in _EMBD_OUT and (embed_type or (embd_type and ot == t.type_name))
        if chosen:  # the caller's explicit choice (embd_type: only where the type is kept)
            ot = embed_type or embd_type
        if ot not in TYPES:
            unwritable.add(ot.upper())
            ot = "f16"
        if ot != t.type_name and not fits_block(ot, t.shape[-1]):
            fell_back.append(name)
            ot = t.type_name
        role = ("linear" if len(t.shape) == 2 and name not in _EMBD_OUT
                and not name.endswith(_ALWAYS_F32) else "")
        exact = not allow_lossy and not (chosen and embed_type) and needs_verification(t.type_name, ot)
        items.append(PlannedTensor(name, t.shape, ot, (lambda t=t: t), exact, role))
    rotation_meta = []
    if hadamard:
        from .hadamard_fold import fold_plan

        items, rotation_meta = fold_plan(
            items, source.metadata, hadamard, hadamard_seed, allow_lossy,
            lambda n, shape, ot, load, role: PlannedTensor(n, shape, ot, load, False, role))
    if unwritable and outtype == "auto":
        raise BonsaiError(f"{src}: tensor types {', '.join(sorted(unwritable))} can be read but not "
                          "written by bonsai-runner; choose --outtype f32 (exact) or f16/bf16/q8_0 "
                          "or a ternary type (with --allow-lossy where values change)")
    if not allow_lossy:
        lossy = find_lossy(items, progress)
        if lossy:
            raise lossy_error(lossy, f"{src.name} to {outtype}")

    src_types = {n: t.type_name for n, t in zip(source.names, source.tensors)}
    retyped = {it.name: it.out_type for it in items if it.out_type != src_types.get(it.name)}
    meta = _carry_metadata(source, items, retyped, outtype, model_name) + rotation_meta
    writer = open_writer(out, arch)
    add_metadata(writer, meta)
    write_plan(writer, items, progress)
    if fell_back:
        log(f"{len(fell_back)} tensor(s) kept their type (rows do not fit the {outtype} block): "
            + ", ".join(fell_back))
    if hadamard:
        log(f"folded the Hadamard rotation (block {hadamard}, seed {hadamard_seed}) into "
            f"{len(rotation_meta[5].value)} weights and token_embd")
    if hadamard or source.meta("prism.hadamard.version") is not None:
        log("note: the file is rotated (prism.hadamard): this engine and PrismML's fork apply the "
            "matching activation rotation; mainline llama.cpp ignores those keys and would compute "
            "another function (for mainline, quantize with `bonsai quantize --rotate none`)")
    log(f"wrote {out} ({len(items)} tensors, {len(retyped)} re-typed; "
        f"{out.stat().st_size / 2**20:.1f} MiB)")
    return out


def _carry_metadata(source: GgufSource, items: list[PlannedTensor], retyped: dict[str, str],
                    outtype: str, model_name: str | None) -> list[MetaKV]:
    linear: dict[str, int] = {}
    for it in items:
        if it.role == "linear":
            linear[it.out_type] = linear.get(it.out_type, 0) + int(np.prod(it.shape))
    ftype = file_type_of({k: v for k, v in linear.items() if k in FILE_TYPE})
    meta = [MetaKV("general.file_type", ftype, U32)]
    if any(t not in ("f32", "f16", "bf16") for t in linear):
        meta.append(MetaKV("general.quantization_version", 2, U32))
    ternary = {t: n for t, n in linear.items() if t in TYPES and type_info(t).ternary}
    for kv in source.metadata:
        if kv.key in _SKIP_KEYS:
            continue
        if kv.key == "general.name" and model_name:
            kv = MetaKV(kv.key, model_name, STR)
        elif kv.key == "bonsai.fallback_table" and retyped:
            kv = MetaKV(kv.key, _retype_table(kv.value, retyped), STR)
        elif kv.key == "bonsai.quant.scheme" and ternary and outtype in TERNARY_OUTTYPES:
            kv = MetaKV(kv.key, max(ternary, key=ternary.get), STR)
        elif kv.key == "bonsai.quant.group_size" and ternary and outtype in TERNARY_OUTTYPES:
            kv = MetaKV(kv.key, type_info(max(ternary, key=ternary.get)).block_size, U32)
        meta.append(kv)
    if model_name and source.meta("general.name") is None:
        meta.append(MetaKV("general.name", model_name, STR))
    return meta


def _retype_table(value: str, retyped: dict[str, str]) -> str:
    try:
        table = json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return value
    if isinstance(table, list):
        for e in table:
            if isinstance(e, dict) and e.get("tensor") in retyped:
                e["type"] = type_info(retyped[e["tensor"]]).name
    return json.dumps(table)
