"""Compare a quantized model against its F16 reference and apply the quality gates.

Runs `bonsai perplexity` on both models over the same chunks (the reference's log-probabilities
kept in a temporary file), prints the PPL of each, their ratio, the mean KL-divergence and the
share of positions where both pick the same top token, then the verdict:
FAIL (exit status 2) when the PPL ratio is above --max-ppl-ratio (1.5) or the degradation (top
token differs from the reference) is above --max-degradation (40%), with the tensors to promote
ranked from the candidate's sensitivity metadata; PASS (exit status 0) otherwise.

example:
  bonsai compare --reference qwen-f16.gguf --candidate qwen-ptq1.gguf --chunks 4
"""

from __future__ import annotations

import argparse

HELP = "PPL / KL of a quantized model against its F16 reference, quality gates, layers to promote"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reference", required=True, help="the F16 (or BF16/F32) GGUF model")
    p.add_argument("--candidate", required=True, help="the quantized GGUF model")
    p.add_argument("--file", "-f", help="UTF-8 text file (default: the built-in evaluation text)")
    p.add_argument("--ctx-size", "-c", type=int, default=None, help="tokens per chunk (512)")
    p.add_argument("--chunks", type=int, default=-1, help="chunks to score (default: all)")
    p.add_argument("--batch-size", "-b", type=int, default=512, help="tokens per decode call")
    p.add_argument("--threads", "-t", type=int, default=0, help="CPU threads (default: all)")
    p.add_argument("--act-mode", choices=("int8", "float"), default="int8",
                   help="activations of ternary matmuls (default int8)")
    p.add_argument("--max-ppl-ratio", type=float, default=1.5, help="gate: PPL ratio (1.5)")
    p.add_argument("--max-degradation", type=float, default=0.40,
                   help="gate: share of positions whose top token changed (0.40)")


def run(args: argparse.Namespace) -> int:
    from ..eval.compare import run_compare

    res = run_compare(args.reference, args.candidate, file=args.file, ctx_size=args.ctx_size,
                      chunks=args.chunks, batch_size=args.batch_size, threads=args.threads,
                      act_mode=args.act_mode, max_ppl_ratio=args.max_ppl_ratio,
                      max_degradation=args.max_degradation)
    return 0 if res.passed else 2
