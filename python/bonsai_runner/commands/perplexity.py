"""Perplexity of a model on a text, and KL-divergence against a saved reference run.

The method is llama-perplexity's: the text is cut into chunks of --ctx-size tokens, each run from
an empty cache (first token replaced by BOS when the vocabulary adds one), and only the second half
of each chunk is scored. The running PPL is printed after every chunk as [k]x.xxxx, then
`Final estimate: PPL = x +/- y`. Without --file the built-in evaluation text is used.

KL-divergence against the F16 model takes two runs on the same text:
  bonsai perplexity --model model-f16.gguf --save-logits ref.bin
  bonsai perplexity --model model-ptq1.gguf --kl-divergence ref.bin
The second prints the PPL of both, KL mean/median/percentiles, Δp and the same-top-token share.
The reference holds the full log-probabilities of every scored position (float16 for large
vocabularies: ~76 MiB per 512-token chunk at 152K tokens), so use --chunks on big vocabularies.
"""

from __future__ import annotations

import argparse

HELP = "perplexity on a text (llama-perplexity's method), KL-divergence against a reference run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", required=True, help="GGUF model file")
    p.add_argument("--file", "-f", help="UTF-8 text file (default: the built-in evaluation text)")
    p.add_argument("--ctx-size", "-c", type=int, default=None,
                   help="tokens per chunk (default 512, or the reference's with --kl-divergence)")
    p.add_argument("--chunks", type=int, default=-1, help="chunks to score (default: all)")
    p.add_argument("--batch-size", "-b", type=int, default=512, help="tokens per decode call")
    p.add_argument("--threads", "-t", type=int, default=0, help="CPU threads (default: all)")
    p.add_argument("--act-mode", choices=("int8", "float"), default="int8",
                   help="activations of ternary matmuls: per-token INT8 (default) or float")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--save-logits", metavar="REF", help="save this run as a KL reference")
    g.add_argument("--kl-divergence", metavar="REF", help="KL-divergence against a saved reference")


def run(args: argparse.Namespace) -> int:
    from ..eval.perplexity import PerplexityOptions, run_perplexity

    run_perplexity(PerplexityOptions(
        model=args.model, file=args.file, ctx_size=args.ctx_size, chunks=args.chunks,
        batch_size=args.batch_size, threads=args.threads, act_mode=args.act_mode,
        save_logits=args.save_logits, kl_divergence=args.kl_divergence))
    return 0
