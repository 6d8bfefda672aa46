"""Quantize a Hugging Face checkpoint (or a GGUF file) to ternary PTQ1_0 with calibration data.

Writes a PTQ1_0 directory (packed safetensors in compressed-tensors naming + quant_config.json with
the per-tensor table) and, with --outfile, also the GGUF file. Default scheme: q/k/v/o and
gate/up ternary (PTQ1_0, one fp16 scale per 128 weights), down_proj Q8_0, embeddings and head
F16, norms and biases F32. Ternary fitting is activation-aware: exact per-group threshold/scale
under the calibration Hessian, GPTQ error feedback, coordinate descent on the ternary codes,
least-squares scale refit, and optional block reconstruction (--calib-steps: Adam learns the
scales against each block's output). Already-ternary checkpoints are packed losslessly without
calibration. --method rtn is the no-data round-to-nearest baseline.

Examples:
  bonsai quantize --model-dir ./Llama-3-8B --calib-file calib.jsonl --output-dir ./llama-ptq1
  bonsai quantize --model-dir ./qwen --calib-file c.txt --output-dir out --outfile q.gguf \\
      --sensitivity-analysis --threshold 0.98
  bonsai quantize --model-dir ./qwen --output-dir out --target-bpw 2.5
  bonsai quantize --model-dir qwen-q4_k_m.gguf --output-dir out --outfile qwen-ptq1_0.gguf
  bonsai quantize --model-dir ./qwen --outfile qwen-ptq1_0.gguf     # the GGUF only
"""

from __future__ import annotations

import argparse

HELP = "quantize a Hugging Face checkpoint or GGUF file to PTQ1_0 with calibration data"


