"""Hugging Face directory (float or already-ternary) or PTQ1_0 directory -> one GGUF file.

Steps, all checks before the first byte is written:
1. open the source (hf_reader / ptq1_dir), pick the model family from config.json (arch/),
   validate every tensor against the family's expected list (missing, extra, mis-shaped: one error);
2. build the tokenizer metadata (tokenizer_meta) against the embedding's row count;
3. plan the output type of every tensor (outtypes): for `auto` and the ternary out types, each
   linear weight is checked for exact ternarity (ternary.py: a cheap look at a few rows first, the
   whole tensor only when those are ternary); tensors that would be rounded are listed in one
   error unless --allow-lossy; for PTQ1_0 directories every tier keeps its own GGUF type and any
   re-typing is verified exact (plan.find_lossy);
4. write metadata (general.*, {arch}.*, tokenizer.*, bonsai.*) and stream the tensors, one at a
   time, through GGUFWriter (temporary file, renamed when complete).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import BonsaiError
from ..ggml_types import type_info
from .arch import family_for
from .arch.base import (F32_ROLES, ROLE_LINEAR, ROLE_OUTPUT, ROLE_ROPE_FREQS, ROLE_TOKEN_EMBD,
                        STR, U32, MetaKV, TensorSpec, permute_rope_rows)
from .bonsai_meta import bonsai_metadata, fallback_entry
from .gguf_out import add_metadata, check_outfile, open_writer
from .hf_reader import HfCheckpoint, read_json
from .outtypes import (FREE_OUTTYPES, OUTTYPES, TERNARY_OUTTYPES, check_embed_type,
                       file_type_of, fits_block)
from .plan import PlannedTensor, find_lossy, lossy_error, needs_verification, write_plan
from .ptq1_dir import Ptq1Dir
from .ptq1_pack import TIERS
from .safetensors_file import bf16_bits_to_float32
from .ternary import best_ternary_type, group_needed, looks_ternary, ternary_groups
from .tokenizer_meta import read_tokenizer

_SAMPLE_ROWS = 4
_PLAIN_TYPES = {"F16": "f16", "BF16": "bf16", "F32": "f32"}


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


class HfSource:
    """A float Hugging Face checkpoint seen through the interface Ptq1Dir also offers."""

    def __init__(self, path: Path):
        self.ckpt = HfCheckpoint(path)
        self.path = Path(path)
        self.config = self.ckpt.config
        self.shapes = {n: self.ckpt.shape(n) for n in self.ckpt.tensor_names()}

    def tier_of(self, name: str):
        return None

    def read_float32(self, name: str) -> np.ndarray:
        return self.ckpt.read_float32(name)

    def sample_float32(self, name: str) -> np.ndarray:
        raw = self.ckpt.read_raw(name)[:_SAMPLE_ROWS]
        if self.ckpt.dtype(name) == "BF16":
            return bf16_bits_to_float32(raw)
        return np.asarray(raw, dtype=np.float32)

    def float_default(self) -> str:
        return "bf16" if self.ckpt.float_source_dtype() == "BF16" else "f16"


@dataclass
class _Plan:
    items: list[PlannedTensor] = field(default_factory=list)
    fallback: list[dict] = field(default_factory=list)
    sensitivity: dict[str, dict] = field(default_factory=dict)
    lossy_rounded: list[str] = field(default_factory=list)
    fell_back_block: list[str] = field(default_factory=list)
    strict: bool = False


def convert_hf(src: str | Path, outfile: str | Path, outtype: str = "auto", *,
               allow_lossy: bool = False, force: bool = False, pre_tokenizer: str | None = None,
               model_name: str | None = None, progress: bool = True,
               log: Callable[[str], None] = _stderr, embed_type: str | None = None) -> Path:
    """Converts a Hugging Face or PTQ1_0 directory `src` to the GGUF file `outfile`.

    `embed_type` (one of EMBED_TYPES) is the type of token_embd and output.weight, whatever
    `outtype` gives the rest (rounding to it is the caller's explicit choice, never refused)."""
    src = Path(src)
    outtype = outtype.lower()
    if outtype not in OUTTYPES:
        raise BonsaiError(f"unknown --outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    check_embed_type(embed_type)
    out = check_outfile(outfile, force)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise BonsaiError(f"{src}: no config.json; a Hugging Face model directory needs "
                          "config.json next to its *.safetensors files")
    config = read_json(cfg_path)
    if not isinstance(config, dict):
        raise BonsaiError(f"{cfg_path}: expected a JSON object")
    family = family_for(config, where=str(cfg_path))
    source = Ptq1Dir(src) if config.get("quantization_config") is not None else HfSource(src)
    specs = family.validate_tensors(source.shapes, str(src))
    _note_skipped(log, family, source.shapes)
    n_rows = next(s.shape[0] for s in specs if s.role == ROLE_TOKEN_EMBD)
    tok = read_tokenizer(src, family.config, n_rows, pre_tokenizer)
    if tok.n_padded:
        log(f"tokenizer: {len(tok.tokens) - tok.n_padded} tokens, padded with {tok.n_padded} "
            f"[PAD] tokens to the embedding's {n_rows} rows")

    if isinstance(source, Ptq1Dir):
        plan = _plan_ptq1(source, family, specs, outtype, allow_lossy)
    else:
        plan = _plan_hf(source, family, specs, outtype, allow_lossy, progress, log)
    if embed_type:
        plan.items = [PlannedTensor(it.name, it.shape, embed_type, it.load, False, it.role)
                      if it.role in (ROLE_TOKEN_EMBD, ROLE_OUTPUT) and fits_block(embed_type, it.shape[-1])
                      else it for it in plan.items]
    if plan.strict and not allow_lossy:
        lossy = find_lossy(plan.items, progress)
        if lossy:
            raise lossy_error(lossy, f"{src} to {outtype}")

    linear_params: dict[str, int] = {}
    for it in plan.items:
        if it.role == ROLE_LINEAR:
            linear_params[it.out_type] = linear_params.get(it.out_type, 0) + int(np.prod(it.shape))
    file_type = file_type_of(linear_params)
    name = model_name or Path(str(config.get("_name_or_path") or src.resolve().name)).name
    meta = [MetaKV("general.name", name, STR),
            MetaKV("general.file_type", file_type, U32)]
    if any(t not in ("f32", "f16", "bf16") for t in linear_params):
        meta.append(MetaKV("general.quantization_version", 2, U32))
    meta += family.metadata()
    meta += tok.metadata()
    meta += _bonsai_keys(source, plan, linear_params)
    if isinstance(source, Ptq1Dir) and source.bonsai.get("rotation") is not None:
        from .hadamard_fold import quantizer_rotation_metadata

        meta += quantizer_rotation_metadata(source.bonsai["rotation"],
                                            {s.hf_name: s.gguf_name for s in specs},
                                            {s.hf_name: int(s.shape[-1]) for s in specs})

    writer = open_writer(out, family.gguf_arch)
    add_metadata(writer, meta)
    write_plan(writer, plan.items, progress)
    _report(log, out, plan, linear_params)
    return out


def _note_skipped(log, family, shapes: dict) -> None:
    """One note naming the checkpoint parts the family leaves out (qwen35: vision, MTP)."""
    parts: dict[str, int] = {}
    for n in shapes:
        part = family.skipped_part(n)
        if part is not None:
            parts[part] = parts.get(part, 0) + 1
    if parts:
        what = "; ".join(f"{p}: {k} tensor(s)" for p, k in parts.items())
        log(f"note: skipped what the {family.gguf_arch} text model does not use: {what}")


# ----- planning -----

def _spec_loader(source, spec: TensorSpec):
    def load():
        x = source.read_float32(spec.hf_name)
        if spec.rope_heads:
            x = permute_rope_rows(x, spec.rope_heads)
        if spec.transform is not None:
            x = np.ascontiguousarray(spec.transform(x), dtype=np.float32)
        return x
    return load


def _packed_loader(source: Ptq1Dir, spec: TensorSpec):
    """A packed tensor takes a row permutation as is, and a permutation of column blocks when
    its group divides the block (then whole groups move, with their scales: exact)."""
    group = source.tier_of(spec.hf_name).group
    by_cols = spec.transform is not None and not spec.rows_only
    if by_cols and not (spec.cols_block and spec.cols_block % group == 0):
        why = (f"it moves blocks of {spec.cols_block} columns, which split its groups of {group}"
               if spec.cols_block else "it is not a row permutation")
        raise BonsaiError(f"{spec.hf_name}: a packed tensor cannot take the {spec.gguf_name} "
                          f"re-layout ({why}); quantize the model from its float checkpoint with "
                          "another type for this tensor, or convert the float checkpoint")

    def load():
        p = source.packed(spec.hf_name)
        if spec.rope_heads:
            p = p.permute_rows(lambda a: permute_rope_rows(a, spec.rope_heads))
        if by_cols:
            p = p.permute_column_groups(spec.transform, spec.hf_name)
        elif spec.transform is not None:
            p = p.permute_rows(spec.transform)
        return p
    return load


def _extra_items(family) -> list[PlannedTensor]:
    return [PlannedTensor(n, x.shape, "f32", (lambda x=x: x), role=ROLE_ROPE_FREQS)
            for n, x in family.extra_tensors()]


def _with_extras(items: list[PlannedTensor], family) -> list[PlannedTensor]:
    return items[:1] + _extra_items(family) + items[1:]


def _scan_ternary(source: HfSource, specs, progress: bool) -> dict[str, tuple[int, ...]]:
    linear = [s for s in specs if s.role == ROLE_LINEAR]
    groups: dict[str, tuple[int, ...]] = {}
    it = linear
    if progress:
        from tqdm import tqdm
        it = tqdm(linear, desc="detecting ternary weights", unit="tensor", file=sys.stderr,
                  leave=False)
    for s in it:
        if not looks_ternary(source.sample_float32(s.hf_name)):
            groups[s.hf_name] = ()
            continue
        groups[s.hf_name] = ternary_groups(_spec_loader(source, s)())
    return groups


def _plan_hf(source: HfSource, family, specs, outtype: str, allow_lossy: bool, progress: bool,
             log) -> _Plan:
    plan = _Plan()
    float_default = source.float_default()
    groups: dict[str, tuple[int, ...]] = {}
    ternary_ckpt = False
    if outtype == "auto" or outtype in TERNARY_OUTTYPES:
        groups = _scan_ternary(source, specs, progress)
        tern = sum(int(np.prod(s.shape)) for s in specs if groups.get(s.hf_name))
        total = sum(int(np.prod(s.shape)) for s in specs if s.role == ROLE_LINEAR)
        ternary_ckpt = total > 0 and 2 * tern >= total
    if outtype == "q4_0" and not allow_lossy:
        raise BonsaiError("q4_0 rounds the weights of a float checkpoint: pass --allow-lossy to "
                          "accept round-to-nearest, or use `bonsai quantize` (calibrated) instead")
    lossy: list[str] = []
    for spec in specs:
        load = _spec_loader(source, spec)
        exact = False
        if spec.role in F32_ROLES or len(spec.shape) == 1:
            t = "f32"
        elif spec.role in (ROLE_TOKEN_EMBD, ROLE_OUTPUT):
            if outtype == "auto":
                t = "f16" if ternary_ckpt else float_default
            else:
                t = outtype if outtype in FREE_OUTTYPES else "f16"
        elif outtype == "auto":
            t = best_ternary_type(groups.get(spec.hf_name, ())) if ternary_ckpt else None
            exact = t is not None
            t = t or ("f16" if ternary_ckpt else float_default)
            if ternary_ckpt and not exact:
                plan.fallback.append(fallback_entry(spec.gguf_name, t, "not ternary in the source "
                                                    "checkpoint"))
        elif outtype in TERNARY_OUTTYPES:
            t = outtype
            g = groups.get(spec.hf_name, ())
            if g and group_needed(outtype) in g:
                exact = True
            elif allow_lossy:
                plan.lossy_rounded.append(spec.gguf_name)
            else:
                have = f"ternary only per {max(g)} weights" if g else "not ternary"
                lossy.append(f"{spec.gguf_name} ({have})")
        else:
            t = outtype
        if not fits_block(t, spec.shape[-1]):
            plan.fell_back_block.append(f"{spec.gguf_name} ({t} block does not divide "
                                        f"{spec.shape[-1]})")
            t, exact = "f16", False
        plan.items.append(PlannedTensor(spec.gguf_name, spec.gguf_shape, t, load, exact,
                                        spec.role))
    if lossy:
        raise BonsaiError(
            f"--outtype {outtype} stores ternary weights, but {len(lossy)} linear tensor(s) are "
            "not exactly ternary with a group that fits:\n  " + "\n  ".join(lossy) +
            "\npass --allow-lossy to round them to nearest (a crude approximation: `bonsai "
            "quantize` is the proper tool for float weights); nothing was written")
    if plan.lossy_rounded:
        log(f"--allow-lossy: {len(plan.lossy_rounded)} float tensor(s) rounded to {outtype} "
            "(round-to-nearest; `bonsai quantize` is the proper tool)")
    plan.items = _with_extras(plan.items, family)
    return plan


def _plan_ptq1(source: Ptq1Dir, family, specs, outtype: str, allow_lossy: bool) -> _Plan:
    plan = _Plan(strict=True)
    for spec in specs:
        tier = source.tier_of(spec.hf_name)
        if tier is not None:
            stored = tier.gguf_type
            if outtype == "auto" or (outtype in TERNARY_OUTTYPES and not tier.ternary):
                t = tier.gguf_type
            else:
                t = outtype
            load = _packed_loader(source, spec)
        else:
            load = _spec_loader(source, spec)
            stored = _PLAIN_TYPES.get(source.ckpt.dtype(spec.hf_name), "f32")
            if spec.role in F32_ROLES or len(spec.shape) == 1:
                t = "f32"
            elif outtype == "auto" or outtype in TERNARY_OUTTYPES:
                t = stored
            else:
                t = outtype
        if not fits_block(t, spec.shape[-1]):
            plan.fell_back_block.append(f"{spec.gguf_name} ({t} block does not divide "
                                        f"{spec.shape[-1]})")
            t = "f16"
        exact = not allow_lossy and needs_verification(stored, t)
        plan.items.append(PlannedTensor(spec.gguf_name, spec.gguf_shape, t, load, exact,
                                        spec.role))
        rec = source.records.get(spec.hf_name)
        if rec is not None:
            metrics = {k: getattr(rec, k) for k in ("cosine", "rel_err", "loss_delta")
                       if getattr(rec, k) is not None}
            if metrics:
                plan.sensitivity[spec.gguf_name] = metrics
            if rec.fallback_reason:
                plan.fallback.append(fallback_entry(spec.gguf_name, t, rec.fallback_reason,
                                                    metrics))
    plan.items = _with_extras(plan.items, family)
    return plan


def _bonsai_keys(source, plan: _Plan, linear_params: dict[str, int]) -> list[MetaKV]:
    ternary = {t: n for t, n in linear_params.items() if type_info(t).ternary}
    if isinstance(source, Ptq1Dir):
        b = source.bonsai
        qc = source.quant_config
        scheme = str(b.get("scheme", "ptq1_0"))
        group = int(b.get("group_size") or (TIERS[scheme].group if scheme in TIERS else 128))
        return bonsai_metadata(scheme, group, str(b.get("activation_mode", "int8_per_token")),
                               plan.fallback, plan.sensitivity, qc.get("calibration"))
    if not ternary:
        return []
    scheme = max(ternary, key=ternary.get)
    return bonsai_metadata(scheme, type_info(scheme).block_size, "int8_per_token", plan.fallback,
                           plan.sensitivity)


def _report(log, out: Path, plan: _Plan, linear_params: dict[str, int]) -> None:
    if plan.fell_back_block:
        log(f"{len(plan.fell_back_block)} tensor(s) stored as F16 because their rows do not fit "
            "the type's block: " + ", ".join(plan.fell_back_block))
    types = ", ".join(f"{t.upper()}: {n:,} params" for t, n in sorted(linear_params.items()))
    log(f"wrote {out} ({len(plan.items)} tensors; linear weights {types}; "
        f"{out.stat().st_size / 2**20:.1f} MiB)")

