"""`--rotate hadamard[:B]`: the prism.hadamard rotation (SPEC §4a) folded into the model before quantizing.

Every linear weight of a decoder block (q/k/v/o, gate/up/down) is replaced by its rotated form
W' = rows WHT_B(s ⊙ w) -- the rows a folded file stores -- and the input of that linear by
x' = WHT_B(s ⊙ x) (a forward pre-hook on the module, hf_layers.HfLayers.rotation). Since WHT_B is
orthogonal and self-inverse, W' x' = W x: the rotated model computes the same function, and the
quantizer needs no other change. The Hessians are sums of the rotated inputs, GPTQ, the tier
estimates of --target-bpw, the sensitivity analysis and the --calib-steps refinement all work on
the rotated weights, and the packed codes are the rotated rows the engine multiplies with its
rotated activations. Why it helps: a random sign flip followed by a Hadamard transform spreads each
group's outliers over the whole block (incoherence processing, QuIP / QuaRot), so a ternary grid
with one scale per 128 weights loses less.

Not rotated: the token embedding and the output head (F16 or Q8_0 tables, which gain nothing from
it; the file lists no inverse-folded weight), the norms, and the linears of Qwen3.5's Gated
DeltaNet layers (their ssm_out columns are reordered by the converter; refused for now).

Default (`--rotate auto`): hadamard wherever it applies, none where it cannot (qwen35, --equalize,
an already-ternary checkpoint, and the `--method rtn` baseline), with one line in the log saying which. Measured on
Qwen2.5-Coder-0.5B-Instruct (the demo's 12 x 256 calibration, default policy, `bonsai compare`
4 x 512 of the built-in evaluation text): PPL ratio 12.84 -> 3.40, same top token 24.8% -> 44.7%.

B: a power of two; by default the largest one up to 1024 that divides every rotated input width
(896 and 4864 on Qwen2.5-0.5B -> 128). Signs: one seeded ±1 vector per distinct input width
(hadamard.seeded_signs with --seed, the converter's --hadamard-seed scheme), so the written
prism.hadamard keys regenerate them exactly.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from ..errors import BonsaiError
from ..hadamard import hadamard_matrix, is_power_of_two, seeded_signs
from .hf_layers import HF_KEYS

ROTATED_KEYS = ("q", "k", "v", "o", "gate", "up", "down")
MAX_AUTO_BLOCK = 1024


def parse_rotate(spec: str | None) -> int | None:
    """--rotate none | hadamard | hadamard:B -> None (off), 0 (automatic block) or B ("auto" is
    resolved by the pipeline: hadamard where the model supports it, see AUTO)."""
    if spec is None or spec == "none":
        return None
    if spec == "auto":
        return 0
    m = re.fullmatch(r"hadamard(?::(\d+))?", spec)
    if not m:
        raise BonsaiError(f"--rotate {spec!r}: use auto, none, hadamard (automatic block) or hadamard:B "
                          "(B a power of two, e.g. hadamard:128)")
    if m.group(1) is None:
        return 0
    block = int(m.group(1))
    if not is_power_of_two(block) or block > 65536:
        raise BonsaiError(f"--rotate {spec}: the block must be a power of two (64, 128, 256, ...)")
    return block


def choose_block(requested: int, widths: dict[str, int]) -> int:
    """The block for `widths` (tensor name -> input width): `requested`, checked, or when 0 the
    largest power of two up to MAX_AUTO_BLOCK dividing them all."""
    if requested:
        bad = {n: w for n, w in widths.items() if w % requested}
        if bad:
            name, w = next(iter(bad.items()))
            raise BonsaiError(f"--rotate hadamard:{requested}: {name} has input width {w}, not a "
                              f"multiple of {requested}; use a block that divides every width "
                              f"({', '.join(map(str, sorted(set(widths.values()))))}) or plain "
                              "--rotate hadamard")
        return requested
    g = 0
    for w in widths.values():
        g = math.gcd(g, w)
    block = 1
    while block * 2 <= MAX_AUTO_BLOCK and g % (block * 2) == 0:
        block *= 2
    if block < 2:
        raise BonsaiError("--rotate hadamard: the input widths "
                          f"({', '.join(map(str, sorted(set(widths.values()))))}) share no power-of-two "
                          "factor; the rotation cannot be applied to this model")
    return block


class Rotation:
    """The blockwise sign + Walsh-Hadamard rotation of one model (block B, seed)."""

    def __init__(self, block: int, seed: int, device: torch.device):
        self.block, self.seed, self.device = block, seed, device
        self._h = torch.from_numpy(hadamard_matrix(block)).to(device, torch.float32)
        self._signs: dict[int, torch.Tensor] = {}

    def signs(self, width: int) -> np.ndarray:
        return seeded_signs(width, self.seed)

    def _sign_tensor(self, width: int, device) -> torch.Tensor:
        s = self._signs.get(width)
        if s is None or s.device != device:
            s = torch.from_numpy(self.signs(width).astype(np.float32)).to(device)
            self._signs[width] = s
        return s

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """WHT_B(s ⊙ x) along the last dimension, in float32 (the rotated input of a linear, and
        the rotated rows of its weight); differentiable."""
        n = x.shape[-1]
        with torch.autocast(x.device.type, enabled=False):
            y = x.float() * self._sign_tensor(n, x.device)
            h = self._h if self._h.device == x.device else self._h.to(x.device)
            y = (y.reshape(*x.shape[:-1], n // self.block, self.block) @ h).reshape(x.shape)
        return y

    def rotate_block(self, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A block's weights (short keys) with the linears of ROTATED_KEYS rotated."""
        return {k: (self.apply(v) if k in ROTATED_KEYS else v) for k, v in w.items()}

    def module_names(self) -> set[str]:
        """The rotated linear modules inside a decoder layer (transformers names)."""
        return {HF_KEYS[k].removesuffix(".weight") for k in ROTATED_KEYS}

    def describe(self, hf_names: list[str]) -> dict:
        """quant_config.json's `rotation` entry: what the converter needs for the prism.hadamard
        keys (the signs are regenerated from the seed per input width)."""
        return {"method": "hadamard", "block_size": self.block, "seed": self.seed,
                "sign_mode": "explicit", "weight_names": list(hf_names)}


def rotated_names(specs) -> dict[str, int]:
    """hf name -> input width of the linear weights --rotate folds (decoder-block linears of
    ROTATED_KEYS)."""
    suffixes = tuple("." + HF_KEYS[k] for k in ROTATED_KEYS)
    return {s.hf_name: int(s.shape[-1]) for s in specs
            if s.hf_name.startswith("model.layers.") and s.hf_name.endswith(suffixes)}
