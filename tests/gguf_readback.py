"""Reading converted GGUF files back in tests, through readers independent of the converter.

Files holding only types the `gguf` package knows are read with gguf.GGUFReader and decoded with
gguf.quants (code the converter does not use for writing); files with Q2_0/PQ2_0/PTQ1_0 are read
with bonsai_runner.gguf_reader and decoded with bonsai_runner.quants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ReadBack:
    metadata: dict          # key -> value (arrays as lists)
    types: dict             # tensor name -> upper-case type name
    shapes: dict            # tensor name -> numpy-order shape
    raw: dict               # tensor name -> raw bytes (uint8, flat)

    def values(self, name: str) -> np.ndarray:
        return decode(self.types[name], self.raw[name], self.shapes[name])


def decode(type_name: str, raw: np.ndarray, shape) -> np.ndarray:
    import gguf

    t = type_name.upper()
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if t == "F32":
        return raw.view(np.float32).reshape(shape).copy()
    if t == "F16":
        return raw.view(np.float16).reshape(shape).astype(np.float32)
    if t == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if t in gguf.GGMLQuantizationType.__members__:
        qt = gguf.GGMLQuantizationType[t]
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        return gguf.quants.dequantize(raw.reshape(rows, -1), qt).reshape(shape)
    from bonsai_runner import quants

    return np.asarray(quants.dequantize(raw, t.lower(), tuple(shape)), dtype=np.float32)


def read_gguf(path) -> ReadBack:
    import gguf

    try:
        r = gguf.GGUFReader(str(path))
    except ValueError:
        return _read_bonsai(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    types, shapes, raw = {}, {}, {}
    for t in r.tensors:
        types[t.name] = t.tensor_type.name
        shapes[t.name] = tuple(int(d) for d in reversed(t.shape.tolist()))
        raw[t.name] = np.asarray(t.data).reshape(-1).view(np.uint8)
    return ReadBack(meta, types, shapes, raw)


def _read_bonsai(path) -> ReadBack:
    from bonsai_runner.gguf_reader import open_gguf

    g = open_gguf(str(path))
    types, shapes, raw = {}, {}, {}
    for t in g.tensors:
        types[t.name] = t.type_name.upper()
        shapes[t.name] = tuple(t.shape)
        raw[t.name] = np.asarray(g.tensor_bytes(t.name)).reshape(-1).view(np.uint8)
    return ReadBack(dict(g.metadata), types, shapes, raw)
