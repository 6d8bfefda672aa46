"""Tensor element types: ggml ids, block geometry and names (mirror of cpp/include/bonsai/types.h).

Engine ids equal the ggml ids written to files, except the legacy PrismML Q2_0 with group 128,
which shares file id 42 with mainline's g64 Q2_0: inside the engine it is Q2_0_G128 (0x1000 + 42)
and readers tell the two apart by the tensor's byte size.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TypeInfo:
    name: str         # llama.cpp spelling: "F16", "Q8_0", "PTQ1_0", ...
    engine_id: int    # id used by bonsai_runner._core
    file_id: int      # ggml id stored in GGUF files
    block_size: int   # elements per block
    type_size: int    # bytes per block
    ternary: bool     # values are scale x {-1, 0, +1}

    def row_bytes(self, n: int) -> int:
        if n % self.block_size:
            raise ValueError(f"{self.name} needs rows that are a multiple of {self.block_size} "
                             f"elements, got {n}")
        return n // self.block_size * self.type_size

    @property
    def bpw(self) -> float:
        return 8.0 * self.type_size / self.block_size


Q2_0_G128_ENGINE_ID = 0x1000 + 42

TYPES: dict[str, TypeInfo] = {t.name.lower(): t for t in [
    TypeInfo("F32", 0, 0, 1, 4, False),
    TypeInfo("F16", 1, 1, 1, 2, False),
    TypeInfo("Q4_0", 2, 2, 32, 18, False),
    TypeInfo("Q8_0", 8, 8, 32, 34, False),
    TypeInfo("BF16", 30, 30, 1, 2, False),
    TypeInfo("TQ1_0", 34, 34, 256, 54, True),
    TypeInfo("TQ2_0", 35, 35, 256, 66, True),
    TypeInfo("Q2_0", 42, 42, 64, 18, True),
    TypeInfo("PQ2_0", 142, 142, 128, 34, True),
    TypeInfo("PTQ1_0", 143, 143, 128, 28, True),
    TypeInfo("Q2_0_G128", Q2_0_G128_ENGINE_ID, 42, 128, 34, True),
]}

_BY_ENGINE_ID = {t.engine_id: t for t in TYPES.values()}


def type_info(t: str | int | TypeInfo) -> TypeInfo:
    """Looks a type up by name (any case), engine id, or passes a TypeInfo through."""
    if isinstance(t, TypeInfo):
        return t
    if isinstance(t, str):
        info = TYPES.get(t.lower())
        if info is None:
            raise ValueError(f"unknown tensor type {t!r}; known: {', '.join(TYPES)}")
        return info
    info = _BY_ENGINE_ID.get(int(t))
    if info is None:
        raise ValueError(f"unknown tensor type id {t}")
    return info


def resolve_file_type(file_id: int, n_elements: int, nbytes: int) -> TypeInfo | None:
    """The engine type of a tensor stored with ggml id `file_id`; id 42 is resolved by size.

    Returns None when the id is not one of ours or an id-42 tensor fits neither layout.
    """
    if file_id == 42:
        for info in (TYPES["q2_0"], TYPES["q2_0_g128"]):
            if n_elements % info.block_size == 0 and nbytes == info.row_bytes(n_elements):
                return info
        return None
    info = _BY_ENGINE_ID.get(file_id)
    return info if info is not None and info.engine_id != Q2_0_G128_ENGINE_ID else None
