#!/usr/bin/env python3
"""Convert a Hugging Face model directory (or a PTQ1_0 directory, or a GGUF file) to GGUF.

Follows llama.cpp's convert_hf_to_gguf.py conventions: positional model directory, --outfile,
--outtype. Same program as `bonsai convert`; run with --help for the types.
"""

import sys

from bonsai_runner.cli import convert_main

if __name__ == "__main__":
    sys.exit(convert_main())
