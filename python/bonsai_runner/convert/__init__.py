"""Converters to the single-file GGUF format: Hugging Face / PTQ1_0 directories and GGUF files.

`convert(src, outfile, outtype)` picks the converter from what `src` is:
- a directory whose config.json has a `quantization_config` -> a PTQ1_0 directory (ptq1_dir.py),
  converted exactly, tier by tier (hf_to_gguf.py);
- any other directory -> a Hugging Face checkpoint, float or already ternary (hf_to_gguf.py);
- a .gguf file -> re-typed (gguf_to_gguf.py).
Modules: safetensors_file / hf_reader (reading), arch/ (model families), tokenizer_meta, ternary,
tensor_codec, ptq1_pack / ptq1_dir (the PTQ1_0 directory format), plan (typing and writing),
bonsai_meta, gguf_out.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import BonsaiError
from .outtypes import OUTTYPES, OUTTYPE_HELP


def source_kind(src: str | Path) -> str:
    """"ptq1", "hf" or "gguf"; a BonsaiError when `src` is none of them."""
    p = Path(src)
    if p.is_dir():
        from .ptq1_dir import is_quantized_dir

        return "ptq1" if is_quantized_dir(p) else "hf"
    if p.is_file():
        with open(p, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF":
            return "gguf"
        raise BonsaiError(f"{p}: not a GGUF file (bad magic {magic!r}) and not a model directory")
    raise BonsaiError(f"{p}: no such file or directory")


def convert(src: str | Path, outfile: str | Path, outtype: str = "auto", *,
            allow_lossy: bool = False, force: bool = False, pre_tokenizer: str | None = None,
            model_name: str | None = None, progress: bool = True, log=None,
            hadamard: int | None = None, hadamard_seed: int = 0,
            embed_type: str | None = None) -> Path:
    """Converts `src` (HF directory, PTQ1_0 directory or GGUF file) to the GGUF file `outfile`.

    `embed_type` (f32, f16, bf16, q8_0) is the type of token_embd and output.weight whatever
    `outtype` gives the other tensors.

    `hadamard` = B folds the prism.hadamard rotation (convert/hadamard_fold.py); a directory is
    first converted exactly to a temporary F32 GGUF next to `outfile`, then rotated and typed."""
    kw = {"allow_lossy": allow_lossy, "force": force, "model_name": model_name,
          "progress": progress}
    if log is not None:
        kw["log"] = log
    rot = {"hadamard": hadamard, "hadamard_seed": hadamard_seed} if hadamard else {}
    if hadamard:
        from .hadamard_fold import check_block

        check_block(hadamard)
    if source_kind(src) == "gguf":
        if pre_tokenizer:
            raise BonsaiError("--pre-tokenizer applies to Hugging Face directories, not to GGUF "
                              "input (its tokenizer metadata is carried over)")
        from .gguf_to_gguf import convert_gguf

        return convert_gguf(src, outfile, outtype, **kw, **rot, embed_type=embed_type)
    from .hf_to_gguf import convert_hf

    if not hadamard:
        return convert_hf(src, outfile, outtype, pre_tokenizer=pre_tokenizer, **kw,
                          embed_type=embed_type)
    from .gguf_to_gguf import convert_gguf
    from .gguf_out import check_outfile

    out = check_outfile(outfile, force, [Path(src)])
    tmp = out.with_name(f".{out.name}.unrotated-f32.gguf")
    try:
        convert_hf(src, tmp, "f32", pre_tokenizer=pre_tokenizer, **{**kw, "force": True})
        # token_embd / output take F16 as convert_hf gives them (F32 only when asked for); a float
        # out type rounds the unfolded float32 tensors (qwen35's ssm_alpha/beta) as a direct
        # conversion does, so only quantized out types need --allow-lossy
        final = "f16" if outtype == "auto" else outtype
        kw_final = {**kw, "allow_lossy": allow_lossy or final in ("f32", "f16", "bf16")}
        return convert_gguf(tmp, out, final, **kw_final, **rot,
                            embd_type="f32" if outtype == "f32" else "f16", embed_type=embed_type)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["convert", "source_kind", "OUTTYPES", "OUTTYPE_HELP"]
