"""Reference quantizers and dequantizers in numpy, byte-identical with cpp/src/quants.cpp.

Block layouts and element order are those of cpp/include/bonsai/quant_blocks.h (mainline llama.cpp
for Q8_0, Q4_0, TQ1_0, TQ2_0, Q2_0; PrismML for PQ2_0, PTQ1_0 and the g128 Q2_0). Per block:

    Q8_0    d = amax / 127            q = roundf(x * id)                id = d ? 1/d : 0
    Q4_0    d = max / -8              q = min(15, trunc(x * id + 8.5))  max: signed, largest |x|,
                                                                         first one wins
    ternary and Q2 types
            d = amax                  code = lroundf(x * id) + 1        (0..2, Q2 types 0..3)

Every step is float32 in that order (numpy float32 arrays and np.float32 scalars round exactly like
the C++ float code), rounding is half away from zero, d is stored as fp16 (round to nearest even)
and codes come from the float32 d. A float32 scale so small that 1/d overflows (llama.cpp leaves
that undefined) gives NaN products, counted as 0, and infinite ones, clamped to the code range.

Bad input raises BonsaiError: non-finite values, rows that are not a multiple of the block size,
scales that overflow fp16. Large tensors are processed in chunks of blocks, so memory stays small.
"""

from __future__ import annotations

import numpy as np

from .errors import BonsaiError
from .ggml_types import TypeInfo, type_info

_CHUNK_ELEMENTS = 1 << 18
_POW3_5 = np.array([81, 27, 9, 3, 1], dtype=np.uint16)   # first trit most significant
_POW3_4 = np.array([27, 9, 3, 1], dtype=np.uint16)
_TRIT_SHIFT = np.array([1, 3, 9, 27, 81], dtype=np.uint8)  # multiply to bring trit n to the top

# Trit-byte sections (start element, bytes, trits per byte) of the base-3 types.
_TRIT_SECTIONS = {
    "TQ1_0": ((0, 32, 5), (160, 16, 5), (240, 4, 4)),
    "PTQ1_0": ((0, 16, 5), (80, 8, 5), (120, 2, 4)),
}
# Byte offset of the fp16 scale inside a block.
_SCALE_OFFSET = {"Q8_0": 0, "Q4_0": 0, "Q2_0": 0, "Q2_0_G128": 0, "PQ2_0": 0,
                 "TQ1_0": 52, "TQ2_0": 64, "PTQ1_0": 26}


def _resolve(qtype: str | int | TypeInfo) -> TypeInfo:
    try:
        return type_info(qtype)
    except ValueError as e:
        raise BonsaiError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# fp16 / bf16


def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """fp16 bits (uint16) of float32 values: round to nearest even, NaN -> sign | 0x7E00."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        bits = np.where(nan, (bits & np.uint16(0x8000)) | np.uint16(0x7E00), bits)
    return bits


def fp16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16): round to nearest even on the top half, NaN -> (bits >> 16) | 64."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    # No overflow for non-NaN inputs (at most 0xFF7FFFFF + 0x8000); NaNs are replaced below.
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        r = np.where(nan, (u >> np.uint32(16)) | np.uint32(64), r)
    return r.astype(np.uint16)


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------------------------------------
# quantize


def _index(flat: int, shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return str(flat)
    return str(tuple(int(i) for i in np.unravel_index(flat, shape)))


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """roundf in float32, exactly: the fraction v - trunc(v) is exact, so no double rounding."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= np.float32(0.5), np.sign(v), np.float32(0))


def _safe_inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)


