#!/usr/bin/env python3
"""Upstream llama.cpp's own low-bit quantizations of the F16 reference (issue #17's peer rows).

For each llama-quantize type (default IQ1_M, IQ2_XXS, IQ2_M, Q2_K, Q3_K_M) made from the F16 GGUF
with an importance matrix of the calibration tokens our quantizer uses: linear and whole-file
bpw, PPL on the evaluation text and its ratio to the F16's, mean KLD and same-top share against
the F16, imatrix + quantize wall time and peak RSS; below the table, llama.cpp's F16 PPL next to
bonsai_runner.eval's, the calibration facts and each file's tensor types. How:
1. llama-quantize, llama-imatrix and llama-perplexity of the llama.cpp vendored in the
   llama-cpp-python 0.3.36 sdist (`pip download --no-binary :all:`), built with CMake + Ninja
   (Release, static, -DGGML_NATIVE=ON; no tests, examples, server, OpenSSL) once into
   --llama-cpp-build, reused while the three binaries exist;
2. imatrix: the quantizer's calibration sequences (load_calibration with the tokenizer the
   quantizer rebuilds from the GGUF, same --max-samples / --seq-len / --seed) decoded to text for
   `llama-imatrix -c seq_len`. Text cannot give every token back: the quantizer encodes its
   samples one by one, so where one ends in "." and the next starts "User", the text re-encodes
   to ".User". Each sequence's text is padded with digits (one token each) to exactly seq_len
   tokens, so each llama.cpp chunk is one calibration sequence (_fit_chunk). Printed: the token
   counts (ours, our tokenizer's re-encoding, llama.cpp's from `llama-perplexity --ppl-stride`),
   the chunks equal to their sequence and the calibration tokens that recur in order;
3. `llama-quantize --imatrix` per type; it and llama-imatrix run as the measured child of
   quality_table.LAUNCHER (peak RSS = the tool's own ru_maxrss, from wait4);
4. sizes from the GGUF (gguf package): linear bpw over 2-D tensors but token_embd and output
   (convert/ptq1_dir.summarize's rule), file bpw over all tensors;
5. `llama-perplexity -c CTX --chunks N` on the evaluation text: the F16 once with
   --kl-divergence-base, each file with --kl-divergence against its logits (PPL, ratio, KLD and
   same-top share are llama.cpp's, against llama.cpp's own F16 run).
-nr (no run-time weight repacking, which dies with SIGILL on some Intel hosts) goes to imatrix and
perplexity; llama-quantize does not repack. A failing step raises LlamaCppUnavailable with the
tool's last lines; the logs stay in the work directory. A benchmark, not a test:

    python benchmarks/llama_cpp_quants.py --max-samples 12 --seq-len 256 --chunks 8
    python benchmarks/quality_table.py --rows none --llama-cpp IQ1_M,Q2_K --chunks 8
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality_table import LAUNCHER, format_rows  # noqa: E402

SDIST = ("llama-cpp-python", "0.3.36")
DEFAULT_TYPES = ("IQ1_M", "IQ2_XXS", "IQ2_M", "Q2_K", "Q3_K_M")
TARGETS = ("llama-quantize", "llama-imatrix", "llama-perplexity")
# LLAMA_CURL is not passed: this tree replaced curl with cpp-httplib (LLAMA_OPENSSL) and ignores it.
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
               "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF"]
NO_REPACK = "-nr"


class LlamaCppUnavailable(Exception):
    """A step (fetch, build, a tool run, parsing its output) failed; the message says which."""


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def default_build_dir() -> Path:
    from bonsai_runner.assets import default_cache_dir

    return default_cache_dir() / f"llama.cpp-{SDIST[1]}"


def _run(cmd: list, what: str, log_path: Path, timeout: int = 7200) -> str:
    """Runs cmd with stdout+stderr into log_path; returns that text, or raises with its tail."""
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            r = subprocess.run([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                               timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LlamaCppUnavailable(f"{what} failed: {e}") from None
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if r.returncode != 0:
        tail = "\n    ".join(text.strip().splitlines()[-8:])
        raise LlamaCppUnavailable(f"{what} failed (exit {r.returncode}; log {log_path}):"
                                  f"\n    {tail}")
    return text


def run_measured(cmd: list, what: str, log_path: Path, nice: int) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB of the tool itself) of cmd run under LAUNCHER."""
    t0 = time.perf_counter()
    text = _run([sys.executable, "-c", LAUNCHER, "nice", "-n", str(nice), *cmd], what, log_path)
    wall = time.perf_counter() - t0
    peak = [int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("PEAK_RSS_KB")]
    return wall, (peak[-1] / 1024.0 if peak else float("nan"))


