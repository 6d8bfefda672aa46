"""Convert a model to one GGUF file: a Hugging Face directory (float or already ternary), a PTQ1_0
directory written by `bonsai quantize`, or another GGUF file (re-typed).

Nothing is written until the whole input has been checked (config, every tensor's presence and
shape, tokenizer, exactness of the requested types); the output appears under its name only when
complete.

examples:
  bonsai convert ./Llama-3.2-1B --outfile llama-f16.gguf --outtype f16
  bonsai convert ./Bonsai-8B-unpacked --outfile bonsai.gguf            # ternary -> ptq1_0 (auto)
  bonsai convert ./my-ptq1-dir --outfile model.gguf                    # bonsai quantize output
  bonsai convert model-ptq1_0.gguf --outfile model-q2_0.gguf --outtype q2_0   # for mainline llama.cpp
  bonsai convert model-q8_0.gguf --outfile model-q4_0.gguf --outtype q4_0 --allow-lossy
  bonsai convert model-f16.gguf --outfile rotated-f16.gguf --hadamard 128   # Bonsai 2 rotation
"""

from __future__ import annotations

import argparse

from ..convert import OUTTYPE_HELP, OUTTYPES
from ..convert.outtypes import EMBED_TYPES

HELP = "convert a Hugging Face / PTQ1_0 directory or a GGUF file to one GGUF file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = OUTTYPE_HELP
    p.add_argument("src", metavar="SRC",
                   help="Hugging Face model directory, PTQ1_0 directory, or .gguf file")
    p.add_argument("--outfile", required=True, metavar="OUT.gguf", help="output GGUF file")
    p.add_argument("--outtype", default="auto", type=str.lower, choices=OUTTYPES,
                   metavar="TYPE", help="tensor type of the output (default: auto; see below)")
    p.add_argument("--embed-type", type=str.lower, choices=EMBED_TYPES, metavar="TYPE",
                   help="type of token_embd and output.weight (f32, f16, bf16, q8_0; default: what "
                        "--outtype gives them, f16 for the ternary types)")
    p.add_argument("--allow-lossy", action="store_true",
                   help="allow conversions that change weight values (rounding)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --outfile")
    p.add_argument("--pre-tokenizer", metavar="NAME",
                   help="tokenizer.ggml.pre to write when the BPE split regex is not recognized "
                        "(qwen2, llama-bpe, gpt-2, default)")
    p.add_argument("--model-name", metavar="NAME", help="general.name of the output")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--hadamard", type=int, metavar="B",
                   help="fold a blockwise Walsh-Hadamard rotation of block B (a power of two) into the "
                        "linear weights and token_embd, with prism.hadamard metadata (Bonsai 2 files)")
    p.add_argument("--hadamard-seed", type=int, default=0, metavar="N",
                   help="seed of the rotation's +-1 sign vectors (default 0)")


def run(args: argparse.Namespace) -> int:
    from ..convert import convert

    convert(args.src, args.outfile, args.outtype, allow_lossy=args.allow_lossy, force=args.force,
            pre_tokenizer=args.pre_tokenizer, model_name=args.model_name,
            progress=not args.no_progress, hadamard=args.hadamard, hadamard_seed=args.hadamard_seed,
            embed_type=args.embed_type)
    return 0
