#!/usr/bin/env python3
"""Paired A/B of one-token decode on our engine: two configurations timed token by token in strict
alternation, so that the load of a shared machine (which moves single benchmark runs by 10-20%)
hits both alike and the per-token ratio stays informative.

Each side is a worker process that loads MODEL (with its own PYTHONPATH, so A and B can be two
builds of the package, and its own --no-mmap / --act-mode), prefills --depth fixed pseudo-random
tokens and then decodes --n-gen tokens one at a time on command; the driver asks A and B for one
token each, in A-B and B-A order on alternate tokens, for --rounds rounds (a round re-prefills).
It prints the CPU, the load average, each side's median / p10 / mean time per token and the median
of the per-token ratios B / A (< 1: B is faster), with its quartiles. With --sequences N each side
holds N sequences (each prefilled with the same --depth tokens) and a step decodes one token of
every sequence in one batch, with the logits of all N, as a server's continuous batching does; the
times are then per step.

    PYTHONPATH=python python3 benchmarks/ab_decode.py MODEL.gguf --a-no-huge-pages
    python3 benchmarks/ab_decode.py MODEL.gguf --a-path /tmp/old/python --b-path python -t 2 --depth 2048
    python3 benchmarks/ab_decode.py MODEL.gguf --a-path /tmp/old/python --b-path python --sequences 2
    PYTHONPATH=python python3 benchmarks/ab_decode.py PTQ1_0.gguf --b-model PQ2_0.gguf   (two files)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import sys, time
import numpy as np
from bonsai_runner import _core
path, threads, depth, n_gen, mmap, act_mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6]
n_seq = int(sys.argv[9])
# huge_pages / repack are passed only when turned off, so an older build (without them) can be side A
off = {k: False for k, flag in (("huge_pages", sys.argv[7]), ("repack", sys.argv[8])) if flag == "0"}
model = _core.Model(path, use_mmap=mmap, **off)
ctx = _core.Context(model, n_ctx=n_seq * (depth + n_gen + 1), n_batch=512, n_threads=threads, act_mode=act_mode,
                    **({"n_seq_max": n_seq} if n_seq > 1 else {}))
rng = np.random.default_rng(0)
n_vocab = model.n_vocab
prompt = rng.integers(0, n_vocab, depth).tolist()
gen = rng.integers(0, n_vocab, n_gen).tolist()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "prefill":
        ctx.clear()
        for s in range(n_seq):
            for i in range(0, depth, 512):
                chunk = prompt[i:i + 512]
                ctx.decode(chunk, seq_ids=[s] * len(chunk), logits="last")
        print("ok", flush=True)
    elif cmd[0] == "tok":
        i = int(cmd[1])
        tokens = [gen[(i + s) % n_gen] for s in range(n_seq)]
        t0 = time.perf_counter()
        if n_seq == 1:
            ctx.decode(tokens, logits="last")
        else:
            ctx.decode(tokens, seq_ids=list(range(n_seq)), logits="all")
        print(time.perf_counter() - t0, flush=True)
    else:
        break
"""


