"""Quantization tiers of a PTQ1_0 directory, their int32 packing, and exact GGUF block assembly.

A quantized linear weight [out, in] is stored as integer codes q and float16 scales d, one per
`group` consecutive weights along the input dimension: w[r, c] = d[r, c // group] * q[r, c].

    tier     num_bits  group  code range   GGUF type   bpw in GGUF
    ptq1_0   2         128    -1..1        PTQ1_0      1.75
    q2_0     2          64    -1..1        Q2_0        2.25
    q2_0_4l  2          64    -2..1        Q2_0        2.25
    q4_0     4          32    -8..7        Q4_0        4.5
    q8_0     8          32    -128..127    Q8_0        8.5

Packing follows compressed-tensors' "pack-quantized" format: codes are offset by 2^(num_bits-1)
to unsigned, and 32 / num_bits of them fill one int32 word, the first code in the lowest bits
(code k of a word at bits [k*num_bits, (k+1)*num_bits)); rows are packed independently. (For the
ternary tiers, offset codes are 1..3; 0, the value -2, is not a ternary value and is refused.)

GGUF blocks are assembled from codes and scales directly, so every tier maps to its GGUF type
with the very same scale and codes: Q8_0 = {f16 d, int8 q[32]}, Q4_0 = {f16 d, nibbles q+8 with
element j low and j+16 high}, Q2_0_4L = {f16 d = -s, 2-bit codes 1 - q} (Q2_0 decodes code k as
(k - 1) d, so the four codes hold -1, 0, 1, 2 times d: q s exactly). The ternary tiers go through
the reference packer (tensor_codec.encode_exact via ternary.pack_ternary), whose max-abs scale
reproduces d x {-1,0,1} exactly and whose result is verified.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BonsaiError
from .ternary import pack_ternary


@dataclass(frozen=True)
class Tier:
    name: str
    num_bits: int
    group: int
    qmin: int
    qmax: int
    gguf_type: str

    @property
    def ternary(self) -> bool:
        return self.qmin == -1 and self.qmax == 1


TIERS: dict[str, Tier] = {t.name: t for t in (
    Tier("ptq1_0", 2, 128, -1, 1, "ptq1_0"),
    Tier("q2_0", 2, 64, -1, 1, "q2_0"),
    Tier("q2_0_4l", 2, 64, -2, 1, "q2_0"),    # four-level: written as code 1 - c, d = -s
    Tier("q4_0", 4, 32, -8, 7, "q4_0"),
    Tier("q8_0", 8, 32, -128, 127, "q8_0"),
)}


def tier(name: str) -> Tier:
    t = TIERS.get(name)
    if t is None:
        raise BonsaiError(f"unknown quantization tier {name!r}; known: {', '.join(TIERS)}")
    return t


def pack_codes(q: np.ndarray, num_bits: int) -> np.ndarray:
    """int8 codes [rows, n] -> int32 words [rows, n * num_bits / 32] (offset, low bits first)."""
    per = 32 // num_bits
    rows, n = q.shape
    if n % per:
        raise BonsaiError(f"a row of {n} codes does not fill whole int32 words of {per}")
    u = (q.astype(np.int32) + (1 << (num_bits - 1))).astype(np.uint32).reshape(rows, n // per, per)
    shifts = (np.arange(per, dtype=np.uint32) * num_bits)
    words = np.bitwise_or.reduce(u << shifts, axis=2)
    return words.view(np.int32)


def unpack_codes(words: np.ndarray, num_bits: int, n: int) -> np.ndarray:
    """The inverse of pack_codes: int32 words [rows, n * num_bits / 32] -> int8 codes [rows, n]."""
    per = 32 // num_bits
    u = np.ascontiguousarray(words).view(np.uint32)
    shifts = (np.arange(per, dtype=np.uint32) * num_bits)
    vals = (u[..., None] >> shifts) & np.uint32((1 << num_bits) - 1)
    q = vals.reshape(u.shape[0], -1)[:, :n].astype(np.int16) - (1 << (num_bits - 1))
    return q.astype(np.int8)


@dataclass
class PackedTensor:
    """A quantized weight: tier, integer codes [out, in] and float16 scales [out, in / group]."""

    tier: Tier
    codes: np.ndarray
    scales: np.ndarray

    def check(self, name: str) -> None:
        t = self.tier
        rows, n = self.codes.shape
        if n % t.group or self.scales.shape != (rows, n // t.group):
            raise BonsaiError(f"{name}: scales {list(self.scales.shape)} do not match codes "
                              f"{list(self.codes.shape)} at group {t.group}")
        lo, hi = int(self.codes.min(initial=0)), int(self.codes.max(initial=0))
        if lo < t.qmin or hi > t.qmax:
            raise BonsaiError(f"{name}: {t.name} codes must lie in [{t.qmin}, {t.qmax}], found "
                              f"[{lo}, {hi}]")
        s = self.scales.astype(np.float32)
        if not np.isfinite(s).all():
            raise BonsaiError(f"{name}: scales hold NaN/Inf values")

    def dequantize(self) -> np.ndarray:
        rows, n = self.codes.shape
        s = self.scales.astype(np.float32).reshape(rows, -1, 1)
        return (self.codes.astype(np.float32).reshape(rows, -1, self.tier.group) * s).reshape(rows, n)

    def permute_rows(self, order_fn) -> "PackedTensor":
        return PackedTensor(self.tier, order_fn(self.codes), order_fn(self.scales))

    def permute_column_groups(self, order_fn, name: str) -> "PackedTensor":
        """order_fn permutes columns; the scales follow their groups. Exact only when it moves
        whole groups, which is checked on the column indices it produces."""
        g, n = self.tier.group, self.codes.shape[1]
        cols = np.asarray(order_fn(np.arange(n, dtype=np.int64)[None, :]))[0]
        starts = cols[::g]
        if (starts % g).any() or not np.array_equal(
                cols, (starts[:, None] + np.arange(g)).reshape(-1)):
            raise BonsaiError(f"{name}: its column reorder splits the {self.tier.name} groups "
                              f"of {g}; it cannot be applied to the packed tensor exactly")
        return PackedTensor(self.tier, order_fn(self.codes),
                            np.ascontiguousarray(self.scales[:, starts // g]))

    def to_gguf(self, name: str) -> np.ndarray:
        """The raw GGUF data of this tensor in its tier's GGUF type (exact)."""
        t = self.tier
        if t.name == "q8_0":
            return _blocks_q8_0(self.codes, self.scales)
        if t.name == "q4_0":
            return _blocks_q4_0(self.codes, self.scales)
        if t.name == "q2_0_4l":
            return _blocks_q2_0(self.codes, self.scales)
        return pack_ternary(self.dequantize(), t.gguf_type, name)


