#!/usr/bin/env python3
"""Held-out study of the layer objective's ridge (gptq.with_ridge, `bonsai quantize --ridge`).

One decoder block of the real model (rotated as the quantizer rotates it by default, inputs from
the float blocks before it): each chosen linear is quantized from the Hessian of TRAIN calibration
sequences with each ridge, and its relative output error is measured on the train Hessian and on
the Hessian of 12 other sequences (held out). With few tokens against a layer's input width the
undamped objective fits the calibration set's noise: the train error falls while the held-out
error rises.

    python benchmarks/ridge_study.py --block 3 --train 12 --layers down,gate,o --tiers ptq1_0,q4_0

This is a study, not a test: it prints one line per (layer, tier, ridge).
"""

from __future__ import annotations

import argparse
import platform
import sys

HELD_OUT = 12


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="F16 GGUF (default: the demo's cached F16)")
    ap.add_argument("--block", type=int, default=3)
    ap.add_argument("--train", type=int, default=12, help="training calibration sequences")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--layers", default="down,gate,o", help="q,k,v,o,gate,up,down")
    ap.add_argument("--tiers", default="ptq1_0", help="ptq1_0,q2_0,q4_0,q8_0")
    ap.add_argument("--ridges", default="0,0.03,0.1,0.3,1")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from bonsai_runner.quantize.calibration import load_calibration
    from bonsai_runner.quantize.gptq import ErrorMeter, quantize_layer, with_ridge
    from bonsai_runner.quantize.hf_layers import INPUT_OF
    from bonsai_runner.quantize.pipeline import QuantizeOptions, Quantizer

    model = args.model
    if model is None:
        from bonsai_runner.assets import REAL_MODEL_STEM, default_cache_dir

        model = str(default_cache_dir() / f"{REAL_MODEL_STEM}-f16.gguf")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        q = Quantizer(QuantizeOptions(model_dir=model, output_dir=tmp, force=True,
                                      progress=False), log=lambda s: None)
        n = args.train
        cal = load_calibration(None, q.tokenizer, args.seq_len, n + HELD_OUT, 0, q.hp.n_vocab)
        emb = torch.from_numpy(q.loader.read("model.embed_tokens.weight"))
        x = emb[torch.from_numpy(cal.tokens.astype(np.int64))]
        print(f"# {model}, block {args.block}, {n} x {args.seq_len} train tokens, {HELD_OUT} "
              f"held-out sequences; Python {platform.python_version()}, {platform.processor()}")
        for j in range(args.block + 1):
            w = q._block_weights(j, q.device)
            if j == args.block:
                for key in args.layers.split(","):
                    h_train = q.blocks.hessian(j, w, x[:n], INPUT_OF[key])
                    h_test = q.blocks.hessian(j, w, x[n:], INPUT_OF[key])
                    for tier in args.tiers.split(","):
                        for r in (float(v) for v in args.ridges.split(",")):
                            res = quantize_layer(w[key], with_ridge(h_train, r), tier)
                            qq = res.dequantize()
                            print(f"{key:5} {tier:7} ridge {r:<5g} train "
                                  f"{ErrorMeter(w[key], h_train)(qq):.4f} held-out "
                                  f"{ErrorMeter(w[key], h_test)(qq):.4f}", flush=True)
            x = q.blocks.forward(j, w, x)
    return 0


if __name__ == "__main__":
    sys.exit(main())
