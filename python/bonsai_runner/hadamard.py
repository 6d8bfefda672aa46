"""The prism.hadamard rotation contract (SPEC §4a) in numpy: the transform, folding it into weights,
the metadata keys, and a readable summary of a file's rotation.

H_B[r][c] = (-1)^popcount(r & c) / sqrt(B) (natural Sylvester order, symmetric, self-inverse),
applied block by block along the last axis. A folded linear weight stores rows WHT_B(s ⊙ w), so
W x = W_stored · WHT_B(s ⊙ x); a folded token_embd stores rows WHT_B(s ⊙ e), looked up as
e = s ⊙ WHT_B(z). `fwht` is the fast butterfly form; `hadamard_matrix` is the explicit matrix the
tests compare it with.
"""

from __future__ import annotations

import numpy as np

PREFIX = "prism.hadamard."
TRANSFORM = "normalized-sylvester-walsh-hadamard"
AXIS = "input-last-dimension"
KEYS = ("version", "block_size", "transform", "axis", "sign_mode", "weight_names", "sign_widths",
        "sign_values", "inverse_weight_names", "gdn_v_grouped")


def is_power_of_two(b: int) -> bool:
    return b >= 2 and (b & (b - 1)) == 0


def hadamard_matrix(block: int) -> np.ndarray:
    """The explicit normalized Sylvester matrix H_B (float64)."""
    r = np.arange(block)
    bits = np.bitwise_and(r[:, None], r[None, :])
    parity = np.array([bin(int(v)).count("1") & 1 for v in bits.reshape(-1)]).reshape(block, block)
    return np.where(parity == 1, -1.0, 1.0) / np.sqrt(block)