class Worker:
    def __init__(self, name: str, args: argparse.Namespace, pkg: str | None, no_mmap: bool, no_huge_pages: bool,
                 no_repack: bool, model: Path):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        if pkg:
            env["PYTHONPATH"] = str(Path(pkg).resolve())
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(model), str(args.threads), str(args.depth), str(args.n_gen),
             "0" if no_mmap else "1", args.act_mode, "0" if no_huge_pages else "1", "0" if no_repack else "1",
             str(args.sequences)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self.ask(None) != "ready":
            sys.exit(f"ab_decode: worker {name} did not start:\n{self.proc.communicate()[1]}")

    def ask(self, msg: str | None) -> str:
        if msg is not None:
            self.proc.stdin.write(msg + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("model", type=Path, help="GGUF file both sides decode (side A only with --b-model)")
    p.add_argument("--b-model", type=Path,
                   help="another GGUF file for side B, e.g. the same weights in another type (same vocabulary)")
    p.add_argument("--a-path", help="PYTHONPATH of side A (a directory holding bonsai_runner; default: as this process)")
    p.add_argument("--b-path", help="PYTHONPATH of side B (default: as this process)")
    p.add_argument("--a-no-mmap", action="store_true", help="side A reads the model into memory")
    p.add_argument("--b-no-mmap", action="store_true", help="side B reads the model into memory")
    p.add_argument("--a-no-huge-pages", action="store_true",
                   help="side A decodes from the file mapping (no copy of the weights into huge pages)")
    p.add_argument("--b-no-huge-pages", action="store_true", help="side B decodes from the file mapping")
    p.add_argument("--a-no-repack", action="store_true",
                   help="side A copies the weights into huge pages in the file's order (no PTQ1_0 regrouping, "
                        "no Q8_0 row interleaving for the AVX-512 kernels)")
    p.add_argument("--b-no-repack", action="store_true", help="side B copies the weights in the file's order")
    p.add_argument("--act-mode", default="int8", choices=("int8", "float"), help="activations of both sides")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--depth", type=int, default=512, help="prompt tokens before the timed decodes (default 512)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="timed tokens per round (default 128)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--sequences", type=int, default=1,
                   help="sequences decoded together, one token each per step (default 1)")
    args = p.parse_args()
    if args.sequences < 1:
        sys.exit(f"ab_decode: --sequences must be at least 1, got {args.sequences}")
    for m in (args.model, args.b_model or args.model):
        if not m.is_file():
            sys.exit(f"ab_decode: {m} is not a file; pass a GGUF model")
    default_path = os.environ.get("PYTHONPATH")
    a = Worker("A", args, args.a_path or default_path, args.a_no_mmap, args.a_no_huge_pages, args.a_no_repack,
               args.model)
    b = Worker("B", args, args.b_path or default_path, args.b_no_mmap, args.b_no_huge_pages, args.b_no_repack,
               args.b_model or args.model)
    times: dict[str, list[float]] = {"A": [], "B": []}
    ratios, loads = [], []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for w in (a, b):
            w.ask("prefill")
        for i in range(args.n_gen):
            got = {w.name: float(w.ask(f"tok {i}")) for w in ((a, b) if i % 2 == 0 else (b, a))}
            times["A"].append(got["A"])
            times["B"].append(got["B"])
            ratios.append(got["B"] / got["A"])
    a.close()
    b.close()
    unit = "token" if args.sequences == 1 else "step"
    batch = "" if args.sequences == 1 else f", {args.sequences} sequences (one token each) a step"
    print(f"{cpu_name()}, {os.cpu_count()} CPUs; load average {min(loads):.2f}..{max(loads):.2f}; "
          f"{len(ratios)} {unit} pairs at depth {args.depth}..{args.depth + args.n_gen}, {args.threads} threads{batch}")
    for side, path, model, no_mmap, no_hp, no_rp in (
            ("A", args.a_path, args.model, args.a_no_mmap, args.a_no_huge_pages, args.a_no_repack),
            ("B", args.b_path, args.b_model or args.model, args.b_no_mmap, args.b_no_huge_pages, args.b_no_repack)):
        s = sorted(times[side])
        flags = ((", --no-mmap" if no_mmap else "") + (", --no-huge-pages" if no_hp else "") +
                 (", --no-repack" if no_rp else ""))
        print(f"  {side} ({model.name}, {path or 'this PYTHONPATH'}{flags}): median {statistics.median(s) * 1e3:.3f} "
              f"ms/{unit}, p10 {s[len(s) // 10] * 1e3:.3f} ms, mean {statistics.mean(s) * 1e3:.3f} ms")
    q = statistics.quantiles(ratios, n=4)
    print(f"  median of per-{unit} B/A time ratios: {statistics.median(ratios):.4f} (quartiles {q[0]:.4f}, {q[2]:.4f})")


if __name__ == "__main__":
    main()
