"""Run a fixed prompt suite on models side by side and write a readable report.

The suite (bonsai_runner/data/prompts.json, or --suite FILE in the same shape) covers code,
Chinese Q&A, summary, math reasoning and instruction following. Every model answers every prompt
greedily with the same seed and token limit, with its own chat template; the answers go side by
side into a Markdown report (printed, or written to --out) and, with --html, an HTML page next to it.

example:
  bonsai eval-prompts --models qwen-f16.gguf qwen-ptq1.gguf --out report.md --html
"""

from __future__ import annotations

import argparse

HELP = "a fixed prompt suite run greedily on two models, side by side (Markdown / HTML report)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", required=True, metavar="GGUF", help="models to compare")
    p.add_argument("--out", "-o", help="write the Markdown report here (default: print it)")
    p.add_argument("--html", action="store_true", help="also write an HTML report (--out .html)")
    p.add_argument("--suite", help="a prompt suite JSON file (default: the built-in suite)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--ctx-size", "-c", type=int, default=2048, help="context per model (2048)")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: all)")


def run(args: argparse.Namespace) -> int:
    from ..eval.prompts import run_eval_prompts

    md = run_eval_prompts(args.models, out=args.out, write_html=args.html, suite=args.suite,
                          seed=args.seed, n_ctx=args.ctx_size, threads=args.threads)
    if not args.out:
        print(md, end="")
    return 0