def fwht(x: np.ndarray, block: int) -> np.ndarray:
    """WHT_B along the last axis, blockwise (fast butterflies; float64 unless x is float32)."""
    x = np.asarray(x)
    n = x.shape[-1]
    if not is_power_of_two(block) or n % block:
        raise ValueError(f"width {n} is not a multiple of the power-of-two block {block}")
    dt = np.float32 if x.dtype == np.float32 else np.float64
    y = x.astype(dt, copy=True).reshape(-1, n // block, block)
    h = 1
    while h < block:
        y = y.reshape(y.shape[0], y.shape[1], block // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2).reshape(y.shape[0], y.shape[1], block)
        h *= 2
    return (y * dt(1.0 / np.sqrt(block))).reshape(x.shape)


def rotate(x: np.ndarray, signs: np.ndarray | None, block: int) -> np.ndarray:
    """x' = WHT_B(s ⊙ x): the input of a folded matmul, and the stored rows of a folded weight."""
    return fwht(x if signs is None else np.asarray(x) * signs, block)


def unrotate(z: np.ndarray, signs: np.ndarray | None, block: int) -> np.ndarray:
    """s ⊙ WHT_B(z): the inverse (the embedding lookup of a folded token_embd)."""
    y = fwht(z, block)
    return y if signs is None else y * signs


def seeded_signs(width: int, seed: int) -> np.ndarray:
    """A reproducible ±1 vector for one input width (the converter's --hadamard-seed)."""
    rng = np.random.default_rng([seed, width])
    return np.where(rng.integers(0, 2, width) == 1, 1, -1).astype(np.int32)


def metadata_keys(block: int, signs: dict[int, np.ndarray], weight_names: list[str],
                  inverse_embd: bool) -> dict:
    """The prism.hadamard.* keys of an explicit-sign rotation: key -> value (writer decides types)."""
    widths = sorted(signs)
    return {
        PREFIX + "version": 1,
        PREFIX + "block_size": int(block),
        PREFIX + "transform": TRANSFORM,
        PREFIX + "axis": AXIS,
        PREFIX + "sign_mode": "explicit",
        PREFIX + "weight_names": list(weight_names),
        PREFIX + "sign_widths": [int(w) for w in widths],
        PREFIX + "sign_values": np.concatenate([np.asarray(signs[w], np.int32) for w in widths]).tolist()
        if widths else [],
        PREFIX + "inverse_weight_names": ["token_embd.weight"] if inverse_embd else [],
    }


class Contract:
    """A file's rotation read from its metadata (a dict of plain Python values)."""

    def __init__(self, metadata: dict):
        keys = {k: v for k, v in metadata.items() if k.startswith(PREFIX)}
        self.present = bool(keys)
        if not self.present:
            return
        unknown = sorted(k for k in keys if k[len(PREFIX):] not in KEYS)
        if unknown:
            raise ValueError(f"{unknown[0]} is not part of the prism.hadamard version 1 contract")
        if int(keys.get(PREFIX + "version", 0)) != 1:
            raise ValueError(f"prism.hadamard.version {keys.get(PREFIX + 'version')!r} is not supported (1)")
        self.block = int(keys[PREFIX + "block_size"])
        if not is_power_of_two(self.block):
            raise ValueError(f"prism.hadamard.block_size {self.block} is not a power of two")
        if keys.get(PREFIX + "transform") != TRANSFORM or keys.get(PREFIX + "axis") != AXIS:
            raise ValueError("unsupported prism.hadamard.transform / axis")
        self.sign_mode = str(keys.get(PREFIX + "sign_mode", "identity"))
        self.weight_names = [str(n) for n in keys.get(PREFIX + "weight_names", [])]
        self.inverse_names = [str(n) for n in keys.get(PREFIX + "inverse_weight_names", [])]
        self.gdn_v_grouped = bool(keys.get(PREFIX + "gdn_v_grouped", False))
        self.signs: dict[int, np.ndarray] = {}
        if self.sign_mode == "explicit":
            widths = [int(w) for w in keys[PREFIX + "sign_widths"]]
            values = np.asarray(keys[PREFIX + "sign_values"], np.float64)
            if sum(widths) != len(values):
                raise ValueError("prism.hadamard.sign_widths and sign_values lengths are inconsistent")
            at = 0
            for w in widths:
                self.signs[w] = values[at:at + w]
                at += w
        elif self.sign_mode != "identity":
            raise ValueError(f"prism.hadamard.sign_mode {self.sign_mode!r} is not supported")

    def signs_for(self, width: int) -> np.ndarray | None:
        if self.sign_mode != "explicit":
            return None
        if width not in self.signs:
            raise ValueError(f"prism.hadamard.sign_widths has no signs for input width {width}")
        return self.signs[width]

    def unfold(self, name: str, w: np.ndarray) -> np.ndarray:
        """The weight in the unrotated basis (folded and inverse-folded tensors; others unchanged)."""
        if name in self.weight_names or name in self.inverse_names:
            return unrotate(w, self.signs_for(w.shape[-1]), self.block)
        return w

    def fold(self, name: str, w: np.ndarray) -> np.ndarray:
        """The stored form of an unrotated weight (the inverse of unfold)."""
        if name in self.weight_names or name in self.inverse_names:
            return rotate(w, self.signs_for(w.shape[-1]), self.block)
        return w


def format_rotation(metadata: dict) -> str | None:
    """One readable paragraph on a file's rotation for `bonsai inspect` (None when it has none)."""
    keys = {k: v for k, v in metadata.items() if k.startswith(PREFIX)}
    if not keys:
        return None
    names = list(keys.get(PREFIX + "weight_names", []))
    inverse = list(keys.get(PREFIX + "inverse_weight_names", []))
    widths = list(keys.get(PREFIX + "sign_widths", []))
    kinds: dict[str, int] = {}
    for n in names:
        kind = n.split(".")[-2] if n.startswith("blk.") else n.rsplit(".", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    lines = [
        f"Hadamard rotation (prism.hadamard v{keys.get(PREFIX + 'version', '?')}): block "
        f"{keys.get(PREFIX + 'block_size', '?')}, {keys.get(PREFIX + 'transform', '?')}, "
        f"signs {keys.get(PREFIX + 'sign_mode', 'identity')}"
        + (f" (widths {', '.join(str(w) for w in widths)})" if widths else ""),
        f"  folded weights: {len(names)} (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")",
        "  inverse-folded: " + (", ".join(inverse) if inverse else "none"),
    ]
    return "\n".join(lines)
