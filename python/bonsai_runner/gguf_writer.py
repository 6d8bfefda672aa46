"""GGUF v3 writer for every type this project stores, including ids 42, 142 and 143.

Layout written (little-endian; the reader is cpp/src/gguf.cpp):

    "GGUF" | u32 3 | u64 tensor_count | u64 kv_count
    key/values in insertion order: general.architecture first, general.alignment next (only if
        not the default 32), then the keys added with ``add``
    tensor infos in insertion order: name | u32 n_dims | u64 ne[n_dims] (ne0 = numpy's last axis)
        | u32 ggml id | u64 offset (from the data section start, a multiple of the alignment)
    zero padding to the alignment | tensor data, each padded with zeros to the alignment

Offsets are computed from shapes and types before a byte of data is produced, so tensors can be
given as zero-argument callables that are called during ``write()`` one at a time: a converter
streams a large model without holding it in memory. The file is written to ``path + ".tmp"`` in the
same directory and renamed over ``path`` only when complete; on any error the temporary file is
removed and ``path`` is left as it was.

gguf-py's writer cannot be used: it rejects ggml ids it does not know (42 in gguf 0.19, 142, 143).
"""

from __future__ import annotations

import enum
import os
import struct
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np

from .errors import BonsaiError
from .ggml_types import TypeInfo, type_info
from .mapped_pages import release

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_NAME_BYTES = 63  # llama.cpp refuses tensor names of GGML_MAX_NAME (64) bytes or more


class ValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format and integer range of the fixed-size scalar types.
_SCALAR_FORMAT = {
    ValueType.UINT8: "<B", ValueType.INT8: "<b", ValueType.UINT16: "<H", ValueType.INT16: "<h",
    ValueType.UINT32: "<I", ValueType.INT32: "<i", ValueType.UINT64: "<Q", ValueType.INT64: "<q",
    ValueType.FLOAT32: "<f", ValueType.FLOAT64: "<d", ValueType.BOOL: "<?",
}
_INT_RANGE = {
    ValueType.UINT8: (0, 2**8 - 1), ValueType.INT8: (-2**7, 2**7 - 1),
    ValueType.UINT16: (0, 2**16 - 1), ValueType.INT16: (-2**15, 2**15 - 1),
    ValueType.UINT32: (0, 2**32 - 1), ValueType.INT32: (-2**31, 2**31 - 1),
    ValueType.UINT64: (0, 2**64 - 1), ValueType.INT64: (-2**63, 2**63 - 1),
}
_NUMPY_VALUE_TYPE = {
    np.dtype(np.uint8): ValueType.UINT8, np.dtype(np.int8): ValueType.INT8,
    np.dtype(np.uint16): ValueType.UINT16, np.dtype(np.int16): ValueType.INT16,
    np.dtype(np.uint32): ValueType.UINT32, np.dtype(np.int32): ValueType.INT32,
    np.dtype(np.uint64): ValueType.UINT64, np.dtype(np.int64): ValueType.INT64,
    np.dtype(np.float32): ValueType.FLOAT32, np.dtype(np.float64): ValueType.FLOAT64,
    np.dtype(np.bool_): ValueType.BOOL,
}

TensorData = Union[np.ndarray, bytes, bytearray, memoryview]


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _infer_int(v: int) -> ValueType:
    if v < 0:
        return ValueType.INT32 if v >= -2**31 else ValueType.INT64
    return ValueType.UINT32 if v < 2**32 else ValueType.UINT64


def _infer_scalar(key: str, v: Any) -> ValueType:
    # numpy scalars are inferred by value like Python numbers (llama.cpp checks key types strictly,
    # so an np.int64 block count must still become UINT32); pass vtype for anything else.
    if isinstance(v, (bool, np.bool_)):
        return ValueType.BOOL
    if isinstance(v, (int, np.integer)):
        return _infer_int(int(v))
    if isinstance(v, (float, np.floating)):
        return ValueType.FLOAT32
    if isinstance(v, str):
        return ValueType.STRING
    raise BonsaiError(f"metadata key {key!r}: cannot store a value of type {type(v).__name__}; "
                      "use str, bool, int, float or a list of one of them")


