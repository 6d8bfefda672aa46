"""Already-ternary weights: exact detection and lossless packing to the ternary GGUF types.

A weight matrix [out, in] is ternary with group G when every run of G consecutive values along the
input dimension is s x {-1, 0, +1} for one scale s per run that float16 represents exactly (so the
block's fp16 scale can hold it). Published "unpacked" ternary releases (e.g. BitNet-style FP16
checkpoints) look like this. Detection works on the finest group (64) and derives the coarser
ones from its scales: a 128-run is ternary iff its two 64-run scales agree or one run is all zero.

Which packings are lossless depends on the group the scales hold for:
    PTQ1_0, PQ2_0, Q2_0 g128   block 128   need G = 128 (or a multiple)
    Q2_0 (mainline)            block 64    need G = 64 (any ternary tensor whose in-dim allows it)
    TQ1_0, TQ2_0               block 256   need one scale per 256
`pack_ternary` checks the group first (a clear error otherwise) and then verifies the packed bytes
by decoding them and comparing bit for bit (tensor_codec.encode_exact): never an approximation.
"""

from __future__ import annotations

import numpy as np

from ..errors import BonsaiError
from ..ggml_types import type_info
from .tensor_codec import encode_exact, type_key

DETECT_GROUPS = (64, 128, 256)
TERNARY_TYPES = ("ptq1_0", "pq2_0", "q2_0", "q2_0_g128", "tq1_0", "tq2_0")


def _scales_g64(w: np.ndarray) -> np.ndarray | None:
    """Per-64-run scales [rows, in/64] if `w` is exactly ternary at group 64, else None."""
    if w.ndim != 2 or w.shape[1] % 64 or w.size == 0:
        return None
    a = np.abs(w.reshape(w.shape[0], -1, 64))
    s = a.max(axis=2)
    if not np.isfinite(s).all():
        return None
    if not ((a == 0) | (a == s[..., None])).all():
        return None
    if not (s.astype(np.float16).astype(np.float32) == s).all():
        return None
    return s


def _coarsen(s: np.ndarray, factor: int) -> np.ndarray | None:
    """Scales for runs `factor` times longer, if every non-zero sub-run shares one scale."""
    if s.shape[1] % factor:
        return None
    r = s.reshape(s.shape[0], -1, factor)
    top = r.max(axis=2)
    if not ((r == 0) | (r == top[..., None])).all():
        return None
    return top


def ternary_groups(w: np.ndarray) -> tuple[int, ...]:
    """The groups among (64, 128, 256) for which `w` is exactly ternary; () if none."""
    s64 = _scales_g64(np.asarray(w, dtype=np.float32))
    if s64 is None:
        return ()
    groups = [64]
    s128 = _coarsen(s64, 2)
    if s128 is not None:
        groups.append(128)
        if _coarsen(s128, 2) is not None:
            groups.append(256)
    return tuple(groups)


def looks_ternary(sample: np.ndarray) -> bool:
    """Cheap pre-check on a few rows: False proves the tensor is not ternary."""
    return bool(ternary_groups(sample))


def best_ternary_type(groups: tuple[int, ...]) -> str | None:
    """The default lossless packing for a tensor ternary at `groups`: PTQ1_0, else Q2_0 (g64)."""
    if 128 in groups:
        return "ptq1_0"
    if 64 in groups:
        return "q2_0"
    return None


def group_needed(t: str) -> int:
    return type_info(t).block_size


def pack_ternary(w: np.ndarray, t: str, name: str, groups: tuple[int, ...] | None = None
                 ) -> np.ndarray:
    """Packs an exactly-ternary float32 matrix to ternary type `t`, verified bit for bit."""
    k = type_key(t)
    if k not in TERNARY_TYPES:
        raise BonsaiError(f"{name}: {t} is not a ternary type ({', '.join(TERNARY_TYPES)})")
    if groups is None:
        groups = ternary_groups(w)
    need = group_needed(k)
    if need not in groups:
        have = f"ternary with group {max(groups)}" if groups else "not ternary"
        raise BonsaiError(f"{name}: {k.upper()} needs one scale per {need} weights but the tensor "
                          f"is {have}; choose a type whose block fits (ptq1_0/pq2_0: 128, q2_0: 64, "
                          "tq1_0/tq2_0: 256) or pass --allow-lossy")
    return encode_exact(w, k, name)
