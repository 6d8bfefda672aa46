"""Folding the prism.hadamard rotation (SPEC §4a) into a conversion plan (`--hadamard B`).

Every eligible linear weight (blk.N.attn_q/k/v/output, ffn_gate/up/down, the output head, and
qwen35's attn_qkv, attn_gate and ssm_out) gets
rows WHT_B(s ⊙ w) blockwise along its input dimension, with one seeded ±1 sign vector per
distinct input width (`--hadamard-seed`); token_embd gets the same transform of its rows and is
listed as inverse-folded (the engine computes e = s ⊙ WHT_B(z) after the lookup). A tied head
becomes an explicit folded output.weight (the rotated token_embd rows, which is what a folded
head stores). qwen35's ssm_out is folded along its input as the file stores it (V heads in tiled
order), so no `gdn_v_grouped` key is written: the engine rotates the GDN output in that same
order. ssm_alpha / ssm_beta stay unrotated (the fork does not fold them). The prism.hadamard.* keys are written from the same names and signs, so the file's
weights and its metadata cannot disagree. Folding changes every folded value by the output
type's rounding: float output types take it as it is, quantized ones (re-quantizing the rotated
values) need --allow-lossy.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import BonsaiError
from ..hadamard import PREFIX, is_power_of_two, metadata_keys, rotate, seeded_signs
from .arch.base import MetaKV

FOLDABLE = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_qkv|attn_gate|attn_output|ffn_gate|ffn_up|"
                     r"ffn_down|ssm_out)\.weight$")
_FLOAT = ("f32", "f16", "bf16")


def check_block(block: int) -> None:
    if not is_power_of_two(int(block)) or not 2 <= block <= 65536:
        raise BonsaiError(f"--hadamard {block}: the block must be a power of two (64, 128, 256, ... 2048 "
                          "are the sizes the engine's SIMD kernels are tuned for)")


def fold_plan(items: list, metadata: list[MetaKV], block: int, seed: int, allow_lossy: bool,
              make_item) -> tuple[list, list[MetaKV]]:
    """Returns the plan with folded sources and the prism.hadamard metadata keys to add.

    items: PlannedTensor list whose `load()` gives a source with `dequantize()` or an array;
    make_item(name, shape, out_type, load, role) builds a new PlannedTensor (the tied head)."""
    check_block(block)
    if any(kv.key.startswith(PREFIX) for kv in metadata):
        raise BonsaiError("the input is already Hadamard-rotated (it carries prism.hadamard.* keys); "
                          "re-typing keeps its rotation, so convert it without --hadamard")
    by_name = {it.name: it for it in items}
    if "token_embd.weight" not in by_name:
        raise BonsaiError("--hadamard: the model has no token_embd.weight")
    folded = [it.name for it in items if FOLDABLE.match(it.name) and len(it.shape) == 2]
    if not folded:
        raise BonsaiError("--hadamard: no foldable linear weights (blk.N.attn_*/ffn_*.weight) in the input")
    emb = by_name["token_embd.weight"]
    out = list(items)
    if "output.weight" not in by_name:  # tied head -> explicit folded copy of token_embd
        head = make_item("output.weight", emb.shape, emb.out_type, emb.load, "")
        out.insert(out.index(emb) + 1, head)
        by_name["output.weight"] = head
    folded.append("output.weight")
    widths = sorted({by_name[n].shape[-1] for n in folded} | {emb.shape[-1]})
    for n in folded + ["token_embd.weight"]:
        w = by_name[n].shape[-1]
        if w % block:
            raise BonsaiError(f"--hadamard {block}: {n} has input width {w}, not a multiple of the block; "
                              f"choose a block that divides every width ({', '.join(map(str, widths))})")
    signs = {w: seeded_signs(w, seed) for w in widths}
    lossy = sorted({by_name[n].out_type for n in folded + ["token_embd.weight"]} - set(_FLOAT))
    if lossy and not allow_lossy:
        raise BonsaiError(f"--hadamard re-quantizes the rotated weights to {', '.join(t.upper() for t in lossy)}, "
                          "which changes values; pass --allow-lossy, or write a float type (--outtype f16) "
                          "and quantize that")
    for n in folded + ["token_embd.weight"]:
        it = by_name[n]
        s = signs[it.shape[-1]].astype(np.float64)
        it.load = _rotated_loader(it.load, s, block)
        it.exact = False
    return out, rotation_metadata(block, signs, folded, inverse_embd=True)


_KEY_TYPES = {"version": "UINT32", "block_size": "UINT32", "transform": "STRING", "axis": "STRING",
              "sign_mode": "STRING", "weight_names": "STRING", "sign_widths": "INT32",
              "sign_values": "INT32", "inverse_weight_names": "STRING"}


def rotation_metadata(block: int, signs: dict[int, np.ndarray], folded: list[str],
                      inverse_embd: bool) -> list[MetaKV]:
    """The prism.hadamard.* keys (typed) of an explicit-sign rotation of the GGUF weights `folded`."""
    keys = metadata_keys(block, signs, folded, inverse_embd=inverse_embd)
    return [MetaKV(k, v, _KEY_TYPES[k[len(PREFIX):]]) for k, v in keys.items()]


def quantizer_rotation_metadata(rotation: dict, gguf_names: dict[str, str],
                                widths: dict[str, int]) -> list[MetaKV]:
    """The keys of a `bonsai quantize --rotate` directory (its config's bonsai.rotation):
    `gguf_names` / `widths` map its HF weight names to GGUF names and input widths."""
    where = "quantization_config.bonsai.rotation"
    if not isinstance(rotation, dict) or rotation.get("method") != "hadamard":
        raise BonsaiError(f"{where}: expected {{\"method\": \"hadamard\", ...}}, got {rotation!r}")
    try:
        block, seed = int(rotation["block_size"]), int(rotation["seed"])
        names = [str(n) for n in rotation["weight_names"]]
    except (KeyError, TypeError, ValueError) as e:
        raise BonsaiError(f"{where}: block_size, seed and weight_names are required ({e})") from None
    check_block(block)
    unknown = [n for n in names if n not in gguf_names]
    if unknown:
        raise BonsaiError(f"{where}: {unknown[0]} is not a linear weight of this directory")
    bad = [n for n in names if widths[n] % block]
    if bad:
        raise BonsaiError(f"{where}: {bad[0]} has input width {widths[bad[0]]}, not a multiple of "
                          f"block_size {block}")
    signs = {w: seeded_signs(w, seed) for w in sorted({widths[n] for n in names})}
    return rotation_metadata(block, signs, [gguf_names[n] for n in names], inverse_embd=False)


def _rotated_loader(load, signs: np.ndarray, block: int, rows_per_step: int = 8192):
    def run():
        src = load()
        x = src if isinstance(src, np.ndarray) else src.dequantize()
        x = np.asarray(x, np.float32)
        out = np.empty(x.shape, np.float32)
        for r in range(0, x.shape[0], rows_per_step):  # float64 in slices: bounded memory
            out[r:r + rows_per_step] = rotate(x[r:r + rows_per_step].astype(np.float64), signs, block)
        return out
    return run

