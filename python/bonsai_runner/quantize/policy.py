"""Which type each tensor gets: the default scheme, per-pattern overrides, and --target-bpw promotion.

Default scheme (SPEC section 5):
    q/k/v/o, gate/up projections      ternary: PTQ1_0 (g128), or Q2_0 (g64) with --group-size 64
      (Qwen3.5 GDN: in_proj_qkv, in_proj_z, out_proj too)
    down_proj                         Q8_0
    token embedding, output head      Q8_0 (--embed-type f16: F16)
    other 2-D weights                 F16 (Qwen3.5 GDN in_proj_a / in_proj_b: the gate inputs,
                                      n_v_heads rows each, too small to be worth quantizing)
    norms, biases, other 1-D tensors  F32 (and Qwen3.5's conv1d taps [conv_dim, 1, kernel])
`--policy` overrides per pattern, later rules winning: "pattern=type,pattern=type" or a JSON file
{"pattern": "type", ...}. A pattern with `*`/`?`/`[` is a glob on the Hugging Face tensor name,
otherwise a substring ("down_proj=ptq1_0", "layers.0.*=q8_0"). Overridden tensors are pinned:
neither the sensitivity threshold nor --target-bpw changes them.

--target-bpw B (greedy, over the whole model): every unpinned linear layer starts at the ternary
tier; while a promotion still fits under B (the linear-layer average never exceeds B), the tensor
and the higher tier among PTQ1_0 -> Q2_0_4L (four-level Q2_0, 2.25 bpw) -> Q4_0 -> Q8_0 (any
higher one, not only the next) that buy the largest drop of its estimated loss per extra bit,
among those that fit, are taken (from the --group-size 64 ternary Q2_0: Q4_0, Q8_0). The
estimated loss of a tensor at a tier is weight x (relative layer-output error)^2, where
  - the relative error is that of the PLAIN per-group fit (exact ternary fit under the Hessian
    diagonal, or the other tiers' scale rule; gptq.plain_fit_errors), measured by the pipeline's
    pre-pass on the float model's calibration inputs, one block at a time. It is not the error
    GPTQ will reach: GPTQ + refit at every tier of every layer would cost four times the
    quantization itself (a down_proj alone ~30 s per tier on 2 cores), and GPTQ lowers a layer's
    error by a similar factor at every tier (Qwen2.5-0.5B block 0, final / plain: q_proj
    0.28-0.35, k 0.36-0.41, v 0.48-0.55, o 0.27-0.47, gate 0.48-0.61, up 0.48-0.64; median 0.47
    over the 25 layer-tiers measured), so the plain-fit errors keep the greedy ORDER of a
    layer's tiers. Across layers that factor varies (0.27-0.64), which the estimate ignores;
  - the weight says how much the layer's output matters. "fisher" (QuantizeOptions.target_gain,
    the default) replaces weight x rel^2 by the predicted KL divergence from the float model:
    the plain fit's per-output-channel errors weighted by the float model's output-channel
    Fisher information, from one extra backward pass (fisher.py), so a layer whose errors the
    rest of the model amplifies gets its bits first. Measured on Qwen2.5-Coder-0.5B (rotated,
    12 x 256 calibration, 8 x 512 evaluation tokens) at --target-bpw 3.74: PPL ratio 1.58 with
    "relative" (which left 24 gate/down projections ternary and sent 26 small k/v projections to
    Q8_0), 1.25 with "fisher" (llama.cpp's IQ1_M + imatrix at 3.736 bpw: 1.38).
    "relative": 1, every
    layer's relative error counts the same. "output" (QuantizeOptions.target_gain): tr(W H W^T),
    the float layer's output energy on the calibration data, so weight x rel^2 is the absolute
    output error ||(W - Q) X||^2 per token. Measured on Qwen2.5-0.5B at --target-bpw 2.5
    (4 x 512 calibration, both plans quantized by the plain fit): "relative" mean KLD 4.68 on
    the built-in evaluation text, "output" 7.65 -- the output energy sends the bits to q/k_proj,
    whose large outputs feed a softmax, and leaves o_proj at PTQ1_0. Items without a "weight"
    count 1.
B below the all-ternary average, or above all-Q8_0, is an error. Pinned tensors keep their type
but count in the average.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path

from ..convert.ptq1_pack import TIERS
from ..errors import BonsaiError
from ..ggml_types import type_info

QUANT_TIERS = tuple(TIERS)  # ptq1_0, q2_0, q2_0_4l, q4_0, q8_0: what the quantizer fits
PLAIN_TYPES = ("f16", "f32", "bf16")
# --target-bpw's tiers above the ternary one, by bits per weight. The ternary Q2_0 (group 64) is
# not among them: the four-level fit in the same Q2_0 blocks costs the same bits and its error is
# 15-17% lower (gptq.py's measurements), so it would never be the better buy.
PROMOTION = ("q2_0_4l", "q4_0", "q8_0")
EMBED_TYPES = ("f16", "q8_0")      # --embed-type: the token embedding and output head
DEFAULT_EMBED_TYPE = "q8_0"        # nearly free on a quantized model (README: "Output head at Q8_0")
TERNARY_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                   "in_proj_qkv", "in_proj_z", "out_proj")


def tier_file_type(t: str) -> str:
    """The file type a tier or plain type is stored as (Q2_0_4L: Q2_0)."""
    return TIERS[t].gguf_type if t in TIERS else t


def tier_bpw(t: str) -> float:
    return type_info(tier_file_type(t)).bpw


def promotion_chain(ternary: str) -> tuple[str, ...]:
    """The ternary tier, then the --target-bpw tiers that cost more bits than it."""
    return (ternary,) + tuple(t for t in PROMOTION if tier_bpw(t) > tier_bpw(ternary))


def ternary_tier(group_size: int) -> str:
    if group_size == 128:
        return "ptq1_0"
    if group_size == 64:
        return "q2_0"
    raise BonsaiError(f"--group-size {group_size}: the ternary file types store one scale per 128 "
                      "weights (PTQ1_0) or per 64 (Q2_0); use 128 or 64")


def parse_policy(spec: str | None) -> list[tuple[str, str]]:
    """[(pattern, type)] from "p=t,p=t" or a JSON file path; types are checked."""
    if not spec:
        return []
    p = Path(spec)
    if p.suffix.lower() == ".json" or p.is_file():
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BonsaiError(f"--policy {spec}: file not found") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BonsaiError(f"--policy {spec}: not a JSON object of pattern -> type ({e})") \
                from None
        if not isinstance(data, dict):
            raise BonsaiError(f"--policy {spec}: expected a JSON object of pattern -> type")
        rules = list(data.items())
    else:
        rules = []
        for part in spec.split(","):
            if "=" not in part:
                raise BonsaiError(f"--policy: rule {part!r} is not pattern=type (e.g. "
                                  "\"down_proj=q4_0,layers.0.*=q8_0\")")
            pat, t = part.rsplit("=", 1)
            rules.append((pat.strip(), t.strip()))
    out = []
    for pat, t in rules:
        t = str(t).lower()
        if t not in QUANT_TIERS + PLAIN_TYPES or not pat:
            raise BonsaiError(f"--policy: rule {pat!r}={t!r}: type must be one of "
                              f"{', '.join(QUANT_TIERS + PLAIN_TYPES)}")
        out.append((pat, t))
    return out


def _matches(pattern: str, name: str) -> bool:
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


@dataclass
class Policy:
    group_size: int = 128
    embed_type: str = DEFAULT_EMBED_TYPE
    rules: tuple = ()

    def __post_init__(self):
        self.ternary = ternary_tier(self.group_size)
        if self.embed_type not in EMBED_TYPES:
            raise BonsaiError(f"--embed-type {self.embed_type}: use {' or '.join(EMBED_TYPES)}")

    def default_type(self, name: str, ndim: int) -> str:
        if ndim != 2:
            return "f32"
        if "embed_tokens" in name or name.startswith("lm_head"):
            return self.embed_type
        if any(f".{k}." in name for k in TERNARY_LINEARS):
            return self.ternary
        if ".down_proj." in name:
            return "q8_0"
        return "f16"

    def type_of(self, name: str, ndim: int) -> tuple[str, bool]:
        """(type, pinned by a --policy rule)."""
        t, pinned = self.default_type(name, ndim), False
        for pat, rt in self.rules:
            if _matches(pat, name):
                t, pinned = rt, True
        if ndim != 2 and t in QUANT_TIERS:
            raise BonsaiError(f"--policy: {name} is {ndim}-D; only 2-D weights can be quantized")
        return t, pinned


def check_target(target: float, linear: list[tuple[str, int, str | None]], ternary: str) -> None:
    """linear: (name, params, pinned type or None). Errors when `target` cannot be met."""
    n = sum(p for _, p, _ in linear)
    lo = sum(p * tier_bpw(t or ternary) for _, p, t in linear) / n
    hi = sum(p * tier_bpw(t or "q8_0") for _, p, t in linear) / n
    if target < lo - 1e-9:
        raise BonsaiError(f"--target-bpw {target}: below {lo:.4f}, the linear-layer average with "
                          f"every unpinned linear layer at {ternary.upper()} (scales included); "
                          "raise it")
    if target > hi + 1e-9:
        raise BonsaiError(f"--target-bpw {target}: above {hi:.4f}, the linear-layer average with "
                          "every unpinned linear layer at Q8_0, the highest tier; lower it")


def _loss(item: dict, tier: str) -> float:
    """The estimated loss of a tensor at a tier: its predicted model-loss increase when it has
    one ("loss", the Fisher estimate), else weight x (relative output error)^2."""
    if "loss" in item:
        return item["loss"][tier]
    return item.get("weight", 1.0) * item["err"][tier] ** 2


def promote_to_target(target: float, items: dict[str, dict], ternary: str) -> dict[str, str]:
    """Greedy promotion. items: name -> {"params", "pinned": type|None,
    "err": {tier: relative output error}, optional "weight" (default 1), optional "loss":
    {tier: predicted loss increase}, which replaces weight x err^2}; returns name -> tier.

    Each step takes the (tensor, higher tier) pair with the largest loss drop per extra bit,
    over every higher tier, not only the next one: a tensor whose Q2_0_4L barely helps but whose
    Q4_0 does is promoted straight to Q4_0. The budget is a ceiling: only pairs that still fit
    under it are candidates, and the promotion ends when none fits (so a file made at another
    file's measured bpw is never larger than it)."""
    chain = promotion_chain(ternary)
    choice = {n: (it["pinned"] or ternary) for n, it in items.items()}
    total = sum(it["params"] for it in items.values())
    used = sum(items[n]["params"] * tier_bpw(t) for n, t in choice.items())

    budget = target * total + 1e-9 * total

    def moves():
        for n, it in items.items():
            if it["pinned"]:
                continue
            cur = chain.index(choice[n])
            for up in chain[cur + 1:]:
                cost = it["params"] * (tier_bpw(up) - tier_bpw(choice[n]))
                if used + cost <= budget:
                    gain = _loss(it, choice[n]) - _loss(it, up)
                    yield gain / cost, cost, n, up

    while True:
        pick = max(moves(), default=None, key=lambda m: m[0])
        if pick is None:
            break
        used += pick[1]
        choice[pick[2]] = pick[3]
    return choice
