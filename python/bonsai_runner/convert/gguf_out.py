"""Opening the output GGUF and adding typed metadata to it (bonsai_runner.gguf_writer underneath).

Metadata travels through the converters as `MetaKV(key, value, vtype)` with the GGUF value type
named as in gguf_writer.ValueType ("UINT32", "STRING", ...; for arrays the element type). This module
is the one place that maps them onto the writer, and that refuses to overwrite an existing file
unless asked (the writer itself writes to a temporary name and renames when complete).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import BonsaiError
from .arch.base import MetaKV

_ARRAY_DTYPES = {"UINT8": np.uint8, "INT8": np.int8, "UINT16": np.uint16, "INT16": np.int16,
                 "UINT32": np.uint32, "INT32": np.int32, "FLOAT32": np.float32,
                 "UINT64": np.uint64, "INT64": np.int64, "FLOAT64": np.float64, "BOOL": np.bool_}


def check_outfile(outfile: str | os.PathLike, force: bool, sources: list[Path] = ()) -> Path:
    out = Path(outfile)
    if out.is_dir():
        raise BonsaiError(f"--outfile {out} is a directory; give a file name such as "
                          f"{out / 'model.gguf'}")
    for s in sources:
        if s.exists() and out.exists() and out.resolve() == Path(s).resolve():
            raise BonsaiError(f"--outfile {out} is the input file; choose another name")
    if out.exists() and not force:
        raise BonsaiError(f"{out} already exists; pass --force to overwrite it")
    if not out.parent.exists():
        raise BonsaiError(f"the directory of --outfile ({out.parent}) does not exist")
    return out


def open_writer(outfile: Path, arch: str):
    from ..gguf_writer import GGUFWriter

    return GGUFWriter(str(outfile), arch, alignment=32)


def add_metadata(writer, items: list[MetaKV]) -> None:
    from ..gguf_writer import ValueType

    for kv in items:
        vtype = ValueType[kv.vtype]
        value = kv.value
        if isinstance(value, (list, tuple, np.ndarray)) and kv.vtype in _ARRAY_DTYPES:
            value = np.asarray(value, dtype=_ARRAY_DTYPES[kv.vtype])
        elif isinstance(value, (list, tuple)):
            value = list(value)
        writer.add(kv.key, value, vtype)
