"""Show what a GGUF model file holds.

Prints the architecture summary, every metadata key (long arrays summarized), the tensor table
(name, type, shape, bytes), totals per tensor type, bits per weight over the linear layers and
over the whole file (scales included), the fallback layer table of files quantized by
bonsai-runner, and a warning for tensor types the engine cannot run.

examples:
  bonsai inspect model.gguf
  bonsai inspect model.gguf --no-tensors
  bonsai inspect model.gguf --json > report.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HELP = "show a GGUF file's metadata, tensor types, size breakdown and fallback table"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="GGUF model file")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--tensors", action=argparse.BooleanOptionalAction, default=True,
                   help="list every tensor (default: yes)")
    p.add_argument("--no-mmap", action="store_true",
                   help="read the file into memory instead of mapping it")


def run(args: argparse.Namespace) -> int:
    from ..inspect import format_report, inspect_file

    report = inspect_file(args.file, use_mmap=not args.no_mmap)
    if args.json:
        if not args.tensors:
            report.pop("tensors")
        text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    else:
        text = format_report(report, tensors=args.tensors)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `bonsai inspect model.gguf | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
