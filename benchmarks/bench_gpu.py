"""GPU rows of issue #8: decode and prefill throughput of synthetic 8B / 27B-shaped models on the
GPU, with a measured device-bandwidth roofline.

Models are written directly as GGUF by tests/synthetic_gguf.py (no checkpoint, no quantizer, no
network): llama layout, random PTQ1_0 linear layers (one random block repeated, so a 27B file is
written in seconds; speed does not depend on the values), Q8_0 output head and token embedding,
byte-fallback vocabulary. Shapes (issue #8):
  8b   hidden 4096, 36 layers, 32 / 8 heads, head size 128, FFN 12288, vocab 151936
  27b  hidden 5120, 64 layers, 40 / 8 heads, head size 128, FFN 21504, vocab 151936
  tiny hidden 256, 2 layers (a smoke test of this script, e.g. on an emulator)

Rows per shape, every layer on the GPU:
  decode   batch-1 greedy-shaped steps (the previous argmax fed back) after a prompt of `ctx`
           tokens, at 512 and 16K context, flash attention and q8_0 KV, CUDA graphs on and off
  parallel 8 sequences decoded together (one step for all) vs 1: aggregate tokens/s
  prefill  one 4096-token prompt, flash vs plain attention (f16 KV), tokens/s
The bandwidth probe times device-to-device copies (_core.cuda_copy_bandwidth, read + write
bytes). A decode step must read every weight on the GPU once plus the K/V rows in use, so
roofline tok/s = n_seq * bandwidth / (GPU weight bytes + KV bytes read per step); the table
prints each decode row's share of it.

    python benchmarks/bench_gpu.py [--shape 8b 27b] [--quick] [--tokens 64] [--json out.json]

--quick (scripts/gpu_check.sh): the 8b shape, 512 context only, prefill of 1024 tokens.
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
sys.path.append(str(REPO / "python"))  # after PYTHONPATH, which may name another build
sys.path.insert(0, str(REPO / "tests"))

from bonsai_runner import _core  # noqa: E402
from bonsai_runner.ggml_types import type_info  # noqa: E402
from synthetic_gguf import write_synthetic_model  # noqa: E402

SHAPES = {
    "8b": dict(hidden=4096, n_layer=36, n_head=32, n_head_kv=8, head_dim=128, ffn=12288, vocab=151936),
    "27b": dict(hidden=5120, n_layer=64, n_head=40, n_head_kv=8, head_dim=128, ffn=21504, vocab=151936),
    "tiny": dict(hidden=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, ffn=512, vocab=512),
}


def log(msg: str) -> None:
    print(f"[bench_gpu] {msg}", file=sys.stderr, flush=True)


def write_model(path: Path, shape: dict) -> None:
    write_synthetic_model(path, "llama", hidden=shape["hidden"], ffn=shape["ffn"], n_layer=shape["n_layer"],
                          n_head=shape["n_head"], n_head_kv=shape["n_head_kv"], head_dim=shape["head_dim"],
                          vocab=shape["vocab"], wtype="PTQ1_0", emb_type="Q8_0", head_type="Q8_0",
                          same_blocks=True)


def kv_bytes_per_cell(shape: dict, kv: str) -> int:
    """K + V bytes of one cell over all layers."""
    return 2 * shape["n_layer"] * type_info(kv.upper()).row_bytes(shape["n_head_kv"] * shape["head_dim"])


def decode_row(model, shape: dict, ctx_len: int, tokens: int, n_seq: int, flash: bool, graphs: bool,
               kv: str) -> dict:
    """Prefill ctx_len tokens of each of n_seq sequences, then time `tokens` steps of n_seq tokens."""
    n_ctx = n_seq * (ctx_len + tokens + 8)
    rng = np.random.default_rng(1)
    with _core.Context(model, n_ctx=n_ctx, n_batch=min(4096, n_ctx), n_seq_max=n_seq, n_threads=4, type_k=kv,
                       type_v=kv, flash_attn=flash, cuda_graph=graphs) as ctx:
        for s in range(n_seq):
            ctx.decode(rng.integers(3, model.n_vocab, ctx_len), seq_ids=[s] * ctx_len)
        seqs = list(range(n_seq))
        toks = [int(t) for t in rng.integers(3, model.n_vocab, n_seq)]
        for _ in range(3):  # warm-up: lazy module loading, graph capture
            toks = [int(t) for t in np.argmax(ctx.decode(toks, seq_ids=seqs, logits="all"), axis=1)]
        t0 = time.perf_counter()
        for _ in range(tokens):
            toks = [int(t) for t in np.argmax(ctx.decode(toks, seq_ids=seqs, logits="all"), axis=1)]
        dt = time.perf_counter() - t0
    return {"tok_s": round(n_seq * tokens / dt, 1), "ms_per_step": round(1000 * dt / tokens, 3),
            "kv_read_bytes": kv_bytes_per_cell(shape, kv) * n_seq * (ctx_len + tokens // 2)}


def prefill_row(model, n: int, flash: bool) -> dict:
    rng = np.random.default_rng(2)
    with _core.Context(model, n_ctx=n + 32, n_batch=n, n_threads=4, flash_attn=flash) as ctx:
        ctx.decode(rng.integers(3, model.n_vocab, 16))  # warm-up
        toks = rng.integers(3, model.n_vocab, n)
        t0 = time.perf_counter()
        ctx.decode(toks)
        dt = time.perf_counter() - t0
    return {"tok_s": round(n / dt, 1)}


def bench_shape(name: str, a, tmp: Path, bandwidth: float) -> list:
    shape = SHAPES[name]
    path = tmp / f"synthetic-{name}.gguf"
    t0 = time.perf_counter()
    write_model(path, shape)
    log(f"{name}: wrote {os.path.getsize(path) / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")
    rows = []
    with _core.Model(str(path), n_gpu_layers=-1) as model:
        weights = model.memory_report()["gpu_weights_bytes"]
        contexts = [512] if a.quick else [512, 16384]
        if name == "tiny":
            contexts = [64]
        for ctx_len in contexts:
            for graphs in (True, False):
                log(f"{name}: decode at {ctx_len} context, graphs {'on' if graphs else 'off'}")
                r = decode_row(model, shape, ctx_len, a.tokens, 1, True, graphs, "q8_0")
                r.update(row=f"decode ctx {ctx_len} flash q8_0 graphs {'on' if graphs else 'off'}", n_seq=1)
                rows.append(r)
        ctx_par = contexts[0]
        log(f"{name}: 8 parallel sequences at {ctx_par} context")
        r = decode_row(model, shape, ctx_par, a.tokens, 8, True, True, "q8_0")
        r.update(row=f"decode 8 sequences ctx {ctx_par} flash q8_0 graphs on", n_seq=8)
        rows.append(r)
        n_pre = 64 if name == "tiny" else (1024 if a.quick else 4096)
        for flash in (True, False):
            log(f"{name}: prefill {n_pre} tokens, {'flash' if flash else 'plain'} attention")
            r = prefill_row(model, n_pre, flash)
            r.update(row=f"prefill {n_pre} {'flash' if flash else 'plain'} attention")
            rows.append(r)
    for r in rows:
        r["shape"] = name
        r["gpu_weights_bytes"] = weights
        if "kv_read_bytes" in r and bandwidth > 0:
            r["roofline_tok_s"] = round(r["n_seq"] * bandwidth / (weights + r["kv_read_bytes"]), 1)
            r["pct_roofline"] = round(100 * r["tok_s"] / r["roofline_tok_s"], 1)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", nargs="+", choices=list(SHAPES), default=None,
                    help="model shapes (default: 8b 27b; --quick: 8b)")
    ap.add_argument("--quick", action="store_true", help="the short version run by scripts/gpu_check.sh")
    ap.add_argument("--tokens", type=int, default=64, help="timed decode steps per row")
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args(argv)
    shapes = a.shape or (["8b"] if a.quick else ["8b", "27b"])
    if not (_core.build_info.get("cuda") and _core.cuda_device_count() > 0):
        log("no CUDA build or no GPU visible: nothing to measure")
        return 1
    log(f"device: {_core.cuda_memory_info()}")
    bandwidth = _core.cuda_copy_bandwidth(1 << 30 if "tiny" not in shapes else 1 << 20, 20)
    log(f"device copy bandwidth: {bandwidth / 1e9:.0f} GB/s (read + write)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in shapes:
            rows += bench_shape(name, a, Path(tmp), bandwidth)
    print(f"device copy bandwidth {bandwidth / 1e9:.0f} GB/s; PTQ1_0 linear layers, Q8_0 head; "
          f"{a.tokens} timed steps per decode row")
    print(f"{'shape':<6}{'row':<46}{'tok/s':>10}{'ms/step':>9}{'roofline':>10}{'% roof':>8}")
    for r in rows:
        print(f"{r['shape']:<6}{r['row']:<46}{r['tok_s']:>10}{r.get('ms_per_step', ''):>9}"
              f"{r.get('roofline_tok_s', ''):>10}{r.get('pct_roofline', ''):>8}")
    if a.json:
        Path(a.json).write_text(json.dumps({"bandwidth_bytes_s": bandwidth, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
