"""Reference quantizers: numpy (bonsai_runner.quants) vs C++ (_core) vs gguf-py vs CUDA.

- Byte-identical quantization and bit-identical dequantization between numpy and C++ for every
  type on >= 10,000 blocks of mixed data (gaussian, uniform, exact ternary with fp16-exact scales,
  heavy tails, values on rounding boundaries, sparse and all-zero blocks, tiny scales, -0.0).
- Element order pinned by one-hot blocks, with expected bytes derived from the layout rules of
  quant_blocks.h (not from the implementations).
- Lossless round trips of exactly representable data; edge cases and errors.
- Agreement with gguf.quants for the mainline types it implements (F16, BF16, Q8_0, Q4_0, TQ1_0,
  TQ2_0 quantize and dequantize).
- `cuda`: _core.cuda_dequantize against the CPU for every type.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from bonsai_runner import _core, quants
from bonsai_runner.errors import BonsaiError
from bonsai_runner.ggml_types import TYPES, TypeInfo

ALL = list(TYPES.values())
BLOCKED = [t for t in ALL if t.block_size > 1]
TERNARY = [t for t in ALL if t.ternary]
TRIT_TYPES = ("TQ1_0", "PTQ1_0")
Q2_TYPES = ("Q2_0", "Q2_0_G128", "PQ2_0")
N_BLOCKS = 10_240


def ids(types):
    return [t.name for t in types]


def fp16_exact(rng: np.random.Generator, n: int, lo: int = 0x0400, hi: int = 0x7BFF) -> np.ndarray:
    """Random positive fp16 values (normal by default) as float32."""
    return rng.integers(lo, hi + 1, size=n).astype(np.uint16).view(np.float16).astype(np.float32)


def mixed_blocks(rng: np.random.Generator, nblocks: int, bs: int, tiny: bool = True) -> np.ndarray:
    """(nblocks, bs) float32 blocks, each drawn from one of several distributions."""
    kinds = rng.integers(0, 8 if tiny else 6, size=nblocks)
    x = np.zeros((nblocks, bs), dtype=np.float32)
    scale = (10.0 ** rng.uniform(-4, 2, size=(nblocks, 1))).astype(np.float32)
    gauss = rng.standard_normal((nblocks, bs)).astype(np.float32) * scale
    x[kinds == 0] = gauss[kinds == 0]
    uni = rng.uniform(-1, 1, (nblocks, bs)).astype(np.float32) * scale
    x[kinds == 1] = uni[kinds == 1]
    # Exact ternary data with fp16-exact scales.
    tern = rng.integers(-1, 2, (nblocks, bs)).astype(np.float32) * fp16_exact(rng, nblocks)[:, None]
    x[kinds == 2] = tern[kinds == 2]
    heavy = np.clip(rng.standard_t(2, (nblocks, bs)) * scale, -6e4, 6e4).astype(np.float32)
    x[kinds == 3] = heavy[kinds == 3]
    # Rounding boundaries: (k +- 0.5) * A / L for the levels of each type, some nudged by one ulp.
    levels = rng.choice(np.array([1, 2, 8, 127], dtype=np.float32), size=(nblocks, 1))
    amp = (10.0 ** rng.uniform(-2, 2, size=(nblocks, 1))).astype(np.float32)
    k = rng.integers(-127, 128, (nblocks, bs)).astype(np.float32) % (2 * levels) - levels
    half = rng.choice(np.array([-0.5, 0.5], dtype=np.float32), size=(nblocks, bs))
    edge = np.clip((k + half) * (amp / levels), -amp, amp).astype(np.float32)
    nudge = rng.integers(-1, 2, (nblocks, bs))
    edge = np.where(nudge == 1, np.nextafter(edge, np.float32(np.inf)), edge)
    edge = np.where(nudge == -1, np.nextafter(edge, np.float32(-np.inf)), edge)
    edge[:, 0] = np.where(rng.random(nblocks) < 0.5, amp[:, 0], -amp[:, 0])
    x[kinds == 4] = edge[kinds == 4]
    # Sparse: a few non-zeros (often none: all-zero blocks).
    sparse = np.where(rng.random((nblocks, bs)) < 1.5 / bs, gauss, np.float32(0))
    x[kinds == 5] = sparse[kinds == 5]
    if tiny:  # fp16-subnormal, fp16-zero and float32-subnormal scales; -0.0 everywhere
        tiny_scale = (10.0 ** rng.uniform(-44, -4, size=(nblocks, 1))).astype(np.float32)
        x[kinds == 6] = (rng.standard_normal((nblocks, bs)) * tiny_scale)[kinds == 6]
        negz = np.where(rng.random((nblocks, bs)) < 0.5, np.float32(-0.0), np.float32(0.0))
        negz[:, -1] = np.where(rng.random(nblocks) < 0.5, negz[:, -1], tiny_scale[:, 0])
        x[kinds == 7] = negz[kinds == 7]
    return x


def data_for(info: TypeInfo, rng: np.random.Generator, nblocks: int = N_BLOCKS, tiny: bool = True):
    bs = max(info.block_size, 32)
    return mixed_blocks(rng, nblocks, bs, tiny).reshape(-1, 4 * bs)


def cpp_quantize(x, info):
    return _core.quantize(info.engine_id, np.ascontiguousarray(x, dtype=np.float32))


def cpp_dequantize(data, info, shape):
    return _core.dequantize(info.engine_id, data, tuple(shape))


def assert_bits_equal(a: np.ndarray, b: np.ndarray):
    """Bit-identical float32 arrays, except that any NaN matches any NaN (payloads may differ
    between numpy builds)."""
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    assert np.array_equal(nan_a, nan_b)
    diff = (a.view(np.uint32) != b.view(np.uint32)) & ~nan_a
    assert not diff.any(), f"{np.count_nonzero(diff)} values differ, first at {np.argmax(diff)}"


# ------------------------------------------------------------------------------------------------
# numpy vs C++


@pytest.mark.parametrize("info", ALL, ids=ids(ALL))
def test_numpy_and_cpp_identical(info):
    rng = np.random.default_rng(1000 + info.engine_id)
    x = data_for(info, rng)
    q_np = quants.quantize(x, info.name)
    q_cpp = cpp_quantize(x, info)
    assert q_np.dtype == np.uint8 and q_np.shape == (x.shape[0], info.row_bytes(x.shape[1]))
    assert np.array_equal(q_np, q_cpp), f"{np.count_nonzero(q_np != q_cpp)} bytes differ"
    y_np = quants.dequantize(q_np, info.name, x.shape)
    assert_bits_equal(y_np, cpp_dequantize(q_cpp, info, x.shape))
    # Sanity of the reference itself: the error is bounded by the type's step.
    if info.ternary:
        blocks = x.reshape(-1, info.block_size)
        amax = np.abs(blocks).max(axis=1, keepdims=True)
        err = np.abs(y_np.reshape(blocks.shape) - blocks)
        assert (err <= 0.5 * amax * 1.002 + 6e-8).all()


@pytest.mark.parametrize("info", ALL, ids=ids(ALL))
def test_dequantize_random_bytes(info):
    rng = np.random.default_rng(2000 + info.engine_id)
    n = 64 * max(info.block_size, 32)
    data = rng.integers(0, 256, size=(4, info.row_bytes(n)), dtype=np.uint8)
    assert_bits_equal(quants.dequantize(data, info, (4, n)), cpp_dequantize(data, info, (4, n)))


def test_type_lookup_forms():
    x = np.random.default_rng(3).standard_normal((2, 128)).astype(np.float32)
    ref = quants.quantize(x, "ptq1_0")
    assert np.array_equal(quants.quantize(x, "PTQ1_0"), ref)
    assert np.array_equal(quants.quantize(x, 143), ref)
    assert np.array_equal(quants.quantize(x, TYPES["ptq1_0"]), ref)
    assert np.array_equal(quants.quantize(x.astype(np.float64), "ptq1_0"), ref)
    assert np.array_equal(quants.dequantize(bytes(ref), "ptq1_0", (2, 128)),
                          quants.dequantize(ref, 143, (2, 128)))


# ------------------------------------------------------------------------------------------------
# element order (known answers from the layout rules)


def trit_byte(trits) -> int:
    """Byte of 5 trits, or of 4 trits (then multiplied by 3): ceil(q * 256 / 243)."""
    q = 0
    for t in trits:
        q = q * 3 + t
    if len(trits) == 4:
        q *= 3
    return -(-q * 256 // 243)


def expected_onehot_bytes(info: TypeInfo, k: int, sign: int) -> np.ndarray:
    """Bytes (scale excluded) of a block that is 0 except element k = sign * 1.0."""
    code = 1 + sign
    if info.name in TRIT_TYPES:
        # (first element, bytes, trits per byte) of each section
        sections = {"TQ1_0": [(0, 32, 5), (160, 16, 5), (240, 4, 4)],
                    "PTQ1_0": [(0, 16, 5), (80, 8, 5), (120, 2, 4)]}[info.name]
        out = []
        for start, nbytes, ntrits in sections:
            for m in range(nbytes):
                trits = [1] * ntrits
                for n in range(ntrits):
                    if start + nbytes * n + m == k:
                        trits[n] = code
                out.append(trit_byte(trits))
        return np.array(out, dtype=np.uint8)
    if info.name == "TQ2_0":
        out = np.full(64, 0x55, dtype=np.uint8)
        h, lane, m = k // 128, (k // 32) % 4, k % 32
        out[32 * h + m] = (0x55 & ~(3 << 2 * lane)) | (code << 2 * lane)
        return out
    out = np.full(info.block_size // 4, 0x55, dtype=np.uint8)  # Q2 family
    out[k // 4] = (0x55 & ~(3 << 2 * (k % 4))) | (code << 2 * (k % 4))
    return out


def code_bytes(info: TypeInfo, q: np.ndarray) -> np.ndarray:
    """The non-scale bytes of blocks (rows of q)."""
    off = quants._SCALE_OFFSET[info.name]
    return np.delete(q, [off, off + 1], axis=-1)


@pytest.mark.parametrize("info", TERNARY, ids=ids(TERNARY))
def test_element_order_onehot(info):
    bs = info.block_size
    for sign in (1, -1):
        x = np.zeros((bs, bs), dtype=np.float32)
        x[np.arange(bs), np.arange(bs)] = sign  # row k: element k set
        want = np.stack([expected_onehot_bytes(info, k, sign) for k in range(bs)])
        for q in (quants.quantize(x, info), cpp_quantize(x, info)):
            assert np.array_equal(code_bytes(info, q), want)
            off = quants._SCALE_OFFSET[info.name]
            assert (q[:, off] == 0x00).all() and (q[:, off + 1] == 0x3C).all()  # fp16 1.0
            assert np.array_equal(quants.dequantize(q, info, x.shape), x)


def test_known_bytes_ptq1_0():
    # Element 0 is trit 0 (most significant) of qs[0]; element 127 is trit 3 of qh[1].
    x = np.zeros(128, dtype=np.float32)
    x[0], x[127], x[16] = 2.0, -2.0, 1.0  # d = 2, codes +1, -1, and 0.5 rounds to +1
    q = quants.quantize(x, "ptq1_0")
    assert q[0] == trit_byte([2, 2, 1, 1, 1])  # elements 0 and 16 share qs[0]
    assert q[25] == trit_byte([1, 1, 1, 0])
    assert list(q[26:]) == [0x00, 0x40]
    assert np.array_equal(q, cpp_quantize(x, TYPES["ptq1_0"]))


def test_q4_0_and_q8_0_layout():
    x = np.arange(32, dtype=np.float32) - 16  # max |x| = 16 at element 0 (signed -16)
    q4 = quants.quantize(x, "q4_0")
    assert list(q4[:2]) == [0x00, 0x40]  # d = -16 / -8 = 2
    # nibble j: trunc(x * -0.5 + 8.5), low nibble element j, high nibble element j + 16
    lo = np.minimum(np.trunc(x[:16] * np.float32(0.5) + np.float32(8.5)), 15).astype(np.uint8)
    hi = np.minimum(np.trunc(x[16:] * np.float32(0.5) + np.float32(8.5)), 15).astype(np.uint8)
    assert np.array_equal(q4[2:], lo | (hi << 4))
    v = x.astype(np.float64) * 127 / 16  # d = 1 exactly; halves (+-63.5) go away from zero
    q8 = quants.quantize(x * np.float32(127 / 16), "q8_0")
    assert list(q8[:2]) == [0x00, 0x3C]
    away = np.sign(v) * np.floor(np.abs(v) + 0.5)
    assert np.array_equal(q8[2:].view(np.int8), away.astype(np.int8))


# ------------------------------------------------------------------------------------------------
# round trips and edge cases


@pytest.mark.parametrize("info", TERNARY, ids=ids(TERNARY))
def test_exact_ternary_round_trip(info):
    rng = np.random.default_rng(4000 + info.engine_id)
    nb, bs = 2000, info.block_size
    d = fp16_exact(rng, nb)[:, None]
    x = rng.integers(-1, 2, (nb, bs)).astype(np.float32) * d
    x[np.arange(nb), rng.integers(0, bs, nb)] = d[:, 0] * np.where(rng.random(nb) < 0.5, 1, -1)
    x[::7] = 0.0  # all-zero blocks too
    x = x.reshape(-1, 4 * bs)
    for q in (quants.quantize(x, info), cpp_quantize(x, info)):
        assert np.array_equal(quants.dequantize(q, info, x.shape), x)
        assert np.array_equal(cpp_dequantize(q, info, x.shape), x)


def test_exact_q8_0_q4_0_f16_round_trip():
    rng = np.random.default_rng(5)
    d = (2.0 ** rng.integers(-20, 10, (500, 1))).astype(np.float32)
    x8 = rng.integers(-127, 128, (500, 32)).astype(np.float32) * d
    x8[:, 3] = 127 * d[:, 0]
    x4 = rng.integers(-8, 8, (500, 32)).astype(np.float32) * d
    x4[:, 5] = -8 * d[:, 0]
    for name, x in (("q8_0", x8), ("q4_0", x4)):
        assert np.array_equal(quants.dequantize(quants.quantize(x, name), name, x.shape), x)
    sign = np.where(rng.random(4096) < 0.5, 1, -1).astype(np.float32)
    h = fp16_exact(rng, 4096, 0, 0x7BFF) * sign
    assert np.array_equal(quants.dequantize(quants.quantize(h, "f16"), "f16", h.shape), h)


@pytest.mark.parametrize("info", BLOCKED, ids=ids(BLOCKED))
def test_zero_and_single_value_blocks(info):
    bs = info.block_size
    x = np.zeros((3, bs), dtype=np.float32)
    x[1, bs // 3] = -127 / 32  # fp16-exact scale for every type
    x[2, 0] = -0.0
    for q in (quants.quantize(x, info), cpp_quantize(x, info)):
        y = quants.dequantize(q, info, x.shape)
        assert not y[0].any() and not y[2].any()
        assert y[1, bs // 3] == np.float32(-127 / 32) and np.count_nonzero(y[1]) == 1
        off = quants._SCALE_OFFSET[info.name]
        if info.ternary:  # zero blocks: d = 0 and every code "0"
            assert (q[0, off:off + 2] == 0).all()
            assert np.array_equal(code_bytes(info, q[:1])[0], expected_onehot_bytes(info, 0, 0))
    # llama.cpp starts Q4_0's signed max at +0, so an all-zero block stores d = -0.0 (0x8000).
    assert list(quants.quantize(x[2:], "q4_0")[0, :2]) == [0x00, 0x80]


def test_half_way_rounding():
    x = np.zeros((3, 128), dtype=np.float32)
    x[:, 0] = 1.0
    x[0, 1], x[1, 1], x[2, 1] = 0.5, -0.5, np.nextafter(np.float32(0.5), np.float32(0))
    for name in ("ptq1_0", "pq2_0", "q2_0_g128"):
        y = quants.dequantize(quants.quantize(x, name), name, x.shape)
        assert list(y[:, 1]) == [1.0, -1.0, 0.0]
    q2 = np.zeros(64, dtype=np.float32)
    q2[0], q2[1] = -1.0, 0.75
    assert quants.dequantize(quants.quantize(q2, "q2_0"), "q2_0", (64,))[1] == 1.0
    x8 = np.zeros(32, dtype=np.float32)
    x8[0], x8[1], x8[2] = 127.0, 2.5, -2.5  # d = 1: halves away from zero
    assert list(quants.quantize(x8, "q8_0")[3:5].view(np.int8)) == [3, -3]


@pytest.mark.parametrize("info", ALL, ids=ids(ALL))
def test_tiny_scales_identical(info):
    bs = max(info.block_size, 32)
    x = np.zeros((6, bs), dtype=np.float32)
    for i, a in enumerate([1e-5, 1e-8, 1e-20, 1e-39, 1e-44, 1.4e-45]):
        x[i, 1], x[i, 2] = a, -a / 3
    q = quants.quantize(x, info)
    assert np.array_equal(q, cpp_quantize(x, info))
    y = quants.dequantize(q, info, x.shape)
    assert np.isfinite(y).all() and (np.abs(y) <= 2e-5).all()
    assert_bits_equal(y, cpp_dequantize(q, info, x.shape))


@pytest.mark.parametrize("info", ALL, ids=ids(ALL))
def test_scale_overflow_raises(info):
    big = {"F32": None, "BF16": 3.4e38, "Q8_0": 1e7, "Q4_0": 1e6}.get(info.name, 7e4)
    x = np.ones((2, 4 * max(info.block_size, 32)), dtype=np.float32)
    if big is None:
        x[1, 3] = 3.4e38
        assert np.array_equal(quants.quantize(x, info), cpp_quantize(x, info))
        return
    x[1, 3] = big
    for f in (lambda: quants.quantize(x, info), lambda: cpp_quantize(x, info)):
        with pytest.raises(BonsaiError, match=rf"too large for {info.name}.*F32"):
            f()
    x[1, 3] = {"Q8_0": -8e6, "Q4_0": -5e5, "BF16": 3.3e38}.get(info.name, 6e4)  # fits
    assert np.array_equal(quants.quantize(x, info), cpp_quantize(x, info))


@pytest.mark.parametrize("info", ALL, ids=ids(ALL))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_raises(info, bad):
    x = np.ones((3, max(info.block_size, 32)), dtype=np.float32)
    x[2, 5] = bad
    word = re.escape("NaN" if np.isnan(bad) else ("+Inf" if bad > 0 else "-Inf"))
    flat = 2 * x.shape[1] + 5
    with pytest.raises(BonsaiError, match=rf"{info.name}: element \(2, 5\) is {word}"):
        quants.quantize(x, info)
    with pytest.raises(BonsaiError, match=rf"{info.name}: element {flat} is {word}"):
        cpp_quantize(x, info)


@pytest.mark.parametrize("info", BLOCKED, ids=ids(BLOCKED))
def test_bad_lengths_raise(info):
    bs = info.block_size
    x = np.ones((2, bs + bs // 2), dtype=np.float32)
    for f in (lambda: quants.quantize(x, info), lambda: cpp_quantize(x, info)):
        with pytest.raises(BonsaiError, match=rf"multiple of the {info.name} block size {bs}"):
            f()
    data = np.zeros(info.type_size * 2 + 1, dtype=np.uint8)
    for f in (lambda: quants.dequantize(data, info, (2 * bs,)),
              lambda: cpp_dequantize(data, info, (2 * bs,))):
        with pytest.raises(BonsaiError, match="bytes given"):
            f()
    for f in (lambda: quants.dequantize(data[:0], info, (bs // 2,)),
              lambda: cpp_dequantize(data[:0], info, (bs // 2,))):
        with pytest.raises(BonsaiError, match="multiple"):
            f()


def test_bad_arguments_raise():
    with pytest.raises(BonsaiError, match="unknown tensor type"):
        quants.quantize(np.zeros(32, np.float32), "q4_k")
    with pytest.raises(BonsaiError, match="unknown tensor type id 12"):
        _core.quantize(12, np.zeros(256, np.float32))
    with pytest.raises(BonsaiError, match="float32"):
        _core.quantize(143, np.zeros(128, np.float64))
    with pytest.raises(BonsaiError, match="uint8"):
        _core.dequantize(143, np.zeros(7, np.int32), (128,))
    with pytest.raises(BonsaiError, match="uint8"):
        quants.dequantize(np.zeros(7, np.int32), 143, (128,))
    with pytest.raises(BonsaiError, match="at least one dimension"):
        quants.quantize(np.float32(1.0), "f32")
    with pytest.raises(BonsaiError, match="at least one dimension"):
        _core.quantize(0, np.array(1.0, np.float32))


@pytest.mark.parametrize("info", [TYPES["ptq1_0"], TYPES["q8_0"], TYPES["f16"]],
                         ids=["PTQ1_0", "Q8_0", "F16"])
def test_shapes(info):
    x = np.random.default_rng(6).standard_normal((2, 3, 256)).astype(np.float32)
    for q in (quants.quantize(x, info), cpp_quantize(x, info)):
        assert q.shape == (2, 3, info.row_bytes(256))
        assert quants.dequantize(q, info, (2, 3, 256)).shape == (2, 3, 256)
        assert cpp_dequantize(q, info, (2, 3, 256)).shape == (2, 3, 256)
    empty = np.zeros((0, 256), dtype=np.float32)
    assert quants.quantize(empty, info).shape == (0, info.row_bytes(256))
    assert cpp_quantize(empty, info).shape == (0, info.row_bytes(256))
    xt = x[:, :, ::-1]  # non-contiguous input
    assert np.array_equal(quants.quantize(xt, info), cpp_quantize(xt, info))


# ------------------------------------------------------------------------------------------------
# fp16 / bf16


def test_fp16_bf16_conversions():
    rng = np.random.default_rng(7)
    u = rng.integers(0, 2**32, size=2_000_000, dtype=np.uint64).astype(np.uint32)
    u[:12] = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x477FF000,
              0x477FEFFF, 0x33000000, 0x33000001, 0x387FE000, 0x7F7FFFFF]
    x = u.view(np.float32)
    h = quants.fp32_to_fp16_bits(x)
    assert np.array_equal(h, _core.fp32_to_fp16(x))
    assert list(h[:12]) == [0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C00, 0x7BFF, 0, 1,
                            0x0400, 0x7C00]
    b = quants.fp32_to_bf16_bits(x)
    assert np.array_equal(b, _core.fp32_to_bf16(x))
    assert list(b[:6]) == [0, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0]
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    assert_bits_equal(quants.fp16_bits_to_fp32(every), _core.fp16_to_fp32(every))
    assert_bits_equal(quants.bf16_bits_to_fp32(every), _core.bf16_to_fp32(every))
    finite = every[(every & 0x7C00) != 0x7C00]
    assert np.array_equal(_core.fp32_to_fp16(_core.fp16_to_fp32(finite)), finite)


# ------------------------------------------------------------------------------------------------
# gguf-py (mainline) agreement

GGUF_TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "TQ1_0", "TQ2_0"]


@pytest.mark.parametrize("name", GGUF_TYPES)
def test_matches_gguf(name):
    gguf = pytest.importorskip("gguf")
    from gguf import quants as gq

    qtype = gguf.GGMLQuantizationType[name]
    info = TYPES[name.lower()]
    rng = np.random.default_rng(8000 + info.engine_id)
    # gguf-py leaves tiny (1/d overflowing) scales undefined, so no tiny blocks here.
    x = data_for(info, rng, nblocks=2048, tiny=False)
    ours = quants.quantize(x, name)
    theirs_q = np.asarray(gq.quantize(x, qtype)).view(np.uint8).reshape(ours.shape)
    assert np.array_equal(ours, theirs_q)
    theirs = np.asarray(gq.dequantize(ours, qtype), dtype=np.float32).reshape(x.shape)
    assert_bits_equal(quants.dequantize(ours, name, x.shape), theirs)


# ------------------------------------------------------------------------------------------------
# CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("info", ALL, ids=ids(ALL))
def test_cuda_dequantize_matches_cpu(info):
    rng = np.random.default_rng(9000 + info.engine_id)
    x = data_for(info, rng, nblocks=2048)
    q = cpp_quantize(x, info)
    assert_bits_equal(_core.cuda_dequantize(info.engine_id, q, x.shape),
                      cpp_dequantize(q, info, x.shape))
    n = 64 * max(info.block_size, 32)
    data = rng.integers(0, 256, size=(3, info.row_bytes(n)), dtype=np.uint8)
    assert_bits_equal(_core.cuda_dequantize(info.engine_id, data, (3, n)),
                      cpp_dequantize(data, info, (3, n)))


@pytest.mark.cuda
def test_cuda_dequantize_large_and_errors():
    info = TYPES["ptq1_0"]
    n = (1 << 28) + 5 * 128  # more elements than the capped grid has threads: grid-stride loop
    data = np.random.default_rng(10).integers(0, 256, size=info.row_bytes(n), dtype=np.uint8)
    data.reshape(-1, 28)[:, 27] &= 0x3B  # finite scales
    assert_bits_equal(_core.cuda_dequantize(info.engine_id, data, (n,)),
                      cpp_dequantize(data, info, (n,)))
    with pytest.raises(BonsaiError, match="bytes given"):
        _core.cuda_dequantize(info.engine_id, data[:-1], (n,))
    assert _core.cuda_dequantize(info.engine_id, data[:0], (0, 128)).shape == (0, 128)