# ----- 1. the tools -----

def source_tree(root: Path) -> Path:
    """vendor/llama.cpp of the extracted sdist under root, downloading and extracting it once."""
    top = root / "src" / f"llama_cpp_python-{SDIST[1]}"
    tree = top / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    dl = root / "sdist"
    dl.mkdir(parents=True, exist_ok=True)
    say(f"downloading the {SDIST[0]} {SDIST[1]} sdist into {dl} (pip download) ...")
    _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
          "--no-build-isolation", f"{SDIST[0]}=={SDIST[1]}", "-d", dl], "pip download",
         root / "pip-download.log", 1800)
    archives = sorted(dl.glob(f"llama_cpp_python-{SDIST[1]}.tar.gz"))
    if not archives:
        raise LlamaCppUnavailable(f"pip download left no llama_cpp_python-{SDIST[1]}.tar.gz "
                                  f"in {dl}")
    say(f"extracting {archives[0].name} ...")
    shutil.rmtree(top, ignore_errors=True)
    with tarfile.open(archives[0]) as tf:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(root / "src", **kw)
    if not (tree / "CMakeLists.txt").is_file():
        raise LlamaCppUnavailable(f"the sdist has no vendor/llama.cpp/CMakeLists.txt under {top}")
    return tree


def build_tools(root: Path, jobs: int, nice: int = 10) -> dict[str, Path]:
    """The three tools, built from the sdist's llama.cpp into root/build unless already there."""
    bindir = root / "build" / "bin"
    tools = {t: bindir / t for t in TARGETS}
    if all(p.is_file() for p in tools.values()):
        say(f"llama.cpp tools: reusing {bindir}")
        return tools
    for exe in ("cmake", "ninja"):
        if shutil.which(exe) is None:
            raise LlamaCppUnavailable(f"building llama.cpp needs {exe} on PATH")
    root.mkdir(parents=True, exist_ok=True)
    tree = source_tree(root)
    build = root / "build"
    say(f"configuring {tree} -> {build}: {' '.join(CMAKE_FLAGS)}")
    _run(["cmake", "-S", tree, "-B", build, "-G", "Ninja", *CMAKE_FLAGS], "cmake configure",
         root / "cmake-configure.log", 900)
    say(f"building {', '.join(TARGETS)} with {jobs} jobs (nice {nice}; several minutes; log "
        f"{root / 'cmake-build.log'}) ...")
    t0 = time.perf_counter()
    _run(["nice", "-n", str(nice), "cmake", "--build", build, "-j", str(jobs), "--target",
          *TARGETS], "cmake build", root / "cmake-build.log", 7200)
    missing = [t for t, p in tools.items() if not p.is_file()]
    if missing:
        raise LlamaCppUnavailable(f"the build did not produce {', '.join(missing)} in {bindir}")
    say(f"built in {time.perf_counter() - t0:.0f} s")
    return tools


# ----- 2. the importance matrix from the quantizer's calibration tokens -----

