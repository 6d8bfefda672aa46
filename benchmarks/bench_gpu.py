"""Decode throughput of one synthetic model on the GPU vs the CPU (issue #7's short GPU benchmark).

The model is written directly as GGUF by tests/synthetic_gguf.py (no checkpoint, no quantizer):
llama layout, random packed bytes for the linear layers (PTQ1_0 by default, or any weight type),
F16 token embedding and output head, a byte-fallback vocabulary. Speed does not depend on the
weight values, so this measures what a real file of that shape would.

For each configuration — CPU (n_gpu_layers 0), half of the layers on the GPU, all layers on the
GPU — it loads the model, prefills a prompt, then times single-token decode steps (greedy token
fed back), and prints tokens/s and the ratio to the CPU. It is a benchmark, not a test: it asserts
nothing beyond the run completing. Default size: hidden 2048, ffn 5632, 8 layers, vocab 32000
(~340 MB of PTQ1_0), which finishes in well under two minutes on an H200 machine.

    python benchmarks/bench_gpu.py [--hidden 2048] [--layers 8] [--type PTQ1_0] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

sys.path.insert(0, str(REPO / "tests"))

from bonsai_runner import _core  # noqa: E402
from synthetic_gguf import write_synthetic_model  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench_gpu] {msg}", file=sys.stderr, flush=True)


def decode_rate(path: Path, n_gpu_layers: int, prompt: int, tokens: int, threads: int) -> dict:
    t0 = time.perf_counter()
    model = _core.Model(str(path), n_gpu_layers=n_gpu_layers)
    ctx = _core.Context(model, n_ctx=prompt + tokens + 8, n_batch=512, n_threads=threads)
    load = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    toks = rng.integers(3, model.n_vocab, prompt)
    t1 = time.perf_counter()
    logits = ctx.decode(toks)
    prefill = time.perf_counter() - t1
    tok = int(np.argmax(logits[-1]))
    ctx.decode([tok])  # warm-up step (lazy kernel loading)
    t2 = time.perf_counter()
    for _ in range(tokens):
        tok = int(np.argmax(ctx.decode([tok])[-1]))
    dt = time.perf_counter() - t2
    r = {"n_gpu_layers": model.n_gpu_layers, "load_s": round(load, 2),
         "prefill_tok_s": round(prompt / prefill, 1), "decode_tok_s": round(tokens / dt, 2),
         "memory": model.memory_report(), "context_memory": ctx.memory_report()}
    ctx.close()
    model.close()
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--type", default="PTQ1_0")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64, help="timed decode steps per configuration")
    ap.add_argument("--cpu-tokens", type=int, default=16, help="timed decode steps on the CPU")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args(argv)
    gpu = bool(_core.build_info.get("cuda")) and _core.cuda_device_count() > 0
    if gpu:
        log(f"device: {_core.cuda_memory_info()}")
    else:
        log("no CUDA build or no GPU: only the CPU row is measured")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.gguf"
        t0 = time.perf_counter()
        write_synthetic_model(path, "llama", a.hidden, a.ffn, a.layers, n_head=16, n_head_kv=4, vocab=a.vocab,
                              wtype=a.type)
        log(f"wrote {path.name} ({os.path.getsize(path) / 2**20:.0f} MiB, {a.type}) in "
            f"{time.perf_counter() - t0:.1f} s")
        configs = [("CPU", 0, a.cpu_tokens)]
        if gpu:
            configs += [(f"GPU {a.layers // 2}/{a.layers} layers", a.layers // 2, a.tokens),
                        ("GPU all layers", -1, a.tokens)]
        rows = []
        for label, ngl, n in configs:
            log(f"{label}: loading and decoding {n} tokens")
            r = decode_rate(path, ngl, a.prompt, n, a.threads)
            r["config"] = label
            rows.append(r)
    cpu = rows[0]["decode_tok_s"]
    print(f"synthetic llama h{a.hidden} ffn{a.ffn} {a.layers} layers vocab {a.vocab}, {a.type}; prompt {a.prompt}")
    print(f"{'config':<24}{'layers on GPU':>14}{'prefill tok/s':>15}{'decode tok/s':>14}{'vs CPU':>9}"
          f"{'GPU weights':>13}{'GPU ctx':>10}")
    for r in rows:
        mem, cm = r["memory"], r["context_memory"]
        print(f"{r['config']:<24}{r['n_gpu_layers']:>14}{r['prefill_tok_s']:>15}{r['decode_tok_s']:>14}"
              f"{r['decode_tok_s'] / cpu if cpu else 0:>8.1f}x"
              f"{mem['gpu_allocated_bytes'] / 2**20:>10.0f} MiB{cm['gpu_allocated_bytes'] / 2**20:>7.0f} MiB")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