def _scaled(x: np.ndarray, ident: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return x * ident[:, None]


def _check_scale(info: TypeInfo, d: np.ndarray, amax: np.ndarray, first_block: int) -> np.ndarray:
    bits = fp32_to_fp16_bits(d)
    over = (bits & np.uint16(0x7FFF)) == np.uint16(0x7C00)
    if over.any():
        k = int(np.argmax(over))
        b = first_block + k
        bs = info.block_size
        raise BonsaiError(
            f"values too large for {info.name}: block {b} (elements {b * bs}..{(b + 1) * bs - 1} "
            f"of the flattened tensor) has max |x| = {float(amax[k]):g}, giving scale "
            f"{float(d[k]):g}, which overflows the fp16 scale (max 65504); store this tensor as "
            f"F32 or BF16 instead")
    return bits


def _ternary_codes(x: np.ndarray, q2: bool) -> tuple[np.ndarray, np.ndarray]:
    """Scale d = amax and codes (uint8) of a (blocks, block_size) array."""
    amax = np.abs(x).max(axis=1)
    v = _scaled(x, _safe_inverse(amax))
    # lroundf(v) + 1 clamped to 0..2 (0..3): NaN compares false and counts as 0.
    codes = (np.uint8(1) + (v >= np.float32(0.5)).view(np.uint8)
             - (v <= np.float32(-0.5)).view(np.uint8))
    if q2:
        codes += (v >= np.float32(1.5)).view(np.uint8)
    return amax, codes


def _pack_trits(codes: np.ndarray, sections) -> np.ndarray:
    nb = codes.shape[0]
    parts = []
    for start, nbytes, ntrits in sections:
        c = codes[:, start:start + nbytes * ntrits].reshape(nb, ntrits, nbytes).astype(np.uint16)
        q = (c * (_POW3_5 if ntrits == 5 else _POW3_4)[None, :, None]).sum(axis=1, dtype=np.uint16)
        if ntrits == 4:
            q *= np.uint16(3)
        parts.append(((q * np.uint16(256) + np.uint16(242)) // np.uint16(243)).astype(np.uint8))
    return np.concatenate(parts, axis=1)


def _quantize_blocks(info: TypeInfo, x: np.ndarray, first_block: int) -> np.ndarray:
    """Quantizes a (blocks, block_size) float32 array to (blocks, type_size) uint8."""
    nb, name = x.shape[0], info.name
    out = np.empty((nb, info.type_size), dtype=np.uint8)
    if name == "Q8_0":
        amax = np.abs(x).max(axis=1)
        d = amax / np.float32(127)
        v = np.nan_to_num(_scaled(x, _safe_inverse(d)), nan=0.0, posinf=127.0, neginf=-127.0)
        q = _round_half_away(np.clip(v, np.float32(-127), np.float32(127)))
        out[:, 2:] = q.astype(np.int8).view(np.uint8)
    elif name == "Q4_0":
        amax = np.abs(x).max(axis=1)
        mx = np.take_along_axis(x, np.argmax(np.abs(x), axis=1)[:, None], axis=1)[:, 0]
        mx = np.where(amax == 0, np.float32(0), mx)  # llama.cpp keeps its +0 start value
        d = mx / np.float32(-8)
        v = np.nan_to_num(_scaled(x, _safe_inverse(d)), nan=0.0, posinf=8.0, neginf=-8.0)
        s = np.clip(v, np.float32(-8), np.float32(8)) + np.float32(8.5)
        q = np.minimum(np.trunc(s), np.float32(15)).astype(np.uint8).reshape(nb, 2, 16)
        out[:, 2:] = q[:, 0, :] | (q[:, 1, :] << np.uint8(4))
    else:
        amax, codes = _ternary_codes(x, q2=name in ("Q2_0", "Q2_0_G128", "PQ2_0"))
        d = amax
        if name in _TRIT_SECTIONS:
            packed = _pack_trits(codes, _TRIT_SECTIONS[name])
            out[:, :packed.shape[1]] = packed
        elif name == "TQ2_0":
            c = codes.reshape(nb, 2, 4, 32)
            out[:, :64] = (c[:, :, 0] | (c[:, :, 1] << np.uint8(2)) | (c[:, :, 2] << np.uint8(4))
                           | (c[:, :, 3] << np.uint8(6))).reshape(nb, 64)
        else:
            c = codes.reshape(nb, -1, 4)
            out[:, 2:] = (c[:, :, 0] | (c[:, :, 1] << np.uint8(2)) | (c[:, :, 2] << np.uint8(4))
                          | (c[:, :, 3] << np.uint8(6)))
    bits = _check_scale(info, d, amax, first_block)
    off = _SCALE_OFFSET[name]
    out[:, off:off + 2] = bits.astype("<u2").view(np.uint8).reshape(nb, 2)
    return out


def _quantize_plain(info: TypeInfo, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if info.name == "F32":
        return x.astype("<f4").view(np.uint8)
    bits = fp32_to_fp16_bits(x) if info.name == "F16" else fp32_to_bf16_bits(x)
    inf = np.uint16(0x7C00 if info.name == "F16" else 0x7F80)
    over = (bits & np.uint16(0x7FFF)) == inf
    if over.any():
        i = int(np.argmax(over))
        limit = "max 65504" if info.name == "F16" else "it rounds to infinity"
        other = "F32 or BF16" if info.name == "F16" else "F32"
        raise BonsaiError(f"value {float(x.reshape(-1)[i]):g} at element {_index(i, shape)} is too "
                          f"large for {info.name} ({limit}); store this tensor as {other} instead")
    return bits.astype("<u2").view(np.uint8)


def quantize(x: np.ndarray, qtype: str | int | TypeInfo) -> np.ndarray:
    """Quantizes float values (rows = last axis) to `qtype`; returns uint8 (..., row_bytes)."""
    info = _resolve(qtype)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise BonsaiError("quantize needs at least one dimension (rows are the last)")
    x = np.ascontiguousarray(x)
    shape = x.shape
    n = shape[-1]
    if n % info.block_size:
        raise BonsaiError(f"cannot quantize rows of {n} elements as {info.name}: the row length "
                          f"must be a multiple of the {info.name} block size {info.block_size} "
                          f"(pad the row or pick a type with a smaller block)")
    out_shape = shape[:-1] + (n // info.block_size * info.type_size,)
    flat = x.reshape(-1)
    bad = ~np.isfinite(flat)
    if bad.any():
        i = int(np.argmax(bad))
        what = "NaN" if np.isnan(flat[i]) else ("+Inf" if flat[i] > 0 else "-Inf")
        raise BonsaiError(f"cannot quantize to {info.name}: element {_index(i, shape)} is {what} "
                          f"(first non-finite value); the tensor must hold finite values only")
    if info.block_size == 1:
        return _quantize_plain(info, flat, shape).reshape(out_shape)
    blocks = flat.reshape(-1, info.block_size)
    out = np.empty((blocks.shape[0], info.type_size), dtype=np.uint8)
    step = max(1, _CHUNK_ELEMENTS // info.block_size)
    for b in range(0, blocks.shape[0], step):
        out[b:b + step] = _quantize_blocks(info, blocks[b:b + step], b)
    return out.reshape(out_shape)


# ---------------------------------------------------------------------------------------------
# dequantize


def _unpack_trits(qs: np.ndarray, ntrits: int) -> np.ndarray:
    """(blocks, bytes) trit bytes -> (blocks, ntrits * bytes) trits 0..2, element k*bytes + m."""
    q = qs[:, None, :] * _TRIT_SHIFT[None, :ntrits, None]  # uint8: wraps modulo 256 on purpose
    return ((q.astype(np.uint16) * np.uint16(3)) >> np.uint16(8)).reshape(qs.shape[0], -1)


def _dequantize_blocks(info: TypeInfo, blk: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # a NaN / Inf scale in the bytes gives NaN / Inf values
        return _dequantize_scaled(info, blk)


def _dequantize_scaled(info: TypeInfo, blk: np.ndarray) -> np.ndarray:
    nb, name = blk.shape[0], info.name
    off = _SCALE_OFFSET[name]
    d = fp16_bits_to_fp32(np.ascontiguousarray(blk[:, off:off + 2]).view("<u2")[:, 0])[:, None]
    if name == "Q8_0":
        return blk[:, 2:].view(np.int8).astype(np.float32) * d
    if name == "Q4_0":
        qs = blk[:, 2:]
        q = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1)
        return (q.astype(np.int8) - np.int8(8)).astype(np.float32) * d
    if name in _TRIT_SECTIONS:
        parts, pos = [], 0
        for _, nbytes, ntrits in _TRIT_SECTIONS[name]:
            parts.append(_unpack_trits(blk[:, pos:pos + nbytes], ntrits))
            pos += nbytes
        codes = np.concatenate(parts, axis=1)
    elif name == "TQ2_0":
        qs = blk[:, :64].reshape(nb, 2, 1, 32)
        codes = ((qs >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None])
                 & np.uint8(3)).reshape(nb, 256)
    else:
        qs = blk[:, 2:]
        codes = ((qs[:, :, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :])
                 & np.uint8(3)).reshape(nb, -1)
    return (codes.astype(np.int8) - np.int8(1)).astype(np.float32) * d


def dequantize(data: np.ndarray | bytes, qtype: str | int | TypeInfo,
               shape: tuple[int, ...] | int) -> np.ndarray:
    """Dequantizes the bytes of a `qtype` tensor with `shape` (elements) to float32."""
    info = _resolve(qtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = np.frombuffer(data, dtype=np.uint8)
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise BonsaiError(f"dequantize needs uint8 data, got {data.dtype}; pass the raw bytes "
                          f"(e.g. arr.view(np.uint8))")
    if not shape or any(s < 0 for s in shape):
        raise BonsaiError(f"dequantize needs a shape of one or more non-negative dimensions, "
                          f"got {shape}")
    n = shape[-1]
    if n % info.block_size:
        raise BonsaiError(f"cannot dequantize rows of {n} elements as {info.name}: the row "
                          f"length must be a multiple of the block size {info.block_size}")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    want = rows * (n // info.block_size) * info.type_size
    if data.size != want:
        raise BonsaiError(f"{data.size} bytes given, but a {info.name} tensor of shape {shape} "
                          f"takes {want}")
    flat = np.ascontiguousarray(data).reshape(-1)
    if info.name == "F32":
        return flat.view("<f4").astype(np.float32).reshape(shape)
    if info.name == "F16":
        return fp16_bits_to_fp32(flat.view("<u2")).reshape(shape)
    if info.name == "BF16":
        return bf16_bits_to_fp32(flat.view("<u2")).reshape(shape)
    blocks = flat.reshape(-1, info.type_size)
    out = np.empty((blocks.shape[0], info.block_size), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // info.block_size)
    for b in range(0, blocks.shape[0], step):
        out[b:b + step] = _dequantize_blocks(info, blocks[b:b + step])
    return out.reshape(shape)


__all__ = ["quantize", "dequantize", "fp32_to_fp16_bits", "fp16_bits_to_fp32",
           "fp32_to_bf16_bits", "bf16_bits_to_fp32"]