def _ridge(text: str) -> float | None:
    """--ridge: auto (None) or a non-negative number."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give auto or a number >= 0 (e.g. 0.1)")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-dir", required=True, help="Hugging Face model directory (config.json, "
                   "*.safetensors F16/BF16/F32, tokenizer.json or tokenizer.model), or a GGUF "
                   "file of any type the gguf package dequantizes (F16, Q8_0, Q4_K_M, ...)")
    p.add_argument("--calib-file", default=None, help="calibration text: JSONL with a \"text\" "
                   "field per line, or plain text (blank lines separate samples); default: the "
                   "small built-in mixed set")
    p.add_argument("--output-dir", default=None, help="PTQ1_0 directory to write (optional with "
                   "--outfile: then a temporary directory, removed at the end)")
    p.add_argument("--outfile", default=None, help="also (or only) convert the result to this GGUF file")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward batch")
    p.add_argument("--calib-steps", type=int, default=0,
                   help="block reconstruction: Adam steps per block learning the group scales "
                   "against the float model's block output, early-stopped on held-out "
                   "calibration sequences (0: off; each step runs the block forward and "
                   "backward on --batch-size sequences: ~2.5 s with 4 x 256 tokens of a 0.5B on "
                   "2 CPU cores)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the log-scales in "
                   "the reconstruction")
    p.add_argument("--sensitivity-analysis", action="store_true",
                   help="per-tensor cosine/relative error and per-block held-out loss increase; "
                   "ternary tensors under --threshold fall back to Q8_0")
    p.add_argument("--threshold", type=float, default=0.98,
                   help="cosine similarity under which a tensor falls back to Q8_0")
    p.add_argument("--target-bpw", type=float, default=None,
                   help="promote tensors PTQ1_0 -> Q2_0_4L (four-level Q2_0, 2.25 bpw) -> Q4_0 -> "
                   "Q8_0 (straight to the tier with the best loss drop per bit) until the linear "
                   "layers average this many bits per weight (scales included)")
    p.add_argument("--target-gain", choices=("fisher", "relative", "output"), default="fisher",
                   help="how --target-bpw ranks promotions (loss drop per extra bit): fisher (default) "
                   "= the predicted KL divergence from the float model (each layer's per-channel "
                   "output error weighted by the float model's output-channel Fisher, one extra "
                   "backward pass; on Qwen2.5-0.5B at 3.74 bpw PPL ratio 1.25 vs 1.58 for "
                   "relative); relative = every layer's relative output error counts the same; "
                   "output = the absolute output error")
    p.add_argument("--group-size", type=int, default=128,
                   help="weights per ternary scale: 128 (PTQ1_0) or 64 (Q2_0)")
    p.add_argument("--max-samples", type=int, default=128, help="calibration sequences to use")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per calibration sequence")
    p.add_argument("--seed", type=int, default=0, help="seed (sequence choice, refinement)")
    from ..quantize.policy import DEFAULT_EMBED_TYPE, EMBED_TYPES, PLAIN_TYPES, QUANT_TIERS

    p.add_argument("--policy", default=None, help="per-pattern types: \"pattern=type,...\" or a "
                   f"JSON file {{pattern: type}}; types {' '.join(QUANT_TIERS + PLAIN_TYPES)} "
                   "(q2_0: ternary, group 64; q2_0_4l: the same Q2_0 blocks with four levels)")

    p.add_argument("--embed-type", choices=EMBED_TYPES, default=DEFAULT_EMBED_TYPE,
                   help="type of the token embedding and output head (default q8_0: half the "
                        "bytes of f16, the largest read of a decoded token; on Qwen2.5-Coder-0.5B "
                        "at --target-bpw 3.973 it moved the PPL ratio 1.1464 -> 1.1475 and "
                        "shrank the file 695 -> 451 MiB: see the README)")
    p.add_argument("--damp", type=float, default=0.01,
                   help="GPTQ damping of the inverse Hessian, as a fraction of its mean diagonal")
    p.add_argument("--ridge", default="auto", type=_ridge,
                   help="ridge of each layer's objective (output error + RIDGE x mean Hessian "
                   "diagonal x the squared weight change), as a fraction of the mean Hessian "
                   "diagonal: keeps GPTQ, the scale refit and coordinate descent from fitting the "
                   "noise of a small calibration set; auto (default) = 2 x input width / "
                   "calibration tokens, between --damp and 1 (e.g. 1 for a 4864-wide down_proj on "
                   "12 x 256 tokens, 0.027 for an 896-wide layer on 128 x 512); 0 = off")
    p.add_argument("--method", choices=("gptq", "rtn"), default="gptq",
                   help="gptq: the calibrated fit (default); rtn: plain round-to-nearest ternary "
                   "(absmean threshold, no calibration data), the baseline to compare against")
    p.add_argument("--refine-target", choices=("float", "block"), default="float",
                   help="what --calib-steps refines each block toward: the float model's hidden "
                   "states (float, default) or the float block on the quantized inputs (block)")
    p.add_argument("--float-target", action="store_true",
                   help="fit each ternary layer to the float model's layer outputs (cross-"
                   "covariance of the float and quantized streams) instead of the float weights "
                   "on the quantized stream; on Qwen2.5-0.5B: same PPL, more same-top tokens "
                   "(31.7%% vs 29.5%%) but a higher mean KL (2.53 vs 2.42), so off by default")
    p.add_argument("--equalize", action="store_true",
                   help="activation-aware channel scaling before the ternary fit (AWQ-style, "
                   "exact folds into the norms / v rows; on Qwen2.5-0.5B it changed layer errors "
                   "by ~0.1%% but raised the mean KL from 2.42 to 2.65: off by default)")
    p.add_argument("--rotate", default="auto", metavar="auto|none|hadamard[:B]",
                   help="fold the prism.hadamard rotation (random signs + blockwise Walsh-Hadamard, "
                   "signs from --seed) into every decoder linear before quantizing: Hessians, GPTQ "
                   "and the tier estimates see the rotated activations, and the file carries the "
                   "prism.hadamard keys the engine (and PrismML's fork) rotates with; B: a power of "
                   "two, default the largest up to 1024 dividing every input width. auto (the default): "
                   "hadamard where it applies (not qwen35, --equalize, --method rtn or already-ternary "
                   "weights); "
                   "on Qwen2.5-0.5B it cut the PPL ratio from 12.8 to 3.4")
    p.add_argument("--device", default="auto",
                   help="torch device of the quantizer: auto (CUDA when available), cpu, cuda, "
                        "cuda:N")
    p.add_argument("--forward-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="precision of the calibration forwards (the quantized weights, the "
                   "Hessian sums and GPTQ stay float32): auto = bfloat16 where the device "
                   "multiplies it natively (CUDA Ampere or newer; x86 CPUs with AVX512_BF16 or "
                   "AMX), else float32")
    p.add_argument("--force", action="store_true", help="replace existing outputs")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from ..errors import BonsaiError
    from ..quantize import QuantizeOptions, quantize_model

    if not args.output_dir and not args.outfile:
        raise BonsaiError("nothing to write: give --output-dir (the PTQ1_0 directory), --outfile "
                          "(the GGUF file), or both")
    opts = QuantizeOptions(
        model_dir=args.model_dir, output_dir=args.output_dir, calib_file=args.calib_file,
        outfile=args.outfile, batch_size=args.batch_size, calib_steps=args.calib_steps,
        lr=args.lr, sensitivity=args.sensitivity_analysis, threshold=args.threshold,
        target_bpw=args.target_bpw, target_gain=args.target_gain, group_size=args.group_size,
        max_samples=args.max_samples,
        seq_len=args.seq_len, seed=args.seed, policy=args.policy, embed_type=args.embed_type,
        damp=args.damp, ridge=args.ridge, method=args.method,
        equalize=args.equalize, refine_target=args.refine_target,
        float_target=args.float_target, force=args.force, progress=not args.no_progress,
        device=args.device, forward_dtype=args.forward_dtype, rotate=args.rotate)
    result = quantize_model(opts)
    if result["output_dir"]:
        print(result["output_dir"])
    if result.get("outfile"):
        print(result["outfile"])
    return 0
