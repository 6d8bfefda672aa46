"""Reading GGUF files from Python: a thin facade over the C++ reader ``_core.GgufFile``.

The C++ side parses and validates the whole file on open (see cpp/src/gguf.cpp) and maps it into
memory; tensor bytes come back as zero-copy read-only numpy views that keep the mapping alive, so
a converter can walk a large model without copying it. Tensors of ggml types the engine cannot
run (Q4_K, ...) are listed with ``supported`` False and ``engine_type`` None, and their bytes are
readable all the same.

Malformed files are one BonsaiError each, whatever is wrong: the C++ reader validates every count,
length and type against the file's size before it allocates anything, and this facade turns the
Python-side failures of a corrupt file into BonsaiErrors too: metadata key names and tensor names
that are not valid UTF-8 (they are identifiers: a bad byte there means corruption), and engine
messages quoting such a name. String *values* that are not valid UTF-8 are kept, as surrogate
escapes (some vocabularies hold stray bytes; GGUFWriter writes them back unchanged);
`has_invalid_utf8` finds them for display.

    with open_gguf("model.gguf") as g:
        g.metadata["llama.block_count"], g.value_type("llama.block_count")  # 2, (UINT32, None)
        w = g.tensor_array("output_norm.weight")      # float32, numpy-order shape
        raw = g.tensor_bytes("blk.0.attn_q.weight")   # uint8 view of the packed blocks
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _core
from .errors import BonsaiError
from .ggml_types import TypeInfo, type_info
from .gguf_writer import ValueType

_MISSING = object()


def has_invalid_utf8(s: str) -> bool:
    """Whether `s` holds surrogate escapes, i.e. came from bytes that are not valid UTF-8."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def escape_invalid_utf8(s: str) -> str:
    """`s` with each byte that was not valid UTF-8 written as \\xNN (printable, encodable)."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _undecodable(e: UnicodeDecodeError) -> str:
    data = e.object if isinstance(e.object, (bytes, bytearray)) else b""
    return bytes(data).decode("utf-8", "backslashreplace")


def _parse_type_name(name: str) -> tuple[ValueType, ValueType | None]:
    if name.startswith("ARRAY[") and name.endswith("]"):
        return ValueType.ARRAY, ValueType[name[6:-1]]
    return ValueType[name], None


class GgufReader:
    """An open GGUF file. Close it (or use ``with``) to release this handle's reference to the
    mapping; arrays already returned stay valid."""

    def __init__(self, path: str | os.PathLike, use_mmap: bool = True):
        self.path = os.fspath(path)
        try:
            self._f = _core.GgufFile(self.path, use_mmap)
        except UnicodeDecodeError as e:  # the engine's message quotes a name that is not UTF-8
            raise BonsaiError(_undecodable(e)) from None
        self._types: dict[str, str] | None = None
        self._by_name: dict[str, Any] | None = None
        self._tensors: list | None = None
        try:
            self._check_names()
        except BaseException:
            self._f.close()
            raise

    def _check_names(self) -> None:
        for i, key in enumerate(self.metadata_types):
            if has_invalid_utf8(key):
                raise BonsaiError(f"{self.path}: metadata key #{i} ({escape_invalid_utf8(key)!r}) is "
                                  "not valid UTF-8: the file is corrupt (re-download or re-convert it)")
        for i, t in enumerate(self.tensors):
            try:
                t.name  # noqa: B018 - the binding decodes the name on access
            except UnicodeDecodeError as e:
                raise BonsaiError(f"{self.path}: the name of tensor #{i} ({_undecodable(e)!r}) is not "
                                  "valid UTF-8: the file is corrupt (re-download or re-convert it)") from None

    # File-level facts.
    @property
    def version(self) -> int:
        return self._f.version

    @property
    def alignment(self) -> int:
        return self._f.alignment

    @property
    def file_size(self) -> int:
        return self._f.file_size

    @property
    def data_offset(self) -> int:
        return self._f.data_offset

    # Metadata.
    @property
    def metadata(self) -> dict[str, Any]:
        """key -> value (int, float, bool, str, or a list of them), in file order."""
        return self._f.metadata

    @property
    def metadata_types(self) -> dict[str, str]:
        """key -> GGUF type name: 'UINT32', 'STRING', 'ARRAY[INT32]', ..."""
        if self._types is None:
            self._types = self._f.metadata_types
        return self._types

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def value_type(self, key: str) -> tuple[ValueType, ValueType | None]:
        """(type, element type) of a key, e.g. (ARRAY, STRING) or (UINT32, None); pass them to
        GGUFWriter.add (element type for arrays) to copy the key unchanged."""
        name = self.metadata_types.get(key)
        if name is None:
            raise BonsaiError(f"{self.path}: metadata key {key!r} is missing")
        return _parse_type_name(name)

    # Tensors.
    @property
    def tensors(self) -> list:
        """Directory entries (``_core.GgufTensorInfo``: name, type_name, engine_type, file_id,
        supported, shape (numpy order), ne, n_elements, nbytes, offset), in file order."""
        if self._tensors is None:
            self._tensors = self._f.tensors
        return self._tensors

    def tensor(self, name: str):
        if self._by_name is None:
            self._by_name = {t.name: t for t in self.tensors}
        t = self._by_name.get(name)
        if t is None:
            raise BonsaiError(f"{self.path}: tensor {name!r} is missing")
        return t

    def type_info(self, name: str) -> TypeInfo | None:
        """TypeInfo of a tensor's engine type, None for types the engine cannot run."""
        t = self.tensor(name)
        return None if t.engine_type is None else type_info(t.engine_type)

    def tensor_bytes(self, name: str) -> np.ndarray:
        """Read-only uint8 view of the tensor's stored bytes."""
        return self._f.tensor_data(name)

    def tensor_array(self, name: str) -> np.ndarray:
        """float32 values in numpy-order shape for F32/F16/BF16 tensors (F32 is a zero-copy
        read-only view); the raw uint8 bytes for every other type (see dequantize_tensor)."""
        t = self.tensor(name)
        raw = self._f.tensor_data(name)
        if t.type_name == "F32":
            return raw.view(np.float32).reshape(t.shape)
        if t.type_name == "F16":
            return raw.view(np.float16).astype(np.float32).reshape(t.shape)
        if t.type_name == "BF16":
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
        return raw

    def dequantize_tensor(self, name: str) -> np.ndarray:
        """float32 values of any engine type, through bonsai_runner.quants.dequantize."""
        t = self.tensor(name)
        if t.type_name in ("F32", "F16", "BF16"):
            return self.tensor_array(name)
        if t.engine_type is None:
            raise BonsaiError(f"{self.path}: tensor {name!r} has type {t.type_name}, which "
                              "bonsai-runner cannot dequantize")
        from .quants import dequantize

        return dequantize(self._f.tensor_data(name), type_info(t.engine_type), t.shape)

    def check_engine_types(self) -> None:
        """Raises BonsaiError naming the first tensor of a type the engine cannot run."""
        self._f.check_engine_types()

    # Lifetime.
    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def __enter__(self) -> "GgufReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GgufReader({self.path!r})"


def open_gguf(path: str | os.PathLike, use_mmap: bool = True) -> GgufReader:
    """Opens and validates a GGUF v3 file; raises BonsaiError naming the problem."""
    return GgufReader(path, use_mmap)
