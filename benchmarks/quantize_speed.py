"""Quantizer speed (issue #16): one 27B-shaped layer, and the torch pipeline against the numpy one.

(a) `layer`: one Qwen3.5-27B-shaped decoder layer (hidden 5120, FFN 17408, gated attention with
    24 query heads / 4 KV heads of 256, or a Gated DeltaNet layer with --kind gdn), random
    weights, run through transformers' own layer code (quantize/hf_layers.py) the way the
    pipeline runs a block: per stage (linears sharing an input) one forward of the calibration
    tokens to accumulate the Hessian, GPTQ + refit per linear (down_proj at Q8_0 by the reference
    rounding, as the default policy), then one forward to the next layer's input; forwards in
    --forward-dtype (auto, as the pipeline). The pipeline's mixer shortcut (the FFN stage and
    the last forward reuse o_proj's / out_proj's cached inputs) is not modelled: here those
    re-run the attention / delta rule, so the forward figures are an upper bound. Prints the
    time per stage and the total extrapolated to a 64-layer model. With fewer calibration
    sequences than the default 128 (--samples; the shared 2-core CPU cannot forward 65,536
    tokens through a 27B layer in minutes), the token-proportional stages (forwards, Hessians)
    are ALSO printed scaled to 128 x 512, labelled as such; GPTQ does not depend on the tokens.
(b) `compare`: the previous numpy pipeline (a `git worktree` of --old-rev made in a temporary
    directory, or an existing checkout given by --old-src) and this one on the same GGUF model
    with the same calibration, in one run: the time ratio, and both results' mean KLD against
    the F16 model on the built-in evaluation text (bonsai perplexity's method).

    python benchmarks/quantize_speed.py layer --device cpu --samples 4
    python benchmarks/quantize_speed.py layer --kind gdn --device cuda
    python benchmarks/quantize_speed.py compare --model ~/.cache/bonsai-runner/qwen2.5-coder-0.5b-instruct-f16.gguf \\
        --max-samples 32 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

QWEN35_27B = dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=4,
                  num_attention_heads=24, num_key_value_heads=4, head_dim=256, vocab_size=1024,
                  linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                  linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4)


def bench_layer(args) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "python"))
    from bonsai_runner.quantize.gptq import prepare_hessian, quantize_layer, reference_codes
    from bonsai_runner.quantize.hf_layers import (HfLayers, linear_inputs, resolve_device,
                                                  resolve_forward_dtype)

    dev = resolve_device(args.device)
    cfg = dict(QWEN35_27B, model_type="qwen3_5_text")
    fdt = resolve_forward_dtype(args.forward_dtype, dev)
    hl = HfLayers(cfg, dev, forward_dtype=fdt)
    i = 3 if args.kind == "attention" else 0              # layer 3: full attention; 0: GDN
    gen = torch.Generator().manual_seed(0)
    params = {}
    for name, p in hl.layers[i].named_parameters():
        fan_in = p.shape[-1] if p.ndim >= 2 else 1
        t = torch.randn(tuple(p.shape), generator=gen) / fan_in ** 0.5 if p.ndim >= 2 else \
            torch.zeros(tuple(p.shape)) if name.endswith("norm.weight") and "linear_attn" not in name \
            else torch.ones(tuple(p.shape)) * 0.1
        params[name] = t.to(dev)
    n, T = args.samples, args.seq_len
    x = torch.randn(n, T, cfg["hidden_size"], generator=gen)          # host, as in the pipeline
    stages = linear_inputs(hl, i, params, x[:1, :16].to(dev))
    quantized = [m for st in stages for m in st
                 if not m.endswith(("in_proj_a", "in_proj_b"))]     # GDN a/b stay float
    sec = {"hessian": 0.0, "gptq": 0.0, "forward": 0.0}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for st in stages:
            todo = [m for m in st if m in quantized]
            if not todo:
                continue
            t0 = time.perf_counter()
            if not todo[0].endswith("down_proj"):
                H, cnt = None, 0
                for b in range(0, n, args.batch_size):
                    got = []
                    hl.forward(i, params, x[b:b + args.batch_size].to(dev),
                               lambda name, a: got.append(a) if name == todo[0] else None, todo[0])
                    a = got[0]
                    H = a.T @ a if H is None else H.addmm_(a.T, a)
                    cnt += a.shape[0]
                H *= 2.0 / cnt
            prep = None               # H's GPTQ preparation, shared by the stage's layers
            sync()
            sec["hessian"] += time.perf_counter() - t0
            for m in todo:
                t0 = time.perf_counter()
                w = params[m + ".weight"]
                if m.endswith("down_proj"):
                    codes, scales = reference_codes(w, "q8_0")
                else:
                    if prep is None:      # timed with GPTQ: it does not grow with the tokens
                        prep = prepare_hessian(H)
                    res = quantize_layer(w, H, "ptq1_0", prep=prep)
                    codes, scales = res.codes, res.scales
                sync()
                dt = time.perf_counter() - t0
                sec["gptq"] += dt
                print(f"  {m:<28} {tuple(w.shape)}  {dt:7.1f} s", flush=True)
        t0 = time.perf_counter()
        for b in range(0, n, args.batch_size):
            hl.forward(i, params, x[b:b + args.batch_size].to(dev))
        sync()
        sec["forward"] = time.perf_counter() - t0
    total = sum(sec.values())
    scale = 128 * 512 / (n * T)
    at_default = sec["gptq"] + (sec["hessian"] + sec["forward"]) * scale
    out = {"device": str(dev), "kind": args.kind, "samples": n, "seq_len": T,
           "forward_dtype": str(fdt).removeprefix("torch."),
           "seconds": {k: round(v, 2) for k, v in sec.items()}, "layer_seconds": round(total, 2),
           "layer_seconds_at_128x512": round(at_default, 2),
           "model_64_layers_hours_at_128x512": round(64 * at_default / 3600, 2),
           "torch_threads": torch.get_num_threads()}
    print(f"27B-shaped {args.kind} layer on {dev} (forwards in {out['forward_dtype']}), "
          f"{n} x {T} tokens: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in sec.items()) + f"; layer {total:.1f} s")
    if scale != 1:
        print(f"scaled to 128 x 512 tokens (forwards and Hessians x {scale:.0f}, GPTQ as "
              f"measured): {at_default:.0f} s per layer")
    print(f"64-layer model: {64 * at_default / 3600:.2f} h at 128 x 512 (extrapolated from one layer)")
    return out


def _quantize_cmd(src: Path, model: str, out: Path, args) -> list[str]:
    return [sys.executable, "-m", "bonsai_runner", "quantize", "--model-dir", model,
            "--output-dir", str(out / "ptq1"), "--outfile", str(out / "q.gguf"),
            "--max-samples", str(args.max_samples), "--seq-len", str(args.seq_len),
            "--seed", "0", "--no-progress", "--force"]


def _timed(cmd, env, log) -> dict:
    """Wall seconds, the child's CPU seconds (user + system: less sensitive than the wall time to
    other load on a shared machine) and the 1-minute load average before and after."""
    import resource

    load0 = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed; see {log}")
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"seconds": wall, "cpu_seconds": cpu, "load_before": load0,
            "load_after": os.getloadavg()[0]}


def _kld(src: Path, env, f16: str, q: Path, work: Path) -> float:
    """Mean KLD of q against the F16 model on the built-in evaluation text (this checkout's
    bonsai perplexity, the same for both models)."""
    ref = work / "ref.bin"
    if not ref.exists():
        subprocess.run([sys.executable, "-m", "bonsai_runner", "perplexity", "--model", f16,
                        "--save-logits", str(ref)], env=env, check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "bonsai_runner", "perplexity", "--model", str(q),
                        "--kl-divergence", str(ref)], env=env, check=True,
                       capture_output=True, text=True)
    line = next(ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("Mean    KLD:"))
    return float(line.split(":")[1].split()[0])


def compare(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="qspeed-"))
    old_src = Path(args.old_src) if args.old_src else None
    if old_src is None:
        old_src = work / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_src),
                        args.old_rev], check=True, capture_output=True)
        core = next((ROOT / "python" / "bonsai_runner").glob("_core*.so"), None)
        if core is None:
            raise SystemExit("build this checkout first (scripts/dev_build.sh): the old "
                             "pipeline borrows its _core module (the engine is unchanged)")
        os.symlink(core, old_src / "python" / "bonsai_runner" / core.name)
    threads = {}
    if args.threads:
        threads = {k: str(args.threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                  "MKL_NUM_THREADS")}
    try:
        res = {}
        for tag, src in (("numpy", old_src), ("torch", ROOT)):
            env = dict(os.environ, PYTHONPATH=str(src / "python"), **threads)
            out = work / tag
            out.mkdir()
            res[tag] = _timed(_quantize_cmd(src, args.model, out, args), env, out / "log.txt")
            res[tag]["log"] = str(out / "log.txt")
            print(f"{tag}: {res[tag]['seconds']:.0f} s wall, {res[tag]['cpu_seconds']:.0f} s CPU "
                  f"(load average {res[tag]['load_before']:.1f} -> {res[tag]['load_after']:.1f})",
                  flush=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        if not args.no_kld:
            for tag in res:
                res[tag]["kld_mean"] = _kld(ROOT, env, args.model, work / tag / "q.gguf", work)
        ratio = res["numpy"]["seconds"] / res["torch"]["seconds"]
        cpu_ratio = res["numpy"]["cpu_seconds"] / res["torch"]["cpu_seconds"]
        print(f"{args.max_samples} x {args.seq_len} calibration tokens, "
              f"{args.threads or 'default'} thread(s): numpy {res['numpy']['seconds']:.0f} s, "
              f"torch {res['torch']['seconds']:.0f} s: torch is {ratio:.2f}x faster "
              f"({cpu_ratio:.2f}x in CPU time)")
        for tag in res:
            t = next((ln for ln in Path(res[tag]["log"]).read_text().splitlines()
                      if ln.startswith("time on ")), None)
            if t:
                print(f"{tag} stages: {t}")
        if not args.no_kld:
            print(f"mean KLD vs F16: numpy {res['numpy']['kld_mean']:.4f}, torch "
                  f"{res['torch']['kld_mean']:.4f}")
        res["ratio"] = ratio
        res["cpu_ratio"] = cpu_ratio
        return res
    finally:
        if not args.old_src:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(old_src)], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("layer")
    a.add_argument("--kind", choices=("attention", "gdn"), default="attention")
    a.add_argument("--device", default="cpu")
    a.add_argument("--samples", type=int, default=128)
    a.add_argument("--seq-len", type=int, default=512)
    a.add_argument("--batch-size", type=int, default=8)
    a.add_argument("--forward-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="the calibration forwards' precision, as bonsai quantize's option")
    b = sub.add_parser("compare")
    b.add_argument("--model", required=True, help="GGUF (F16) model, also the KLD reference")
    b.add_argument("--old-rev", default="7770337")
    b.add_argument("--old-src", default=None, help="an existing checkout of the old pipeline")
    b.add_argument("--max-samples", type=int, default=128)
    b.add_argument("--seq-len", type=int, default=512)
    b.add_argument("--no-kld", action="store_true")
    b.add_argument("--threads", type=int, default=None,
                   help="OMP/OpenBLAS/MKL threads of both pipelines (default: theirs)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    res = bench_layer(args) if args.cmd == "layer" else compare(args)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