def _fit_chunk(hf, seq, seq_len: int) -> tuple[str, int, int]:
    """(text, tokens of seq kept, filler digits): seq decoded to text that re-encodes to exactly
    seq_len tokens, the tokens lost to merges made up with digits at the end (a pre-tokenizer that
    splits every digit off, as Qwen2's, makes each one token). Where that does not come out at
    seq_len tokens, tokens are dropped from the end of seq until it does."""
    for keep in range(len(seq), 0, -1):
        text = hf.decode(seq[:keep].tolist(), skip_special_tokens=False)
        pad = seq_len - len(hf.encode(text).ids)
        # trailing spaces give one up to a digit ("   " + "0" -> "  ", " ", "0"): check the sum
        if pad >= 0 and len(hf.encode(text + "0" * pad).ids) == seq_len:
            return text + "0" * pad, keep, pad
    raise LlamaCppUnavailable("a calibration sequence does not decode to re-encodable text")


def calibration_text(model: Path, max_samples: int, seq_len: int, seed: int) -> tuple[str, dict]:
    """The quantizer's calibration sequences for `model` as one text of n_seq chunks of seq_len
    tokens (see _fit_chunk), and facts on how far its tokens are from the calibration tokens."""
    import numpy as np
    from tokenizers import Tokenizer as HfTokenizer

    from bonsai_runner.quantize.calibration import Tokenizer, load_calibration
    from bonsai_runner.quantize.gguf_input import GgufCheckpoint

    ckpt = GgufCheckpoint(model)
    try:
        n_vocab = int(ckpt.config["vocab_size"])
        cal = load_calibration(None, Tokenizer(ckpt.tokenizer_dir), seq_len, max_samples, seed,
                               n_vocab)
        hf_path = ckpt.tokenizer_dir / "tokenizer.json"
        if not hf_path.is_file():
            raise LlamaCppUnavailable(f"{model}: not a byte-level BPE tokenizer; decoding the "
                                      "calibration tokens back to text needs tokenizer.json")
        hf = HfTokenizer.from_file(str(hf_path))
    finally:
        ckpt.close()
    fits = [list(_fit_chunk(hf, seq, seq_len)) for seq in cal.tokens]
    # A join of two chunks can still merge (one ending in "." before one starting with "User",
    # no filler between them): drop that sequence's last token and refit, until the join holds.
    for i in range(len(fits) - 1):
        while (hf.encode(fits[i][0] + fits[i + 1][0]).ids
               != hf.encode(fits[i][0]).ids + hf.encode(fits[i + 1][0]).ids):
            fits[i] = list(_fit_chunk(hf, cal.tokens[i][:fits[i][1] - 1], seq_len))
    chunks = [f[0] for f in fits]
    cut = sum(seq_len - f[1] for f in fits)
    pad = sum(f[2] for f in fits)
    text = "".join(chunks)
    again = np.asarray(hf.encode(text).ids, dtype=np.int64).reshape(-1)
    exact = matched = 0
    for i, seq in enumerate(cal.tokens):
        got = again[i * seq_len:(i + 1) * seq_len]
        exact += int(np.array_equal(got, seq))
        sm = difflib.SequenceMatcher(None, seq.tolist(), got.tolist(), autojunk=False)
        matched += sum(b.size for b in sm.get_matching_blocks())
    added = {a.content for a in hf.get_added_tokens_decoder().values()}
    special = sorted({int(t) for t in np.unique(cal.tokens) if hf.id_to_token(int(t)) in added})
    return text, {"n_seq": int(cal.tokens.shape[0]), "seq_len": seq_len,
                  "tokens": int(cal.tokens.size), "reencoded": int(again.size),
                  "chunks_exact": exact, "matched": matched, "dropped": cut, "digits": pad,
                  "special_ids": special, "replacement_chars": text.count("\ufffd")}


