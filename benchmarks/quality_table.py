#!/usr/bin/env python3
"""The quantizer's quality table (issues #4, #17): RTN vs PTQ1_0 at several budgets, against the F16 model.

Rows (same model, same calibration set, same evaluation text; --rows picks some, in order)
    rtn        `bonsai quantize --method rtn` (round-to-nearest ternary, no data)
    rtn-rot    the same with `--rotate hadamard`
    gptq       the default policy (ternary q/k/v/o/gate/up, down_proj Q8_0) with `--rotate none`
    default    the default policy as it runs by default (GPTQ on the Hadamard-rotated model)
    bpwB       `--target-bpw B` (rotated; B any number, e.g. bpw2.1, bpw4.2)
    reconB     `--target-bpw B --calib-steps N` (block reconstruction, N = --recon-steps)
    match      `--target-bpw B` at each llama.cpp row's own measured linear bpw B (with --llama-cpp)
    none       no row of ours (with --llama-cpp: llama.cpp's rows alone)
--llama-cpp TYPES adds upstream llama.cpp's own quantizations of the same F16 with an importance
matrix of the same calibration tokens (llama_cpp_quants.py: its tools are built from the
llama-cpp-python 0.3.36 sdist's llama.cpp into --llama-cpp-build, once), measured by its own
llama-perplexity on the same text and chunks, first (the match rows need their bpw); their time
column is imatrix + quantize.
--text code scores a second text of another domain instead of the built-in one (mostly prose):
standard-library Python source that the calibration set does not draw from (eval_texts.py).
--keep leaves our quantized files in --work, and --reuse measures a row whose file and record are
there without quantizing again (e.g. the same rows on the second text).
Columns: bits per weight over the linear layers and over the whole file (scales included, from
quant_config.json), PPL on the built-in evaluation text (or --file), PPL ratio to the F16
reference, mean KL-divergence and same-top-token share against the reference's saved
distributions, quantization wall time and peak RSS of the quantizer.

Measurement: every quantizer run is a child process started by a small launcher that reports the
child's own ru_maxrss (wait4); launching it straight from this script would report this script's
high-water mark instead (ru_maxrss carries the parent's over fork/exec). Perplexity runs in this
process through bonsai_runner.eval (the engine's INT8-activation path, as `bonsai perplexity`).
The F16 reference defaults to the file `bonsai demo` (and scripts/fetch) keeps in the cache,
~/.cache/bonsai-runner/qwen2.5-coder-0.5b-instruct-f16.gguf; the quantizer input defaults to it
too (quantizing from the Q4_K_M source instead gives the same values up to F16 rounding).

    python benchmarks/quality_table.py --quick             # 16 x 256 calibration tokens
    python benchmarks/quality_table.py                     # full: 128 x 512 (the issue's setting)
    python benchmarks/quality_table.py --rows rtn,default --max-samples 12 --seq-len 256
    python benchmarks/quality_table.py --rows none --llama-cpp IQ1_M,Q2_K --max-samples 12 --seq-len 256
    python benchmarks/quality_table.py --rows default,bpw2.1,match --llama-cpp --max-samples 12 \
        --seq-len 256 --chunks 8 --work w --keep        # then the same with --text code --reuse

This is a benchmark, not a test: it prints a Markdown table (and writes it to --out when given).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = {
    "rtn": ("RTN g128 (no calibration)", ["--method", "rtn"]),
    "rtn-rot": ("RTN g128 + Hadamard rotation", ["--method", "rtn", "--rotate", "hadamard"]),
    "gptq": ("PTQ1_0 default policy, GPTQ, no rotation", ["--rotate", "none"]),
    "default": ("PTQ1_0 default policy (GPTQ + rotation)", []),
}


def row_spec(name: str, recon_steps: int) -> tuple[str, list[str]]:
    """(label, quantizer arguments) of a row name: a ROWS key, bpwB or reconB."""
    if name in ROWS:
        return ROWS[name]
    for prefix in ("bpw", "recon"):
        if name.startswith(prefix):
            try:
                b = float(name[len(prefix):])
            except ValueError:
                break
            if prefix == "bpw":
                return f"PTQ1_0 --target-bpw {b:g}", ["--target-bpw", f"{b:g}"]
            return (f"PTQ1_0 --target-bpw {b:g} --calib-steps {recon_steps}",
                    ["--target-bpw", f"{b:g}", "--calib-steps", str(recon_steps)])
    raise ValueError(name)


LAUNCHER = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:]); "
            "_, st, ru = os.wait4(p.pid, 0); print('PEAK_RSS_KB', ru.ru_maxrss, flush=True); "
            "sys.exit(os.waitstatus_to_exitcode(st))")


def _default_reference() -> Path:
    from bonsai_runner.assets import REAL_MODEL_STEM, default_cache_dir

    return default_cache_dir() / f"{REAL_MODEL_STEM}-f16.gguf"


def _ensure_reference(path: Path) -> Path:
    if path.is_file():
        return path
    from bonsai_runner.assets import fetch_real_model
    from bonsai_runner.convert import convert

    src = fetch_real_model(progress=True)
    print(f"converting {src} to the F16 reference {path}", file=sys.stderr)
    convert(str(src), str(path), "f16", allow_lossy=True, progress=False)
    return path


def quantize_row(source: Path, out_dir: Path, extra: list[str], args, log_path: Path) -> dict:
    """Runs the quantizer in a measured child; returns wall time, peak RSS and the bpw summary,
    also kept in <out_dir>.json; with --reuse, a row whose GGUF and record exist is not run."""
    gguf = out_dir.parent / f"{out_dir.name}.gguf"     # not with_suffix: "bpw3.973" has a dot
    record = out_dir.parent / f"{out_dir.name}.json"
    if args.reuse and gguf.is_file() and record.is_file():
        rec = json.loads(record.read_text(encoding="utf-8"))
        if rec.get("args") == extra and rec.get("calibration") == [args.max_samples, args.seq_len]:
            return {**rec, "gguf": gguf, "reused": True}
    cmd = [sys.executable, "-c", LAUNCHER, "nice", "-n", str(args.nice), sys.executable, "-m",
           "bonsai_runner", "quantize", "--model-dir", str(source), "--output-dir",
           str(out_dir), "--outfile", str(gguf), "--force", "--no-progress", *extra]
    if "--method" not in extra:
        cmd += ["--max-samples", str(args.max_samples), "--seq-len", str(args.seq_len)]
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"quantizer failed ({p.returncode}); see {log_path}")
    peak = [int(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("PEAK_RSS_KB")]
    qc = json.loads((out_dir / "quant_config.json").read_text(encoding="utf-8"))
    rec = {"wall_s": wall, "peak_rss_mib": peak[-1] / 1024.0, "args": extra,
           "calibration": [args.max_samples, args.seq_len],
           "bpw_linear": qc["summary"]["bpw_linear"], "bpw_file": qc["summary"]["bpw_file"]}
    record.write_text(json.dumps(rec), encoding="utf-8")
    return {**rec, "gguf": gguf}


def format_rows(results: list[dict]) -> list[str]:
    """The Markdown table of the rows; a row's "time_text" / "rss_text" replace the minutes / MiB."""
    lines = ["| quantization | linear bpw | file bpw | PPL | PPL ratio | mean KLD | same top % "
             "| quant time | peak RSS |",
             "|---|---|---|---|---|---|---|---|---|"]
    for q in results:
        took = q.get("time_text") or f"{q['wall_s'] / 60:.1f} min"
        peak = q.get("rss_text") or f"{q['peak_rss_mib']:.0f} MiB"
        lines.append(f"| {q['label']} | {q['bpw_linear']:.3f} | {q['bpw_file']:.3f} | "
                     f"{q['ppl']:.2f} | {q['ratio']:.2f} | {q['kld']:.4f} | {q['same']:.1f} | "
                     f"{took} | {peak} |")
    return lines


