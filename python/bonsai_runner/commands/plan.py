"""Plan memory before loading: the budget per device, the largest context that fits, and the
decode-speed ceiling that memory bandwidth allows.

Input is a GGUF file (planned with the types it holds), a Hugging Face directory or config.json
with a scheme (the quantizer's PTQ1_0 default policy, --target-bpw B, or --outtype TYPE), or
--preset 27b (SPEC's reference model: llama, 60 layers, hidden 5120, vocab 32000, 40 heads of 128
over 8 KV heads, FFN 24576 - 26.75 B parameters). CPU figures use the engine's own allocation
formulas; GPU figures are the CUDA backend's allocations plus a runtime allowance.
--ctx-size is the context of EACH sequence, as in `bonsai serve` and `bonsai_run --parallel`:
the KV cache holds ctx-size x parallel cells.

examples:
  bonsai plan model.gguf --ctx-size 8192
  bonsai plan ./Llama-3.1-8B --target-bpw 2.5 --ctx-size 32768 --cache-type-k q8_0 --json
  bonsai plan --preset 27b --n-gpu-layers 99 --memory 24GiB --bandwidth 1008GB/s --ctx-size 16384

worked example - the 27B (default policy: 11.6 GiB of weights, 3.68 bpw over the linear layers)
on a 24 GB, 1008 GB/s card, all layers on the GPU (GPU total, largest context, decode ceiling):
  $ bonsai plan --preset 27b -ngl 99 --memory 24GB --bandwidth 1008GB/s -c 16384 -ctk f16 -ctv f16
     KV    ctx    KV cache    GPU total   largest ctx   ceiling
     f16   8192    1.88 GiB   14.01 GiB      44627      70.3 t/s
     f16   16384   3.75 GiB   15.89 GiB      44627      61.6 t/s
     q8_0  8192    1.00 GiB   13.13 GiB      84001      75.2 t/s
     q8_0  16384   1.99 GiB   14.13 GiB      84001      69.7 t/s
  all-ternary (--outtype ptq1_0, 6.0 GiB) at 16K f16: 10.10 GiB, ceiling 99.4 t/s;
  the CUDA backend keeps no attention-score buffer (online softmax). Full output: docs/plan.md.
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "memory budget per device, largest context that fits, decode-speed ceiling"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="GGUF file, Hugging Face model directory, or config.json")
    p.add_argument("--preset", metavar="NAME", help="a built-in model shape instead of MODEL: 27b")
    scheme = p.add_mutually_exclusive_group()
    scheme.add_argument("--target-bpw", type=float, metavar="B",
                        help="config.json: the quantizer's --target-bpw (average over linear "
                             "layers, scales included)")
    scheme.add_argument("--outtype", metavar="TYPE",
                        help="config.json: the converter's --outtype (f16, q8_0, ptq1_0, ...)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N",
                   help="context of each sequence; the KV cache holds N x --parallel cells (default 4096)")
    p.add_argument("-b", "--batch-size", type=int, default=512, metavar="N",
                   help="tokens per forward chunk (default 512)")
    p.add_argument("-ctk", "--cache-type-k", default="f16", type=str.lower, choices=("f16", "q8_0"))
    p.add_argument("-ctv", "--cache-type-v", default="f16", type=str.lower, choices=("f16", "q8_0"))
    p.add_argument("-np", "--parallel", type=int, default=1, metavar="N",
                   help="sequences decoded together (default 1)")
    p.add_argument("-t", "--threads", type=int, default=0, metavar="N",
                   help="CPU threads (default 0 = all cores; sizes the attention scratch)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, metavar="N",
                   help="the first N blocks on the GPU (-1 or >= the block count: all, with the head)")
    p.add_argument("-fa", "--flash-attn", action="store_true",
                   help="GPU estimate without the attention score matrix")
    p.add_argument("--memory", metavar="SIZE",
                   help="budget of the GPU (with -ngl) or of RAM, e.g. 24GiB, 24GB")
    p.add_argument("--bandwidth", metavar="RATE",
                   help="memory bandwidth of that device, e.g. 1008GB/s (decode ceiling)")
    p.add_argument("--cpu-bandwidth", metavar="RATE",
                   help="RAM bandwidth for the CPU blocks when layers are split")
    p.add_argument("--gpu-overhead", default="512MiB", metavar="SIZE",
                   help="GPU runtime allowance: CUDA context, kernels, workspaces (default 512MiB)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    from ..plan import PlanParams, format_plan, make_plan, parse_bandwidth, parse_size
    from ..plan_model import describe

    d = describe(args.model, args.preset, args.outtype, args.target_bpw)
    p = PlanParams(n_ctx=args.ctx_size * max(args.parallel, 1), n_batch=args.batch_size, n_parallel=args.parallel,
                   n_threads=args.threads, type_k=args.cache_type_k, type_v=args.cache_type_v,
                   n_gpu_layers=args.n_gpu_layers, flash_attn=args.flash_attn,
                   memory=parse_size(args.memory) if args.memory else None,
                   bandwidth=parse_bandwidth(args.bandwidth) if args.bandwidth else None,
                   cpu_bandwidth=(parse_bandwidth(args.cpu_bandwidth, "--cpu-bandwidth")
                                  if args.cpu_bandwidth else None),
                   gpu_overhead=parse_size(args.gpu_overhead, "--gpu-overhead", "mib"))
    plan = make_plan(d, p)
    text = json.dumps(plan, indent=2) + "\n" if args.json else format_plan(plan)
    sys.stdout.write(text)
    return 0