def _blocks_q8_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    rows, n = q.shape
    blk = np.empty((rows, n // 32), dtype=[("d", "<u2"), ("qs", "i1", (32,))])
    blk["d"] = d.astype(np.float16).view(np.uint16)
    blk["qs"] = q.reshape(rows, n // 32, 32)
    return blk.view(np.uint8).reshape(rows, -1)


def _blocks_q2_0(q: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Q2_0 blocks of codes c in [-2, 1] with scales s: value c s = (code - 1) d for code = 1 - c
    and d = -s (Q2_0 decodes its codes 0..3 as -1, 0, 1, 2 times d)."""
    rows, n = q.shape
    u = (1 - q.astype(np.int16)).astype(np.uint8).reshape(rows, n // 64, 16, 4)
    blk = np.empty((rows, n // 64), dtype=[("d", "<u2"), ("qs", "u1", (16,))])
    blk["d"] = (-s.astype(np.float32)).astype(np.float16).view(np.uint16)
    blk["qs"] = u[..., 0] | (u[..., 1] << 2) | (u[..., 2] << 4) | (u[..., 3] << 6)
    return blk.view(np.uint8).reshape(rows, -1)


def _blocks_q4_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    rows, n = q.shape
    u = (q.astype(np.int16) + 8).astype(np.uint8).reshape(rows, n // 32, 32)
    blk = np.empty((rows, n // 32), dtype=[("d", "<u2"), ("qs", "u1", (16,))])
    blk["d"] = d.astype(np.float16).view(np.uint16)
    blk["qs"] = u[..., :16] | (u[..., 16:] << 4)
    return blk.view(np.uint8).reshape(rows, -1)