def llama_token_count(tools: dict, model: Path, text_file: Path, threads: int, work: Path) -> int:
    """How many tokens llama.cpp makes of text_file (one short strided-perplexity chunk)."""
    out = _run([tools["llama-perplexity"], "-m", model, "-f", text_file, "-c", "64", "-b", "64",
                "--ppl-stride", "32", "--chunks", "1", "-t", threads, NO_REPACK],
               "llama-perplexity (token count)", work / "token-count.log", 1800)
    m = re.search(r"have (\d+) tokens", out)
    if not m:
        raise LlamaCppUnavailable("llama-perplexity printed no 'have N tokens' "
                                  f"({work / 'token-count.log'})")
    return int(m.group(1))


def make_imatrix(tools: dict, model: Path, work: Path, args) -> dict:
    """imatrix.gguf from the calibration tokens; the token-count facts, wall time and peak RSS."""
    text, facts = calibration_text(model, args.max_samples, args.seq_len, args.seed)
    calib = work / "calibration.txt"
    calib.write_text(text, encoding="utf-8")
    facts["llama_cpp"] = llama_token_count(tools, model, calib, args.threads, work)
    for line in calibration_lines(facts):
        say(line)
    out = work / "imatrix.gguf"
    wall, peak = run_measured(
        [tools["llama-imatrix"], "-m", model, "-f", calib, "-o", out, "-c", args.seq_len,
         "--parse-special", "--no-ppl", "-t", args.threads, NO_REPACK],
        "llama-imatrix", work / "imatrix.log", args.nice)
    say(f"imatrix: {wall:.0f} s, peak RSS {peak:.0f} MiB")
    return {**facts, "wall_s": wall, "peak_rss_mib": peak, "path": out}


# ----- 3.-5. quantize, sizes, perplexity -----

def gguf_summary(path: Path) -> dict:
    """Linear / file bpw (tensor bytes over elements), the tensor count per type, and per role
    of the 2-D tensors ("ffn_down", "token_embd", ...) the count per type."""
    from gguf import GGUFReader

    lin, tot = [0, 0], [0, 0]
    mix: dict[str, int] = {}
    roles: dict[str, dict[str, int]] = {}
    for t in GGUFReader(str(path)).tensors:
        n, bits, kind = int(t.n_elements), 8 * int(t.n_bytes), t.tensor_type.name
        tot[0], tot[1] = tot[0] + bits, tot[1] + n
        if len(t.shape) == 2 and t.name not in ("token_embd.weight", "output.weight"):
            lin[0], lin[1] = lin[0] + bits, lin[1] + n
        mix[kind] = mix.get(kind, 0) + 1
        if len(t.shape) == 2:
            role = roles.setdefault(t.name.split(".")[-2 if t.name.startswith("blk.") else 0], {})
            role[kind] = role.get(kind, 0) + 1
    return {"bpw_linear": lin[0] / max(lin[1], 1), "bpw_file": tot[0] / max(tot[1], 1),
            "mix": dict(sorted(mix.items(), key=lambda kv: -kv[1])), "roles": roles}


def _number(pattern: str, text: str, what: str, log: Path) -> float:
    m = re.search(pattern, text)
    if not m:
        raise LlamaCppUnavailable(f"llama-perplexity printed no {what} (see {log})")
    return float(m.group(1))


def perplexity_base(tools: dict, model: Path, work: Path, args) -> float:
    """llama.cpp's PPL of the F16; saves its logits to work/base.kld for the KLD runs."""
    from bonsai_runner.eval.perplexity import default_eval_file

    log = work / "perplexity-f16.log"
    text = _run([tools["llama-perplexity"], "-m", model, "-f", args.file or default_eval_file(),
                 "-c", args.ctx_size, "--chunks", args.chunks, "--kl-divergence-base",
                 work / "base.kld", "-t", args.threads, NO_REPACK], "llama-perplexity (F16)", log)
    return _number(r"Final estimate: PPL = ([\d.]+)", text, "final PPL estimate", log)


