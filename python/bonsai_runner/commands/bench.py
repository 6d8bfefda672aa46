"""Measure prompt-processing and generation speed in llama-bench's table shape.

Every combination of the comma-separated values of -t, -ctk, -ctv, -b and --act-mode is run for
each model (-m, repeatable), with the tests pp<N> for each -p value (N random tokens decoded as one
batch) and tg<N> for each -n value (N tokens decoded one at a time), -r repetitions each after a
warm-up; t/s is the mean +- standard deviation over the repetitions. Columns for -ctk/-ctv/-b/
--act-mode appear when they differ from the defaults. --bandwidth adds a memory-read probe and a
roofline column: the tokens/s that the measured bandwidth allows for the bytes a generated token
reads (weights + the mean KV rows of the run), and each tg figure as a percentage of it.

examples:
  bonsai bench -m model.gguf
  bonsai bench -m a.gguf -m b.gguf -p 512 -n 128 -t 1,2,4 -r 3
  bonsai bench -m model.gguf -ctk f16,q8_0 -ctv q8_0 -b 64,512 --bandwidth -o csv > bench.csv
"""

from __future__ import annotations

import argparse
import os
import sys

HELP = "prompt / generation tokens per second (llama-bench table), with a bandwidth roofline"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", action="append", default=[], metavar="FILE",
                   help="GGUF model (repeat for several)")
    p.add_argument("-p", "--n-prompt", default="512", metavar="N[,N...]",
                   help="prompt tokens of the pp tests (default 512; 0 skips)")
    p.add_argument("-n", "--n-gen", default="128", metavar="N[,N...]",
                   help="generated tokens of the tg tests (default 128; 0 skips)")
    p.add_argument("-r", "--repetitions", type=int, default=5, metavar="N",
                   help="repetitions of each test (default 5)")
    p.add_argument("-t", "--threads", default=str(os.cpu_count() or 1), metavar="N[,N...]",
                   help=f"thread counts (default {os.cpu_count() or 1})")
    p.add_argument("-ctk", "--cache-type-k", default="f16", metavar="T[,T...]",
                   help="K cache types: f16, q8_0 (default f16)")
    p.add_argument("-ctv", "--cache-type-v", default="f16", metavar="T[,T...]",
                   help="V cache types: f16, q8_0 (default f16)")
    p.add_argument("-b", "--batch-size", default="512", metavar="N[,N...]",
                   help="batch sizes (default 512)")
    p.add_argument("--act-mode", default="int8", metavar="M[,M...]",
                   help="matmul activations: int8 (W1.58A8) or float (default int8)")
    p.add_argument("--bandwidth", action="store_true",
                   help="measure memory-read bandwidth and add the roofline columns")
    p.add_argument("--probe-size", default="256MiB", metavar="SIZE",
                   help="buffer of the bandwidth probe (default 256MiB; larger than the caches)")
    p.add_argument("-o", "--output", default="md", choices=("md", "csv", "json"),
                   help="output format (default md)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the random tokens")
    p.add_argument("--progress", action="store_true", help="print each test on stderr")


def run(args: argparse.Namespace) -> int:
    from ..bench import BenchConfig, format_results, parse_list, run_bench
    from ..plan import parse_size

    def kinds(text, what):
        return parse_list(text.lower(), what, str)

    cfg = BenchConfig(models=args.model, n_prompt=parse_list(args.n_prompt, "-p"),
                      n_gen=parse_list(args.n_gen, "-n"), repetitions=args.repetitions,
                      threads=parse_list(args.threads, "-t"),
                      type_k=kinds(args.cache_type_k, "-ctk"),
                      type_v=kinds(args.cache_type_v, "-ctv"),
                      n_batch=parse_list(args.batch_size, "-b"),
                      act_mode=kinds(args.act_mode, "--act-mode"), bandwidth=args.bandwidth,
                      probe_bytes=parse_size(args.probe_size, "--probe-size", "mib"),
                      seed=args.seed)

    def progress(msg):
        print(msg, file=sys.stderr, flush=True)

    results, probes = run_bench(cfg, progress if args.progress else None)
    sys.stdout.write(format_results(results, probes, args.output))
    return 0
