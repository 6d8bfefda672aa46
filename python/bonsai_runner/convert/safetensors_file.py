"""The safetensors container: a validating header parser, lazy memory-mapped reads, and a writer.

Layout (https://github.com/huggingface/safetensors, all little-endian):
    u64 N | N bytes of JSON header | data
The header maps each tensor name to {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]}
(offsets relative to the start of the data, end exclusive) and may hold "__metadata__", a flat
str -> str dict. Writers pad the JSON with spaces so the data starts 8-byte aligned.

Reading never trusts the header: every entry is checked against the dtype table, its shape and the
bytes the file really has, so a truncated download or a corrupt header is one BonsaiError naming the
file and the tensor instead of garbage or a crash later. Tensor data is read through one np.memmap
per file, so only the tensor asked for is paged in.

BF16 has no numpy dtype: it is returned as raw uint16 bits by `read_raw` and widened to float32 by
`read_float32` (a bf16 value is the top half of the float32 with the same bits).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import BonsaiError

# safetensors dtype name -> numpy dtype of its raw storage (BF16 as its uint16 bits).
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
FLOAT_DTYPES = ("F32", "F16", "BF16")
_NUMPY_TO_DTYPE = {v: k for k, v in DTYPES.items() if k not in ("BF16", "U16")}
_NUMPY_TO_DTYPE[np.dtype("<u2")] = "U16"

_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str               # safetensors dtype name ("F16", "BF16", "I32", ...)
    shape: tuple[int, ...]   # numpy order
    begin: int               # absolute file offset of the first byte
    nbytes: int


class SafetensorsFile:
    """One .safetensors file: its validated header, and tensors read on demand."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.metadata: dict[str, str] = {}
        self.entries: dict[str, TensorEntry] = {}
        self._map: np.memmap | None = None
        self._parse_header()

    def _fail(self, msg: str) -> BonsaiError:
        return BonsaiError(f"{self.path}: {msg}")

    def _parse_header(self) -> None:
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise self._fail(f"file is {size} bytes, too short for a safetensors header "
                                     "(truncated download? fetch the file again)")
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or 8 + n > size:
                    raise self._fail(f"header length {n} does not fit in the file's {size} bytes "
                                     "(truncated or not a safetensors file)")
                raw = f.read(n)
        except OSError as e:
            raise self._fail(f"cannot read: {e.strerror or e}") from None
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            raise self._fail(f"malformed safetensors header ({type(e).__name__}: {e})") from None
        if not isinstance(header, dict):
            raise self._fail("malformed safetensors header (not a JSON object)")
        data_start = 8 + n
        data_len = size - data_start
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise self._fail("malformed safetensors header (__metadata__ is not an object)")
        self.metadata = {str(k): str(v) for k, v in meta.items()}
        for name, info in header.items():
            self.entries[name] = self._check_entry(name, info, data_start, data_len)

    def _check_entry(self, name: str, info, data_start: int, data_len: int) -> TensorEntry:
        if not isinstance(info, dict):
            raise self._fail(f"tensor {name!r}: malformed header entry")
        dtype = info.get("dtype")
        if dtype not in DTYPES:
            raise self._fail(f"tensor {name!r}: unsupported dtype {dtype!r} "
                             f"(known: {', '.join(DTYPES)})")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        def count(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        if (not isinstance(shape, list) or not all(count(d) for d in shape)
                or not isinstance(offs, list) or len(offs) != 2
                or not all(count(o) for o in offs) or offs[1] < offs[0]):
            raise self._fail(f"tensor {name!r}: malformed shape or data_offsets in the header")
        nbytes = DTYPES[dtype].itemsize
        for d in shape:  # Python ints: a product past 2**63 must not wrap around
            nbytes *= d
        if offs[1] - offs[0] != nbytes:
            raise self._fail(f"tensor {name!r}: data_offsets span {offs[1] - offs[0]} bytes but "
                             f"{dtype} {shape} needs {nbytes}")
        if offs[1] > data_len:
            raise self._fail(f"tensor {name!r} ends at byte {data_start + offs[1]} but the file has "
                             f"only {data_start + data_len} bytes: the file is truncated "
                             "(re-download it)")
        return TensorEntry(name, dtype, tuple(shape), data_start + offs[0], nbytes)

    def _mapping(self) -> np.memmap:
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map

    def read_raw(self, name: str) -> np.ndarray:
        """The tensor in its storage dtype (BF16 as uint16 bits), a read-only view of the file."""
        e = self.entries[name]
        if e.nbytes == 0:
            return np.zeros(e.shape, DTYPES[e.dtype])
        buf = self._mapping()[e.begin:e.begin + e.nbytes]
        return buf.view(DTYPES[e.dtype]).reshape(e.shape)

    def read_float32(self, name: str) -> np.ndarray:
        """A float tensor (F32/F16/BF16) widened to a new float32 array."""
        e = self.entries[name]
        if e.dtype not in FLOAT_DTYPES:
            raise self._fail(f"tensor {name!r} has dtype {e.dtype}; a float weight "
                             f"({'/'.join(FLOAT_DTYPES)}) was expected")
        raw = self.read_raw(name)
        if e.dtype == "BF16":
            return bf16_bits_to_float32(raw)
        return raw.astype(np.float32)


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Rounds float32 to bfloat16 (nearest, ties to even; NaN kept quiet) and returns the bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def write_safetensors(path: str | os.PathLike,
                      tensors: Mapping[str, np.ndarray | tuple[str, np.ndarray]],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Writes `tensors` (name -> array, or name -> (dtype name, raw array) for BF16) to `path`.

    The file is written under a temporary name in the same directory and renamed when complete.
    """
    path = Path(path)
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    arrays = []
    offset = 0
    for name, t in tensors.items():
        if isinstance(t, tuple):
            dtype, arr = t
            if dtype not in DTYPES or DTYPES[dtype] != np.asarray(arr).dtype.newbyteorder("<"):
                raise BonsaiError(f"tensor {name!r}: raw data for {dtype} must be "
                                  f"{DTYPES.get(dtype)} bits")
        else:
            arr = t
            dtype = _NUMPY_TO_DTYPE.get(np.asarray(arr).dtype.newbyteorder("<"))
            if dtype is None:
                raise BonsaiError(f"tensor {name!r}: numpy dtype {np.asarray(arr).dtype} has no "
                                  "safetensors equivalent")
        arr = np.ascontiguousarray(arr, dtype=DTYPES[dtype])
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        arrays.append(arr)
        offset += arr.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-(8 + len(blob)) % 8)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for arr in arrays:
                f.write(arr.tobytes())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