def perplexity_kld(tools: dict, model: Path, work: Path, args, name: str) -> dict:
    log = work / f"perplexity-{name}.log"
    text = _run([tools["llama-perplexity"], "-m", model, "-c", args.ctx_size,
                 "--kl-divergence-base", work / "base.kld", "--kl-divergence", "-t", args.threads,
                 NO_REPACK], f"llama-perplexity ({name})", log)
    return {"ppl": _number(r"Mean PPL\(Q\)\s*:\s*([\d.]+)", text, "Mean PPL(Q)", log),
            "ratio": _number(r"Mean PPL\(Q\)/PPL\(base\)\s*:\s*([\d.]+)", text, "PPL ratio", log),
            "kld": _number(r"Mean\s+KLD:\s*([\d.]+)", text, "Mean KLD", log),
            "same": _number(r"Same top p:\s*([\d.]+)", text, "Same top p", log)}


def measure(types: list[str], reference: Path, work: Path, args) -> tuple[list[dict], dict]:
    """Rows (the keys quality_table prints) for each type, and the run facts (F16 PPL, imatrix).
    args: max_samples, seq_len, seed, file, ctx_size, chunks, threads (0: all cores), nice,
    llama_cpp_build, as the two scripts' options name them."""
    args = argparse.Namespace(**vars(args))
    args.threads = args.threads or os.cpu_count() or 1
    tools = build_tools(Path(args.llama_cpp_build or default_build_dir()).expanduser(),
                        max(1, os.cpu_count() or 1))
    work.mkdir(parents=True, exist_ok=True)
    say(f"llama.cpp F16 perplexity ({args.chunks} chunks x {args.ctx_size}) ...")
    f16_ppl = perplexity_base(tools, reference, work, args)
    say(f"  llama.cpp F16 PPL {f16_ppl:.4f}")
    imat = make_imatrix(tools, reference, work, args)
    rows = []
    for t in types:
        out = work / f"llama-cpp-{t}.gguf"
        say(f"llama-quantize {t} ...")
        wall, peak = run_measured([tools["llama-quantize"], "--imatrix", imat["path"], reference,
                                      out, t, args.threads], f"llama-quantize {t}",
                                     work / f"quantize-{t}.log", args.nice)
        size = gguf_summary(out)
        say(f"  {wall:.0f} s, peak RSS {peak:.0f} MiB, linear bpw {size['bpw_linear']:.5f}; "
            f"mix {size['mix']}; measuring ...")
        res = perplexity_kld(tools, out, work, args, t)
        say(f"  {t}: PPL {res['ppl']:.4f}, mean KLD {res['kld']:.4f}, same top {res['same']:.1f}%")
        rows.append({"label": f"llama.cpp {t} + imatrix", "type": t, **size, **res,
                     "wall_s": imat["wall_s"] + wall,
                     "peak_rss_mib": max(peak, imat["peak_rss_mib"]),
                     "time_text": f"imatrix {imat['wall_s']:.0f} s + quantize {wall:.0f} s",
                     "rss_text": f"{peak:.0f} MiB (imatrix {imat['peak_rss_mib']:.0f} MiB)"})
        out.unlink()
    return rows, {"f16_ppl": f16_ppl, "imatrix": imat, "tools": tools}


def calibration_lines(im: dict) -> list[str]:
    """How the imatrix input compares with the quantizer's calibration tokens."""
    want = im["n_seq"] * im["seq_len"]
    lines = [f"llama.cpp imatrix input: the quantizer's {im['n_seq']} x {im['seq_len']} = "
             f"{want} calibration tokens decoded to text; llama.cpp tokenizes it to "
             f"{im['llama_cpp']} tokens (our tokenizer: {im['reencoded']}); {im['chunks_exact']} "
             f"of {im['n_seq']} chunks are their sequence token for token; {im['matched']} of "
             f"{want} calibration tokens recur in order (the others merged at sample joins, e.g. "
             f"'.' + 'User' -> '.User'); {im['dropped']} dropped and {im['digits']} filler digits "
             "keep each sequence in its own chunk."]
    if im["llama_cpp"] != want or im["reencoded"] != want:
        n_chunks = im["llama_cpp"] // im["seq_len"]
        lines.append(f"CHUNK ALIGNMENT IS OFF: llama-imatrix makes {n_chunks} chunks of "
                     f"{im['seq_len']} from {im['llama_cpp']} tokens (special-token ids in the "
                     f"calibration set: {im['special_ids'] or 'none'}; U+FFFD in the text: "
                     f"{im['replacement_chars']}).")
    return lines


