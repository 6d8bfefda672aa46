"""ik_llama.cpp as a second CPU peer of benchmarks/bench_cpu.py (its --ik-llama option).

ik_llama.cpp is the fork of llama.cpp with the fastest published CPU paths for ternary models
(IQ2_BN: 2 bits per weight and one scale per row; IQ1_BN: 1.625 bpw; both with run-time repacked
variants). It reads neither PTQ1_0 nor mainline's TQ1_0 / TQ2_0, so the peer's file is made by its
own llama-quantize from an F16 GGUF of the same checkpoint: the same shapes, the same bytes per
weight class (IQ2_BN holds the ternary codes of our group-256 weights with one scale per row, so it
computes a slightly different function than the other files; speed is what it is here for).

What this module does, given the source tree of ik_llama.cpp (a directory, or `clone`: a shallow
`git clone` of IK_LLAMA_URL into the work directory, which needs network access):
1. builds its llama-bench and llama-quantize with CMake (-DGGML_NATIVE=ON, no tests, no server,
   no curl) into <source>/build-bonsai-bench, once;
2. quantizes the F16 GGUF to IQ2_BN with the same token_embd / output.weight type as the other
   files (--token-embedding-type / --output-tensor-type), once;
3. runs its llama-bench: -p P (prefill) and -gp P,N (N generated tokens after a P-token prompt,
   timed without the prompt: the same test as our tg N @ d P), --threads, -r reps, JSON output,
   with run-time repacking off and on (-rtr 0,1): the faster of the two is the peer's figure.
Every step that fails returns a message instead (the caller prints it and skips the rows).
Its runs come after the interleaved ones of the two other engines, in their own process.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from pathlib import Path

IK_LLAMA_URL = "https://github.com/ikawrakow/ik_llama.cpp"
BUILD_DIR = "build-bonsai-bench"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
TARGETS = ("llama-bench", "llama-quantize")


class PeerUnavailable(Exception):
    """ik_llama.cpp could not be fetched, built, or run here; the message says which step."""


def _run(cmd: list[str], what: str, log, timeout: int, cwd: Path | None = None) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PeerUnavailable(f"{what} failed: {e}") from None
    if r.returncode != 0:
        tail = "\n    ".join((r.stderr or r.stdout).strip().splitlines()[-6:])
        raise PeerUnavailable(f"{what} failed (exit {r.returncode}):\n    {tail}")
    log(f"  {what}: done")
    return r.stdout


def source_tree(spec: str, work_dir: Path, log) -> Path:
    """The ik_llama.cpp source directory: `spec` itself, or a shallow clone for spec == 'clone'."""
    if spec != "clone":
        src = Path(spec).expanduser()
        if not (src / "CMakeLists.txt").is_file():
            raise PeerUnavailable(f"{src} is not an ik_llama.cpp source tree (no CMakeLists.txt); "
                                  f"pass a checkout of {IK_LLAMA_URL} or 'clone'")
        return src
    src = work_dir / "ik_llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        if shutil.which("git") is None:
            raise PeerUnavailable("--ik-llama clone needs git on PATH")
        shutil.rmtree(src, ignore_errors=True)
        log(f"cloning {IK_LLAMA_URL} (shallow) into {src}")
        _run(["git", "clone", "--depth", "1", IK_LLAMA_URL, str(src)], "git clone", log, 900)
    return src


def build_tools(src: Path, threads: int, log) -> dict[str, Path]:
    """llama-bench and llama-quantize of the tree at `src`, built once with CMake."""
    build = src / BUILD_DIR

    def found() -> dict[str, Path]:
        hits = {}
        for t in TARGETS:
            cand = [p for p in (build / "bin" / t, build / t) if p.is_file()]
            if cand:
                hits[t] = cand[0]
        return hits

    tools = found()
    if len(tools) == len(TARGETS):
        return tools
    if shutil.which("cmake") is None:
        raise PeerUnavailable("building ik_llama.cpp needs cmake on PATH")
    log(f"building ik_llama.cpp's {' and '.join(TARGETS)} in {build} (once; several minutes)")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(src), "-B", str(build), *gen, *CMAKE_FLAGS], "cmake configure", log, 900)
    _run(["cmake", "--build", str(build), "-j", str(max(1, threads)), "--target", *TARGETS],
         "cmake build", log, 3600)
    tools = found()
    if len(tools) != len(TARGETS):
        raise PeerUnavailable(f"the build did not produce {', '.join(t for t in TARGETS if t not in tools)}")
    return tools


def commit_of(src: Path) -> str:
    try:
        r = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, timeout=30)
        return r.stdout.strip() or "unknown commit"
    except (OSError, subprocess.SubprocessError):
        return "unknown commit"


def quantize_iq2_bn(quantize: Path, f16: Path, out: Path, embed_type: str, threads: int, log) -> Path:
    """`out`: IQ2_BN of the F16 GGUF `f16`, token_embd / output.weight kept at `embed_type`."""
    if out.exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    tmp.unlink(missing_ok=True)
    log(f"quantizing {f16.name} to IQ2_BN with ik_llama.cpp's llama-quantize (once)")
    try:
        _run([str(quantize), "--token-embedding-type", embed_type, "--output-tensor-type", embed_type,
              str(f16), str(tmp), "IQ2_BN", str(max(1, threads))], "llama-quantize IQ2_BN", log, 1800)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def time_model(bench: Path, model: Path, n_prompt: int, n_gen: int, threads: int, reps: int,
               batch: int, log) -> dict:
    """{"pp": rates, "tg": rates, "repack": 0|1 per test}: llama-bench's per-run tokens/s, for each
    test from the run-time repacking setting with the higher median."""
    out = _run([str(bench), "-m", str(model), "-p", str(n_prompt), "-n", "0", "-gp", f"{n_prompt},{n_gen}",
                "-t", str(threads), "-r", str(reps), "-b", str(batch), "-rtr", "0,1", "-o", "json"],
               "ik_llama.cpp llama-bench", log, 3600)
    try:
        runs = json.loads(out[out.index("["):])
    except ValueError as e:
        raise PeerUnavailable(f"llama-bench printed no JSON list ({e})") from None
    best: dict[str, tuple[float, list[float], int]] = {}
    for r in runs:
        test = "pp" if int(r.get("n_gen", 0)) == 0 else "tg"
        rates = [float(x) for x in r.get("samples_ts", [])]
        if not rates:
            continue
        med = statistics.median(rates)
        if test not in best or med > best[test][0]:
            best[test] = (med, rates, int(bool(r.get("repack", 0))))
    if set(best) != {"pp", "tg"}:
        raise PeerUnavailable(f"llama-bench gave no {' and '.join({'pp', 'tg'} - set(best))} results")
    return {"pp": best["pp"][1], "tg": best["tg"][1],
            "repack": {k: v[2] for k, v in best.items()}}