def _infer_element(key: str, items: list) -> ValueType:
    if not items:
        raise BonsaiError(f"metadata key {key!r}: the element type of an empty array cannot be "
                          "inferred; pass vtype=ValueType.<element type>")
    kinds = {_infer_scalar(key, x) for x in items}
    if kinds <= {ValueType.STRING} or kinds <= {ValueType.BOOL} or kinds <= {ValueType.FLOAT32}:
        return kinds.pop()
    ints = {ValueType.UINT32, ValueType.INT32, ValueType.UINT64, ValueType.INT64}
    if kinds <= ints:
        # Integer lists are INT32 (what llama.cpp expects of e.g. tokenizer.ggml.token_type) unless
        # a value needs 64 bits.
        lo, hi = min(items), max(items)
        if lo >= -2**31 and hi < 2**31:
            return ValueType.INT32
        return ValueType.INT64 if lo < 0 else ValueType.UINT64
    if kinds <= ints | {ValueType.FLOAT32}:
        return ValueType.FLOAT32
    raise BonsaiError(f"metadata key {key!r}: array mixes element types "
                      f"({', '.join(sorted(k.name for k in kinds))}); GGUF arrays hold one type")


def _encode_string(s: str) -> bytes:
    b = s.encode("utf-8", "surrogateescape")  # the reader decodes stray bytes the same way
    return struct.pack("<Q", len(b)) + b