def main(argv=None) -> int:
    import llama_cpp_quants  # imports this module (LAUNCHER) in turn, so not at the top

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", type=Path, default=None,
                    help="F16 reference GGUF (default: the demo's cached F16 of the real model)")
    ap.add_argument("--source", type=Path, default=None,
                    help="quantizer input (GGUF file or HF directory; default: --reference)")
    ap.add_argument("--rows", default="rtn,gptq,default,bpw2.1,bpw2.5,bpw4,bpw4.2",
                    help="comma-separated rows: rtn, rtn-rot, gptq, default, bpwB, reconB, match "
                    "(see the top of this file), or none")
    ap.add_argument("--recon-steps", type=int, default=40,
                    help="--calib-steps of the reconB rows")
    ap.add_argument("--max-samples", type=int, default=128, help="calibration sequences")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per calibration sequence")
    ap.add_argument("--quick", action="store_true", help="16 x 256 calibration (a fast table)")
    ap.add_argument("--file", default=None, help="evaluation text (default: the built-in one)")
    ap.add_argument("--text", choices=("builtin", "code"), default="builtin",
                    help="code: score standard-library Python source the calibration set does "
                    "not draw from (eval_texts.py) instead of the built-in text")
    ap.add_argument("--keep", action="store_true", help="keep our quantized files in --work")
    ap.add_argument("--reuse", action="store_true", help="a row whose file and record are in "
                    "--work (from --keep) is measured without quantizing again")
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--nice", type=int, default=10, help="niceness of the quantizer runs")
    ap.add_argument("--work", type=Path, default=None, help="directory for the outputs "
                    "(default: a temporary one, removed at the end)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument("--llama-cpp", nargs="?", const=",".join(llama_cpp_quants.DEFAULT_TYPES),
                    default=None, metavar="TYPES", help="append llama.cpp's own quantizations "
                    "(imatrix from the same calibration tokens) of these llama-quantize types "
                    f"(default when given bare: {','.join(llama_cpp_quants.DEFAULT_TYPES)})")
    llama_cpp_quants.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.max_samples, args.seq_len = 16, 256
    rows = [r.strip() for r in args.rows.split(",") if r.strip() and r.strip() != "none"]
    lc_types = [t.strip() for t in (args.llama_cpp or "").split(",") if t.strip()]
    if not rows and not lc_types:
        ap.error("--rows none leaves nothing to measure; add --llama-cpp TYPES")
    if "match" in rows and not lc_types:
        ap.error("--rows match needs --llama-cpp (its rows' bpw are the budgets)")
    if (args.keep or args.reuse) and args.work is None:
        ap.error("--keep / --reuse need --work DIR")
    if args.text != "builtin" and args.file:
        ap.error("give --file or --text, not both")
    for r in rows:
        try:
            r == "match" or row_spec(r, args.recon_steps)
        except ValueError:
            ap.error(f"unknown row {r!r}; known: {', '.join(ROWS)}, bpwB, reconB, match")
    from bonsai_runner.eval.perplexity import PerplexityOptions, run_perplexity

    ref = _ensure_reference(args.reference or _default_reference())
    source = args.source or ref
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="bonsai-quality-")
        work = Path(tmp.name)
    else:
        work = args.work
        work.mkdir(parents=True, exist_ok=True)
    quiet = (lambda s: None)
    say = (lambda s: print(s, file=sys.stderr, flush=True))
    if args.text == "code":
        from eval_texts import write_code_text

        args.file = str(write_code_text(work / "eval-code.txt"))
    logits = work / "reference.logits"
    say(f"reference run: {ref} ({args.chunks} chunks x {args.ctx_size} tokens)")
    base = run_perplexity(PerplexityOptions(model=str(ref), file=args.file, ctx_size=args.ctx_size,
                                            chunks=args.chunks, threads=args.threads,
                                            save_logits=str(logits)), quiet, quiet)
    notes, lc_rows = [], []
    if lc_types:
        args.seed = 0  # the quantizer's default --seed: the same calibration sequences
        try:
            lc_rows, facts = llama_cpp_quants.measure(lc_types, ref, work / "llama.cpp", args)
            notes = [""] + llama_cpp_quants.describe(facts, base.ppl, lc_rows)
        except llama_cpp_quants.LlamaCppUnavailable as e:
            say(f"llama.cpp rows skipped: {e}")
            notes = ["", f"llama.cpp rows skipped: {e}"]
    todo = []
    for r in rows:
        if r != "match":
            todo.append((r, *row_spec(r, args.recon_steps)))
            continue
        for lc in lc_rows:
            b = math.floor(lc["bpw_linear"] * 1e4) / 1e4    # never above llama.cpp's file
            todo.append((f"bpw{b:g}", f"PTQ1_0 --target-bpw {b:g} (at llama.cpp {lc['type']}'s)",
                         ["--target-bpw", f"{b:g}"]))
    results = []
    for r, label, extra in todo:
        say(f"quantizing: {label} ({' '.join(extra) or 'defaults'}; calibration "
            f"{args.max_samples} x {args.seq_len}) ...")
        q = quantize_row(source, work / r, extra, args, work / f"{r}.log")
        took = "reused" if q.get("reused") else f"{q['wall_s']:.0f} s"
        say(f"  {took}, peak RSS {q['peak_rss_mib']:.0f} MiB; measuring ...")
        res = run_perplexity(PerplexityOptions(model=str(q["gguf"]), file=args.file,
                                               threads=args.threads,
                                               kl_divergence=str(logits)), quiet, quiet)
        q.update(label=label, ppl=res.ppl, ratio=res.ppl / base.ppl,
                 kld=float(res.kl.kld.mean()), same=100.0 * float(res.kl.same_top.mean()))
        say(f"  {label}: linear bpw {q['bpw_linear']:.3f}, PPL {q['ppl']:.4f} (ratio "
            f"{q['ratio']:.4f}), mean KLD {q['kld']:.4f}, same top {q['same']:.1f}%")
        results.append(q)
        if not args.keep:
            os.unlink(q["gguf"])
    results = sorted(results + lc_rows, key=lambda q: q["bpw_linear"])
    calib = ("none" if rows == ["rtn"] and not lc_types else
             f"{args.max_samples} x {args.seq_len} tokens")
    lines = [f"Model: {source} vs F16 reference {ref.name}; eval: {args.file or 'built-in text'}, "
             f"Python {platform.python_version()}, "
             f"{base.n_chunks} x {base.n_ctx} tokens (F16 PPL {base.ppl:.4f}); calibration "
             f"{calib}; load at the end {os.getloadavg()[0]:.1f}",
             "", *format_rows(results), *notes]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
