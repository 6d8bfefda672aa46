#!/usr/bin/env python3
"""Quantize a Hugging Face checkpoint to a PTQ1_0 directory (and optionally a GGUF file).

Same program as `bonsai quantize` / `bonsai-quantize`; run with --help for the options
(--model-dir --calib-file --output-dir --outfile --calib-steps --lr --sensitivity-analysis
--threshold --target-bpw --group-size --max-samples --seq-len --seed ...).
"""

import sys

from bonsai_runner.cli import quantize_main

if __name__ == "__main__":
    sys.exit(quantize_main())
