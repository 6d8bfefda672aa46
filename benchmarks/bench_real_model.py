"""Real-model decode: our PTQ1_0 Qwen2.5-Coder-0.5B against llama.cpp on the original Q4_K_M file
(issue #6's real-model criterion; a script, not a test).

Both engines run the same fixed pseudo-random token ids (no sampling): a prompt of --prompt tokens,
then --gen single-token steps, from an empty cache, --reps times interleaved after one warm-up each,
with --threads threads; it prints the median tokens/s of both and their ratio. Uses the runners of
bench_cpu.py (our `_core.Context.decode`, llama-cpp-python's `Llama.eval`).

    PYTHONPATH=python python3 benchmarks/bench_real_model.py \\
        --ours ~/.cache/bonsai-runner/demo/qwen2.5-coder-0.5b-instruct-ptq1_0.gguf \\
        --theirs ~/.cache/bonsai-runner/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

`bonsai demo` (or `bonsai quantize --model-dir <f16.gguf> --outfile ...`) writes the PTQ1_0 file;
scripts/fetch_real_model.py fetches the Q4_K_M one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import BonsaiRunner, LlamaCppRunner, run_once  # noqa: E402


def main() -> int:
    cache = Path.home() / ".cache" / "bonsai-runner"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ours", type=Path, default=cache / "demo" / "qwen2.5-coder-0.5b-instruct-ptq1_0.gguf")
    p.add_argument("--theirs", type=Path, default=cache / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (default 64)")
    p.add_argument("--gen", type=int, default=128, help="generated tokens (default 128)")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    for f in (a.ours, a.theirs):
        if not f.is_file():
            print(f"error: {f} does not exist (see this script's help for how to make it)", file=sys.stderr)
            return 2
    r = random.Random(0)
    prompt = [r.randrange(1000, 100000) for _ in range(a.prompt)]
    gen = [r.randrange(1000, 100000) for _ in range(a.gen)]
    n_ctx = a.prompt + a.gen + 64
    runners = [("bonsai " + a.ours.name, BonsaiRunner(a.ours, a.threads, n_ctx, 512)),
               ("llama.cpp " + a.theirs.name, LlamaCppRunner(a.theirs, a.threads, n_ctx, 512))]
    rates: dict[str, list[float]] = {n: [] for n, _ in runners}
    for _, ru in runners:
        run_once(ru, prompt, gen)
    for _ in range(a.reps):
        for n, ru in runners:
            _, tg = run_once(ru, prompt, gen)
            rates[n].append(a.gen / tg)
    med = {n: statistics.median(v) for n, v in rates.items()}
    for n, v in rates.items():
        print(f"{n}: tg{a.gen} @ d{a.prompt}, {a.threads} threads: median {med[n]:.1f} t/s "
              f"(runs {', '.join(f'{x:.1f}' for x in v)})")
    (n0, _), (n1, _) = runners
    print(f"ratio ours / llama.cpp decode: {med[n0] / med[n1]:.2f}")
    for _, ru in runners:
        ru.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
