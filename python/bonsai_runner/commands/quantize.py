"""Quantize a Hugging Face checkpoint to ternary PTQ1_0 with calibration data.

Not available yet in this version: the calibrated quantizer (activation-aware ternary fitting,
sensitivity analysis, fallback layer table) is being built. Until it lands, this command refuses
to run rather than produce a model of unknown quality. To pack checkpoints whose weights are
already ternary, or to round-trip types, use `bonsai convert`.
"""

from __future__ import annotations

import argparse
import sys

HELP = "quantize a checkpoint to PTQ1_0 (not yet available in this version)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    print("error: `bonsai quantize` is not yet available in this version of bonsai-runner: the "
          "calibrated PTQ1_0 quantizer has not landed. Use `bonsai convert SRC --outtype ptq1_0` "
          "for checkpoints whose weights are already ternary.", file=sys.stderr)
    return 2