def _encode_scalar(key: str, vtype: ValueType, v: Any) -> bytes:
    if vtype == ValueType.STRING:
        if not isinstance(v, str):
            raise BonsaiError(f"metadata key {key!r}: STRING value must be a str, got {v!r}")
        return _encode_string(v)
    if vtype in _INT_RANGE:
        if isinstance(v, (float, np.floating)) or not isinstance(v, (int, np.integer)):
            raise BonsaiError(f"metadata key {key!r}: {vtype.name} value must be an integer, "
                              f"got {v!r}")
        lo, hi = _INT_RANGE[vtype]
        if not lo <= int(v) <= hi:
            raise BonsaiError(f"metadata key {key!r}: value {int(v)} does not fit {vtype.name} "
                              f"({lo}..{hi})")
        return struct.pack(_SCALAR_FORMAT[vtype], int(v))
    if vtype == ValueType.BOOL:
        if not isinstance(v, (bool, np.bool_)):
            raise BonsaiError(f"metadata key {key!r}: BOOL value must be True or False, got {v!r}")
        return struct.pack("<?", bool(v))
    if vtype in (ValueType.FLOAT32, ValueType.FLOAT64):
        if isinstance(v, (bool, str)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise BonsaiError(f"metadata key {key!r}: {vtype.name} value must be a number, "
                              f"got {v!r}")
        return struct.pack(_SCALAR_FORMAT[vtype], float(v))
    raise BonsaiError(f"metadata key {key!r}: {vtype.name} is not a scalar type")


def encode_value(key: str, value: Any, vtype: ValueType | None = None) -> bytes:
    """Encodes one value as ``u32 type | payload``; for a list/tuple/1-D array, vtype (if given)
    is the element type."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise BonsaiError(f"metadata key {key!r}: arrays must be one-dimensional")
        if vtype is None:
            if value.dtype not in _NUMPY_VALUE_TYPE:
                raise BonsaiError(f"metadata key {key!r}: cannot store numpy dtype {value.dtype}")
            vtype = _NUMPY_VALUE_TYPE[value.dtype]
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        elem = ValueType(vtype) if vtype is not None else _infer_element(key, list(value))
        if elem == ValueType.ARRAY:
            raise BonsaiError(f"metadata key {key!r}: for a list, vtype is the element type "
                              "(arrays of arrays are not supported)")
        body = b"".join(_encode_scalar(key, elem, x) for x in value)
        return struct.pack("<IIQ", ValueType.ARRAY, elem, len(value)) + body
    vt = ValueType(vtype) if vtype is not None else _infer_scalar(key, value)
    if vt == ValueType.ARRAY:
        raise BonsaiError(f"metadata key {key!r}: ValueType.ARRAY needs a list value")
    return struct.pack("<I", vt) + _encode_scalar(key, vt, value)


def _resolves_as_written(info: TypeInfo, n_elements: int, row: int, alignment: int) -> bool:
    """Whether a reader, which tells the two id-42 layouts apart by the padded byte span a tensor
    occupies, will recover `info` (mirror of the rule in cpp/src/gguf.cpp)."""
    if info.file_id != 42:
        return True
    size = info.row_bytes(n_elements)
    span = _align(size, alignment)
    if span == size:
        return True
    other = type_info("q2_0_g128" if info.name == "Q2_0" else "q2_0")
    if row % other.block_size:
        return True
    osize = other.row_bytes(n_elements)
    return not (osize == span or osize <= span <= _align(osize, alignment))


@dataclass
class _Tensor:
    name: str
    info: TypeInfo
    shape: tuple[int, ...]  # numpy order
    nbytes: int
    data: TensorData | Callable[[], TensorData]
    offset: int = 0


class GGUFWriter:
    """Writes one GGUF v3 file. Usage::

        w = GGUFWriter("model.gguf", "llama")
        w.add("llama.block_count", 2)
        w.add_tensor("token_embd.weight", emb_f16, "F16", emb_f16.shape)
        w.add_tensor("blk.0.attn_q.weight", lambda: packed_bytes(), "PTQ1_0", (64, 128))
        w.write()
    """

    def __init__(self, path: str | os.PathLike, arch: str, alignment: int = DEFAULT_ALIGNMENT):
        if alignment <= 0 or alignment & (alignment - 1) or alignment % 8:
            raise BonsaiError(f"GGUF alignment must be a power of two and a multiple of 8, "
                              f"got {alignment}")
        self.path = os.fspath(path)
        self.alignment = alignment
        self._kv: dict[str, bytes] = {}
        self._tensors: dict[str, _Tensor] = {}
        self._written = False
        self.add("general.architecture", arch)
        if alignment != DEFAULT_ALIGNMENT:
            self.add("general.alignment", alignment, ValueType.UINT32)

    def add(self, key: str, value: Any, vtype: ValueType | None = None) -> None:
        """Adds a metadata key. The type is inferred (str -> STRING, bool -> BOOL, int -> UINT32
        (negative: INT32; 64-bit when needed), float -> FLOAT32, list -> ARRAY of the inferred
        element type with integer lists INT32, 1-D numpy array -> ARRAY of its dtype) unless
        `vtype` is given; for a list or array, `vtype` is the element type."""
        if not isinstance(key, str) or not key:
            raise BonsaiError(f"metadata key must be a non-empty string, got {key!r}")
        if key in self._kv:
            raise BonsaiError(f"metadata key {key!r} was added twice")
        self._kv[key] = encode_value(key, value, vtype)

    def add_tensor(self, name: str, data: TensorData | Callable[[], TensorData],
                   qtype: str | int | TypeInfo, shape: tuple[int, ...] | list[int]) -> None:
        """Adds a tensor of `shape` (numpy order, e.g. (rows, cols)) stored as `qtype`.

        `data` is the tensor (float32 for F32, float16 or uint16 bits for F16/BF16, or uint8 raw
        bytes of exactly the stored size for any type) or a zero-argument callable returning it,
        called during write()."""
        if not isinstance(name, str) or not name:
            raise BonsaiError(f"tensor name must be a non-empty string, got {name!r}")
        if name in self._tensors:
            raise BonsaiError(f"tensor {name!r} was added twice")
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise BonsaiError(f"tensor name {name!r} is longer than {MAX_NAME_BYTES} bytes, which "
                              "llama.cpp cannot read")
        try:
            info = type_info(qtype)
        except ValueError as e:
            raise BonsaiError(f"tensor {name!r}: {e}") from None
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= 4 or any(d <= 0 for d in shape):
            raise BonsaiError(f"tensor {name!r}: shape {shape} must have 1 to 4 positive "
                              "dimensions")
        n = 1
        for d in shape:
            n *= d
        if shape[-1] % info.block_size:
            raise BonsaiError(f"tensor {name!r}: rows of {shape[-1]} elements are not a multiple "
                              f"of the {info.name} block size {info.block_size}")
        if not _resolves_as_written(info, n, shape[-1], self.alignment):
            raise BonsaiError(f"tensor {name!r}: a {info.name} tensor of {n} elements is too small "
                              "to be told apart from the other id-42 layout by its size; store it "
                              "as PQ2_0 or PTQ1_0 instead")
        t = _Tensor(name, info, shape, info.row_bytes(n), data)
        if not callable(data):
            self._check_data(t, data)
        self._tensors[name] = t

    def _check_data(self, t: _Tensor, data: Any) -> memoryview:
        """Validates tensor data against its type and size; returns its bytes (C order)."""
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = np.frombuffer(data, dtype=np.uint8)
        if not isinstance(data, np.ndarray):
            raise BonsaiError(f"tensor {t.name!r}: data must be a numpy array or bytes, got "
                              f"{type(data).__name__}")
        dt = data.dtype
        allowed = {
            "F32": (np.float32,), "F16": (np.float16, np.uint16), "BF16": (np.uint16,),
        }.get(t.info.name, ())
        if dt == np.uint8:
            if data.nbytes != t.nbytes:
                raise BonsaiError(f"tensor {t.name!r}: {data.nbytes} bytes given, but {t.info.name} "
                                  f"of shape {t.shape} takes {t.nbytes} bytes")
        elif any(dt == a for a in allowed):
            if data.size * dt.itemsize != t.nbytes:
                raise BonsaiError(f"tensor {t.name!r}: {data.size} {dt} values given, shape "
                                  f"{t.shape} needs {t.nbytes // dt.itemsize}")
        else:
            hint = " (quantize it first)" if t.info.block_size > 1 else ""
            raise BonsaiError(f"tensor {t.name!r}: {dt} data cannot be stored as {t.info.name}"
                              f"{hint}; expected {' or '.join(np.dtype(a).name for a in allowed) or 'packed'}"
                              " values or uint8 raw bytes")
        if dt.byteorder == ">":
            data = data.astype(dt.newbyteorder("<"))
        return memoryview(np.ascontiguousarray(data)).cast("B")

    def _layout(self) -> None:
        offset = 0
        for t in self._tensors.values():
            t.offset = offset
            offset += _align(t.nbytes, self.alignment)

    def _header(self) -> bytes:
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self._tensors), len(self._kv))]
        for key, value in self._kv.items():
            parts.append(_encode_string(key))
            parts.append(value)
        for t in self._tensors.values():
            ne = t.shape[::-1]
            parts.append(_encode_string(t.name))
            parts.append(struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, t.info.file_id, t.offset))
        head = b"".join(parts)
        return head + bytes(_align(len(head), self.alignment) - len(head))

    def write(self) -> None:
        """Writes the file (temporary name, then rename). Can be called once."""
        if self._written:
            raise BonsaiError(f"{self.path}: write() was already called")
        self._written = True
        self._layout()
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise BonsaiError(f"cannot write {self.path}: directory {directory} does not exist")
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(self._header())
                for t in self._tensors.values():
                    data = t.data() if callable(t.data) else t.data
                    buf = self._check_data(t, data)
                    f.write(buf)
                    f.write(bytes(_align(t.nbytes, self.alignment) - t.nbytes))
                    release(data)  # a tensor read from a file mapping leaves the resident set
                    t.data = b""  # drop the reference so streamed tensors can be freed
            os.replace(tmp, self.path)
        except BaseException as e:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            if isinstance(e, OSError):
                raise BonsaiError(f"cannot write {self.path}: {e.strerror or e}") from e
            raise