def describe(facts: dict, our_f16_ppl: float | None, rows: list[dict]) -> list[str]:
    """Lines for below the table: PPL agreement, calibration token counts, tensor type mixes."""
    lines = []
    if our_f16_ppl is not None:
        d = 100.0 * (facts["f16_ppl"] / our_f16_ppl - 1.0)
        lines.append(f"F16 PPL: llama.cpp {facts['f16_ppl']:.4f}, bonsai_runner.eval "
                     f"{our_f16_ppl:.4f} ({d:+.3f}%"
                     f"{'' if abs(d) <= 0.1 else '; MORE THAN 0.1% APART'}).")
    lines += calibration_lines(facts["imatrix"])
    for r in rows:
        mix = ", ".join(f"{k} {v}" for k, v in r["mix"].items())
        roles = "; ".join(f"{role} " + " + ".join(f"{k} {v}" for k, v in kinds.items())
                          for role, kinds in sorted(r["roles"].items()))
        lines.append(f"- {r['type']} tensor types: {mix} (2-D by role: {roles})")
    return lines


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options llama_cpp_quants reads (quality_table shares them)."""
    ap.add_argument("--llama-cpp-build", default=None, help="where llama.cpp's tools are built "
                    f"(default: ~/.cache/bonsai-runner/llama.cpp-{SDIST[1]}; reused when built)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", type=Path, default=None,
                    help="F16 GGUF (default: the demo's cached F16 of the real model)")
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES), help="llama-quantize types")
    ap.add_argument("--max-samples", type=int, default=128, help="calibration sequences")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per calibration sequence")
    ap.add_argument("--seed", type=int, default=0, help="calibration seed (the quantizer's --seed)")
    ap.add_argument("--file", default=None, help="evaluation text (default: the built-in one)")
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--nice", type=int, default=10, help="niceness of the imatrix/quantize runs")
    ap.add_argument("--work", type=Path, default=None, help="directory for the outputs and logs "
                    "(default: a temporary one, removed at the end)")
    ap.add_argument("--no-ours", action="store_true", help="skip our engine's F16 perplexity")
    add_arguments(ap)
    args = ap.parse_args(argv)
    from quality_table import _default_reference

    ref = args.reference or _default_reference()
    if not ref.is_file():
        ap.error(f"{ref}: no such F16 GGUF (bonsai demo or quality_table.py makes it)")
    tmp = tempfile.TemporaryDirectory(prefix="bonsai-llama-cpp-") if args.work is None else None
    work = Path(tmp.name) if tmp else args.work
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    try:
        rows, facts = measure(types, ref, work, args)
    except LlamaCppUnavailable as e:
        print(f"llama.cpp rows unavailable: {e}", file=sys.stderr)
        return 1
    ours = None
    if not args.no_ours:
        from bonsai_runner.eval.perplexity import PerplexityOptions, run_perplexity

        opts = PerplexityOptions(model=str(ref), file=args.file, ctx_size=args.ctx_size,
                                 chunks=args.chunks, threads=args.threads)
        ours = run_perplexity(opts, lambda s: None, lambda s: None).ppl
    print("\n".join(format_rows(rows)))
    print("\n" + "\n".join(describe(facts, ours, rows)))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
