"""The conversion plan: every output tensor with its type, its source, and how exact it must be.

Both converters (HF/PTQ1 directory -> GGUF, GGUF -> GGUF) build a list of `PlannedTensor`s before
writing anything, then hand it to `write_plan`, which streams the tensors into GGUFWriter lazily
(one tensor in memory at a time) behind a progress bar.

A source is one of: a float32 array, a `PackedTensor` (codes + scales of a PTQ1_0 directory), or a
`RawTensor` (the bytes of a GGUF tensor). `convert_tensor` turns it into the raw data of the output
type: the same type is copied byte for byte, a packed tier becomes its own GGUF type by exact block
assembly, anything else is decoded to float32 and encoded.

Exactness: with `exact=True` the result must decode to the very values of the source
(tensor_codec.encode_exact); `find_lossy` runs those conversions once beforehand, so that every
tensor that would change is reported in one error and no output file is started. Planners leave
`exact` off for conversions that cannot change a value (`needs_verification`: same type, any ->
F32); a ternary tier's packing is verified on its own (ternary.pack_ternary).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from ..errors import BonsaiError
from .ptq1_pack import PackedTensor
from .tensor_codec import LossyConversion, encode, encode_exact, type_key


@dataclass
class RawTensor:
    type_name: str                          # e.g. "q4_k", "ptq1_0"
    data: np.ndarray                        # raw bytes as stored
    shape: tuple[int, ...]                  # numpy order
    dequantize: Callable[[], np.ndarray]    # -> float32 of `shape`


Source = Union[np.ndarray, PackedTensor, RawTensor]


@dataclass
class PlannedTensor:
    name: str                               # GGUF tensor name
    shape: tuple[int, ...]                  # numpy order
    out_type: str                           # type key ("f16", "ptq1_0", ...)
    load: Callable[[], Source]
    exact: bool = False                     # values must survive unchanged: verify
    role: str = ""


def needs_verification(src_type: str, out_type: str) -> bool:
    """False for conversions that cannot change a value: same type, or anything -> F32."""
    return out_type != "f32" and type_key(src_type) != type_key(out_type)


def convert_tensor(src: Source, out_type: str, name: str, exact: bool) -> np.ndarray:
    """The raw GGUF data of `src` in `out_type`."""
    if isinstance(src, RawTensor):
        if type_key(src.type_name) == out_type:
            return src.data
        x = src.dequantize()
    elif isinstance(src, PackedTensor):
        if src.tier.gguf_type == out_type:
            return src.to_gguf(name)
        x = src.dequantize()
    else:
        x = src
    return encode_exact(x, out_type, name) if exact else encode(x, out_type)


def find_lossy(items: list[PlannedTensor], progress: bool = True) -> list[LossyConversion]:
    """Runs every exact conversion that could change a value; returns those that would."""
    todo = [it for it in items if it.exact]
    lossy = []
    for it in _bar(todo, "checking exactness", progress):
        src = it.load()
        try:
            convert_tensor(src, it.out_type, it.name, exact=True)
        except LossyConversion as e:
            lossy.append(e)
    return lossy


def lossy_error(lossy: list[LossyConversion], what: str) -> BonsaiError:
    lines = [f"{len(lossy)} tensor(s) would change value(s) converting {what}:"]
    lines += [f"  {e}" for e in lossy[:50]]
    if len(lossy) > 50:
        lines.append(f"  ... and {len(lossy) - 50} more")
    lines.append("pass --allow-lossy to accept rounding, or choose an --outtype that holds these "
                 "values exactly (f32 always does); nothing was written")
    return BonsaiError("\n".join(lines))


def write_plan(writer, items: list[PlannedTensor], progress: bool = True) -> None:
    """Adds every planned tensor to `writer` lazily and writes the file."""
    bar = _bar(None, "writing tensors", progress, total=len(items))

    def producer(it: PlannedTensor):
        def make():
            src = it.load()
            data = convert_tensor(src, it.out_type, it.name, it.exact)
            if bar is not None:
                bar.update(1)
            return data
        return make

    for it in items:
        writer.add_tensor(it.name, producer(it), it.out_type, it.shape)
    try:
        writer.write()
    finally:
        if bar is not None:
            bar.close()


def _bar(items, desc: str, enabled: bool, total: int | None = None):
    if not enabled:
        return items if items is not None else None
    from tqdm import tqdm

    if items is not None:
        return tqdm(items, desc=desc, unit="tensor", file=sys.stderr, leave=False)
    return tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, leave=False)
