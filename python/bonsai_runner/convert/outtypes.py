"""Output types of the converters (`--outtype`) and the tensor type each tensor gets.

Rules (those of llama.cpp's converter, extended to the ternary types):
- 1-D tensors (norms, biases, rope factors) are always F32.
- f32 / f16 / bf16 / q8_0: every 2-D tensor, token embedding and output head included, takes it.
- ternary types (ptq1_0, pq2_0, q2_0, tq1_0, tq2_0) and q4_0: the linear weights of the blocks
  take it; token embedding and output head are F16.
- auto: F16 for a float checkpoint (BF16 when the source is BF16). A checkpoint whose linear
  weights are (mostly) exactly ternary gets the best lossless ternary packing for each ternary
  tensor (PTQ1_0, or Q2_0 when the scales hold only per 64 weights) and F16 for everything else
  2-D (listed in the fallback table when a linear weight is not ternary).
These rules are for Hugging Face checkpoints; PTQ1_0 directories and GGUF input keep their tiers
(see hf_to_gguf.py and gguf_to_gguf.py).
- A row whose length is not a multiple of the type's block cannot be stored in it: such tensors
  fall back to F16 (reported).

general.file_type values: llama.cpp's llama_ftype numbers, and PrismML's fork for PQ2_0 (128) and
PTQ1_0 (129).
"""

from __future__ import annotations

from ..errors import BonsaiError
from ..ggml_types import type_info

OUTTYPES = ("auto", "f32", "f16", "bf16", "q8_0", "q4_0", "ptq1_0", "pq2_0", "q2_0", "tq1_0",
            "tq2_0")
FLOAT_OUTTYPES = ("f32", "f16", "bf16")
TERNARY_OUTTYPES = ("ptq1_0", "pq2_0", "q2_0", "tq1_0", "tq2_0")
# Out types that a float checkpoint reaches without --allow-lossy (as llama.cpp's converter).
FREE_OUTTYPES = ("auto", "f32", "f16", "bf16", "q8_0")
# --embed-type: what token_embd and output.weight may be stored as, whatever --outtype gives the
# rest (llama-quantize's --token-embedding-type / --output-tensor-type, as one choice).
EMBED_TYPES = ("f32", "f16", "bf16", "q8_0")

FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32, "tq1_0": 36, "tq2_0": 37,
             "q2_0": 41, "q2_0_g128": 41, "pq2_0": 128, "ptq1_0": 129}

OUTTYPE_HELP = """\
output types (--outtype):
  auto     f16 for a float checkpoint (bf16 if the source is bf16); for a ternary checkpoint its
           ternary weights packed losslessly to ptq1_0 (q2_0 where scales hold only per 64)
  f32, f16, bf16
           plain floats for every 2-D tensor (1-D tensors are always f32)
  q8_0     8-bit blocks of 32 with an f16 scale (8.5 bpw), as llama.cpp's converter
  ptq1_0   ternary, base-3 packed, 128 weights per f16 scale (1.75 bpw) - the project default
  pq2_0    ternary, 2-bit codes, 128 per scale (2.125 bpw; PrismML's fork)
  q2_0     ternary, 2-bit codes, 64 per scale (2.25 bpw; mainline llama.cpp)
  tq1_0, tq2_0
           mainline llama.cpp's ternary types, 256 weights per scale (1.69 / 2.06 bpw)
  q4_0     4-bit blocks of 32 (4.5 bpw)
Ternary types and q4_0 keep the token embedding and output head at f16 (--embed-type chooses
another: q8_0 halves the output head, the largest read of a decoded token). Ternary types pack
weights that are already exactly ternary, losslessly (verified); rounding float weights to them
or to q4_0 needs --allow-lossy, and `bonsai quantize` is the proper tool for that."""


def check_embed_type(t: str | None) -> None:
    if t is not None and t not in EMBED_TYPES:
        raise BonsaiError(f"--embed-type {t!r}: choose one of {', '.join(EMBED_TYPES)}")


def is_ternary_type(t: str) -> bool:
    return type_info(t).ternary


def fits_block(t: str, row_len: int) -> bool:
    return row_len % type_info(t).block_size == 0


def file_type_of(types_by_params: dict[str, int]) -> int:
    """general.file_type: the type holding most 2-D parameters (F32 for an all-F32 file)."""
    quantish = {t: n for t, n in types_by_params.items() if t != "f32"}
    if not quantish:
        return FILE_TYPE["f32"]
    main = max(quantish, key=quantish.get)
    return FILE_TYPE.get(main, FILE_TYPE["f16"])
