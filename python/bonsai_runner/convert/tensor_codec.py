"""Encoding float32 tensors into the raw data of a GGUF tensor type, and decoding them back.

`encode` returns what GGUFWriter.add_tensor stores: float32/float16 arrays for F32/F16, the uint16
bits for BF16, and uint8 blocks (rows x row_bytes) for block types, made by
bonsai_runner.quants.quantize (round to nearest with the reference scale rule). `decode` is the
inverse (bonsai_runner.quants.dequantize for block types). `encode_exact` encodes and then decodes
again and compares with the input: the converters use it wherever a conversion must not change a
value, so "lossless" is a checked fact, not an assumption. Values compare as numbers (+0 == -0).
"""

from __future__ import annotations

import numpy as np

from ..errors import BonsaiError
from ..ggml_types import TYPES, TypeInfo, type_info
from .safetensors_file import bf16_bits_to_float32, float32_to_bf16_bits

FLOAT_TYPES = ("f32", "f16", "bf16")


class LossyConversion(BonsaiError):
    """A conversion that must be exact would change values of the named tensor."""

    def __init__(self, tensor: str, type_name: str, n_changed: int, max_abs_diff: float):
        self.tensor, self.type_name = tensor, type_name
        self.n_changed, self.max_abs_diff = n_changed, max_abs_diff
        super().__init__(f"{tensor}: {type_name.upper()} would change {n_changed} value(s) "
                         f"(max |diff| {max_abs_diff:.3g})")


def type_key(t: str | TypeInfo) -> str:
    """Lower-case type name; names of ggml types we do not encode (q4_k, ...) pass through."""
    if isinstance(t, str) and t.lower() not in TYPES:
        return t.lower()
    return type_info(t).name.lower()


def encode(x: np.ndarray, t: str | TypeInfo) -> np.ndarray:
    """float32 array -> raw tensor data of type `t` (rows keep their shape; blocks per row)."""
    k = type_key(t)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if k == "f32":
        return x
    if k == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if k == "bf16":
        return float32_to_bf16_bits(x)
    from .. import quants

    info = type_info(t)
    if x.shape[-1] % info.block_size:
        raise BonsaiError(f"{info.name} needs rows that are a multiple of {info.block_size} "
                          f"elements, got {x.shape[-1]}")
    return quants.quantize(x, info)


def decode(raw: np.ndarray, t: str | TypeInfo, shape: tuple[int, ...]) -> np.ndarray:
    """Raw tensor data of type `t` -> float32 array of `shape` (numpy order)."""
    k = type_key(t)
    if k == "f32":
        return np.asarray(raw).view(np.float32).reshape(shape)
    if k == "f16":
        return np.asarray(raw).view(np.float16).reshape(shape).astype(np.float32)
    if k == "bf16":
        return bf16_bits_to_float32(np.asarray(raw).view(np.uint16).reshape(shape))
    from .. import quants

    return np.asarray(quants.dequantize(np.asarray(raw).view(np.uint8), type_info(t), shape),
                      dtype=np.float32).reshape(shape)


def check_equal(name: str, t: str | TypeInfo, want: np.ndarray, got: np.ndarray) -> None:
    """Raises LossyConversion unless `got` equals `want` value for value."""
    if want.shape == got.shape and np.array_equal(want, got):
        return
    if want.shape != got.shape:
        raise LossyConversion(name, type_key(t), int(want.size), float("inf"))
    diff = want != got
    raise LossyConversion(name, type_key(t), int(diff.sum()),
                          float(np.nanmax(np.abs(want[diff] - got[diff]))))


def encode_exact(x: np.ndarray, t: str | TypeInfo, name: str) -> np.ndarray:
    """`encode`, verified: decoding the result gives `x` back exactly, or LossyConversion."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if type_key(t) == "f32":
        return x
    raw = encode(x, t)
    check_equal(name, t, x, decode(raw, t, x.shape))
    return raw


def raw_nbytes(t: str | TypeInfo, shape: tuple[int, ...]) -> int:
    info = type_info(t)
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows * info.row_bytes(int(shape[-1]))
