#!/usr/bin/env python3
"""Does the engine give the quality the quantizer predicted? (issue #17: within 2%.)

The quantizer's own estimate is the held-out loss of --sensitivity-analysis: its torch forward of
the quantized weights (float activations, the rotation folded in) on the held-out calibration
sequences (quantize/sensitivity.py). This script quantizes a model with --sensitivity-analysis
(and --threshold 0.01, so that no tensor falls back and the file is the one the other flags
ask for), recomputes the same held-out token ids, and runs the written GGUF in the engine on them
with float activations and with the default per-token INT8 activations (W1.58A8):

    estimate  = exp(loss_quantized)        engine = exp(mean NLL of the engine, same tokens)

The float-activation ratio says whether the file runs what the quantizer measured (converter,
rotation metadata, kernels); the INT8 one adds what the engine's activation quantization costs
(issue #17 item 4: a finer activation grouping pays only if this is a large share of the loss).
The F16 reference is scored the same way (exp(loss_fp) vs the engine on the F16 file).

    python benchmarks/engine_vs_quantizer.py                         # default policy, 12 x 256
    python benchmarks/engine_vs_quantizer.py --args "--target-bpw 4.5"

A benchmark, not a test (tests/test_quantize_rotate.py checks the same on a tiny model).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, default=None, help="quantizer input and F16 reference "
                    "(default: the demo's cached F16 GGUF of the real model)")
    ap.add_argument("--args", default="", help="more `bonsai quantize` arguments, one string")
    ap.add_argument("--max-samples", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--held-out", type=int, default=4, help="held-out sequences (at most a "
                    "quarter of --max-samples)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="keep the outputs here")
    args = ap.parse_args(argv)

    from bonsai_runner.eval.perplexity import sequence_nll
    from bonsai_runner.quantize.calibration import Tokenizer, load_calibration
    from bonsai_runner.quantize.gguf_input import GgufCheckpoint, is_gguf_file
    from bonsai_runner.quantize.sensitivity import held_out_split

    if args.source is None:
        from bonsai_runner.assets import REAL_MODEL_STEM, default_cache_dir

        args.source = default_cache_dir() / f"{REAL_MODEL_STEM}-f16.gguf"
    if not args.source.exists():
        raise SystemExit(f"{args.source} not found: run `bonsai demo` once (it caches the F16 "
                         "reference) or give --source")
    tmp = tempfile.TemporaryDirectory(prefix="bonsai-e-vs-q-") if args.work is None else None
    work = Path(tmp.name) if tmp else args.work
    work.mkdir(parents=True, exist_ok=True)
    qdir, gguf = work / "q", work / "q.gguf"
    extra = shlex.split(args.args)
    cmd = [sys.executable, "-m", "bonsai_runner", "quantize", "--model-dir", str(args.source),
           "--output-dir", str(qdir), "--outfile", str(gguf), "--force", "--no-progress",
           "--sensitivity-analysis", "--threshold", "0.01", "--max-samples",
           str(args.max_samples), "--seq-len", str(args.seq_len), *extra]
    print("quantizing:", " ".join(cmd[3:]), file=sys.stderr, flush=True)
    log = work / "quantize.log"
    with open(log, "w", encoding="utf-8") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"quantizer failed; see {log}")
    qc = json.loads((qdir / "quant_config.json").read_text(encoding="utf-8"))
    sens = qc["calibration"]["sensitivity"]
    seed = next((int(extra[i + 1]) for i, a in enumerate(extra[:-1]) if a == "--seed"), 0)
    if is_gguf_file(str(args.source)):
        ck = GgufCheckpoint(str(args.source))
        tok_dir, n_vocab = ck.tokenizer_dir, int(ck.config["vocab_size"])
    else:
        tok_dir = args.source
        n_vocab = int(json.loads((args.source / "config.json").read_text())["vocab_size"])
    cal = load_calibration(None, Tokenizer(tok_dir), args.seq_len, args.max_samples, seed, n_vocab)
    _, held = held_out_split(cal.tokens, args.held_out)
    if held.size != sens["held_out_tokens"]:
        raise SystemExit(f"recomputed {held.size} held-out tokens, the quantizer reports "
                         f"{sens['held_out_tokens']}: give the same --max-samples/--seq-len/--seed")
    rows = []
    for label, path, loss in (("quantized", gguf, sens["loss_quantized"]),
                              ("F16 reference", args.source, sens["loss_fp"])):
        est = math.exp(loss)
        for mode in ("float", "int8"):
            ppl = math.exp(sequence_nll(str(path), held, mode, args.threads))
            rows.append(f"| {label} | {mode} | {est:.4f} | {ppl:.4f} | {100 * (ppl / est - 1):+.2f}% |")
    s = qc["summary"]
    print(f"{args.source.name}, quantize {' '.join(extra) or '(defaults)'}; linear bpw "
          f"{s['bpw_linear']:.3f}; {held.shape[0]} held-out sequences x {held.shape[1]} tokens\n")
    print("| model | engine activations | quantizer's estimate (PPL) | engine PPL | engine vs estimate |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
