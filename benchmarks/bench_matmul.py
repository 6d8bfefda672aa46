"""Micro-benchmark of the CPU matmul kernels (not a test): decode-shaped matrix-vector products, or
with --tokens, multi-token products (prefill, batched decode).

For each shape, type, path and thread count it times y = W x (one token, INT8 activations) over
enough distinct weight copies to exceed the last-level cache, so weights stream from memory the
way they do in a real decode step, and prints the effective weight bandwidth in GB/s and as a
percentage of a memory-read probe (numpy max over a large uint64 buffer, one reader per thread).
The per-call Python overhead (timed on a tiny matmul) is subtracted and shown.

If llama-cpp-python's ggml libraries are importable, ggml's own TQ2_0 / Q8_0 mul_mat is timed the
same way (graph of matvecs over the same number of copies) for comparison.

Multi-token mode (--tokens 2,4,8,16,64,512): y = W X for X of n tokens (INT8 activations), over
the same weight copies, reported as GMAC/s (rows x cols x tokens multiply-adds per second, the
per-call Python overhead not subtracted) for our default path and, where the type exists in
mainline ggml, for ggml's mul_mat on the same bytes, with the ratio ours / ggml.

    PYTHONPATH=python python3 benchmarks/bench_matmul.py [--shapes 2048x2048,5632x2048] [--types ...]
    PYTHONPATH=python python3 benchmarks/bench_matmul.py --tokens 2,4,8,16,64,512 --threads 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import os
import time

import numpy as np

from bonsai_runner import _core

TYPES = {  # name: (engine id, block elements, block bytes)
    "PTQ1_0": (143, 128, 28), "TQ1_0": (34, 256, 54), "TQ2_0": (35, 256, 66), "PQ2_0": (142, 128, 34),
    "Q2_0": (42, 64, 18), "Q4_0": (2, 32, 18), "Q8_0": (8, 32, 34), "F16": (1, 1, 2),
}
LLC_BYTES = 32 << 20


def mem_probe(threads: int, nbytes: int = 512 << 20) -> float:
    buf = np.ones(nbytes // 8, dtype=np.uint64)
    parts = np.array_split(buf, threads)
    best = 0.0
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        for _ in range(5):
            t0 = time.perf_counter()
            list(ex.map(np.max, parts))
            best = max(best, nbytes / (time.perf_counter() - t0))
    return best / 1e9


def weights(name: str, rows: int, cols: int, rng) -> list[np.ndarray]:
    _, be, bb = TYPES[name]
    row_bytes = cols // be * bb
    copies = max(2, int(np.ceil(3 * LLC_BYTES / (rows * row_bytes))))
    out = []
    for _ in range(copies):
        w = rng.integers(0, 256, size=(rows, row_bytes), dtype=np.uint8)
        if name == "F16":
            w = rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
        else:  # a sane fp16 scale in every block
            off = {"PTQ1_0": 26, "TQ1_0": 52, "TQ2_0": 64}.get(name, 0)
            blk = w.reshape(rows, cols // be, bb)
            blk[..., off:off + 2] = np.array([0.01], np.float16).view(np.uint8)
        out.append(w)
    return out


def time_ours(name, ws, cols, x, path, threads, reps) -> float:
    tid = TYPES[name][0]
    for w in ws[:2]:
        _core.matmul(tid, w, cols, x, threads=threads, path=path)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for w in ws:
            _core.matmul(tid, w, cols, x, threads=threads, path=path)
        best = min(best, (time.perf_counter() - t0) / len(ws))
    return best


def call_overhead(path, threads) -> float:
    w = np.zeros((4, 34), np.uint8)
    x = np.zeros((1, 32), np.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(2000):
            _core.matmul(8, w, 32, x, threads=threads, path=path)
        best = min(best, (time.perf_counter() - t0) / 2000)
    return best


class Ggml:
    """ggml mul_mat through llama-cpp-python's shared libraries (ctypes)."""

    TYPE_IDS = {"TQ2_0": 35, "TQ1_0": 34, "Q8_0": 8, "Q4_0": 2, "F16": 1}

    def __init__(self):
        import llama_cpp

        d = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
        self.base = ctypes.CDLL(os.path.join(d, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)

        class Params(ctypes.Structure):
            _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

        self.Params = Params
        b, c = self.base, self.cpu
        b.ggml_init.restype = ctypes.c_void_p
        b.ggml_init.argtypes = [Params]
        b.ggml_new_tensor_2d.restype = ctypes.c_void_p
        b.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        b.ggml_mul_mat.restype = ctypes.c_void_p
        b.ggml_mul_mat.argtypes = [ctypes.c_void_p] * 3
        b.ggml_new_graph.restype = ctypes.c_void_p
        b.ggml_new_graph.argtypes = [ctypes.c_void_p]
        b.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        b.ggml_get_data.restype = ctypes.c_void_p
        b.ggml_get_data.argtypes = [ctypes.c_void_p]
        b.ggml_nbytes.restype = ctypes.c_size_t
        b.ggml_nbytes.argtypes = [ctypes.c_void_p]
        b.ggml_free.argtypes = [ctypes.c_void_p]
        c.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]

    def time(self, name, ws, rows, cols, threads, reps, n_tokens=1) -> float:
        b = self.base
        total = sum(w.nbytes for w in ws) + len(ws) * rows * n_tokens * 4 + cols * n_tokens * 4 + (64 << 20)
        ctx = b.ggml_init(self.Params(total, None, False))
        try:
            x = b.ggml_new_tensor_2d(ctx, 0, cols, n_tokens)
            xs = np.random.default_rng(1).standard_normal((n_tokens, cols)).astype(np.float32)
            ctypes.memmove(b.ggml_get_data(x), xs.ctypes.data, xs.nbytes)
            g = b.ggml_new_graph(ctx)
            for w in ws:
                t = b.ggml_new_tensor_2d(ctx, self.TYPE_IDS[name], cols, rows)
                assert b.ggml_nbytes(t) == w.nbytes
                ctypes.memmove(b.ggml_get_data(t), w.ctypes.data, w.nbytes)
                b.ggml_build_forward_expand(g, b.ggml_mul_mat(ctx, t, x))
            self.cpu.ggml_graph_compute_with_ctx(ctx, g, threads)
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                self.cpu.ggml_graph_compute_with_ctx(ctx, g, threads)
                best = min(best, (time.perf_counter() - t0) / len(ws))
            return best
        finally:
            b.ggml_free(ctx)


def time_tokens(name, ws, cols, x, threads, reps) -> float:
    tid = TYPES[name][0]
    _core.matmul(tid, ws[0], cols, x, threads=threads)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for w in ws:
            _core.matmul(tid, w, cols, x, threads=threads)
        best = min(best, (time.perf_counter() - t0) / len(ws))
    return best


def multi_token(args, ggml, rng) -> None:
    tokens = [int(t) for t in args.tokens.split(",")]
    thread_list = [int(t) for t in args.threads.split(",")]
    print(f"multi-token INT8 matmul, GMAC/s (path {_core.cpu_path()}); ggml = llama.cpp's mul_mat on the same bytes")
    print(f"{'shape':>11} {'type':>7} {'thr':>3} " + " ".join(f"{'n=' + str(t):>13}" for t in tokens))
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        for name in args.types.split(","):
            if name == "F16":
                continue
            ws_all = weights(name, rows, cols, rng)
            for threads in thread_list:
                ours, theirs = [], []
                for nt in tokens:
                    # enough copies to stream from memory at few tokens, fewer when compute dominates
                    ws = ws_all[:max(2, len(ws_all) * 8 // max(8, nt))]
                    x = rng.standard_normal((nt, cols)).astype(np.float32)
                    t = time_tokens(name, ws, cols, x, threads, args.reps)
                    ours.append(rows * cols * nt / t / 1e9)
                    g = None
                    if ggml and name in Ggml.TYPE_IDS:
                        g = rows * cols * nt / ggml.time(name, ws, rows, cols, threads, args.reps, nt) / 1e9
                    theirs.append(g)
                print(f"{shape:>11} {name:>7} {threads:>3} " + " ".join(f"{o:13.1f}" for o in ours), flush=True)
                if any(g for g in theirs):
                    print(f"{'':>11} {'ggml':>7} {threads:>3} "
                          + " ".join(f"{g:13.1f}" if g else f"{'-':>13}" for g in theirs))
                    print(f"{'':>11} {'ratio':>7} {threads:>3} "
                          + " ".join(f"{o / g:12.2f}x" if g else f"{'-':>13}" for o, g in zip(ours, theirs)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="2048x2048,5632x2048", help="ROWSxCOLS list")
    ap.add_argument("--types", default="PTQ1_0,TQ2_0,TQ1_0,PQ2_0,Q2_0,Q4_0,Q8_0,F16")
    ap.add_argument("--paths", default=",".join(_core.cpu_paths()))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", help="multi-token mode: token counts, e.g. 2,4,8,16,64,512")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    try:
        ggml = Ggml()
    except Exception as e:  # noqa: BLE001 - optional comparison
        print(f"(ggml comparison unavailable: {e})")
        ggml = None
    if args.tokens:
        multi_token(args, ggml, rng)
        return
    thread_list = [int(t) for t in args.threads.split(",")]
    probe = {t: mem_probe(t) for t in thread_list}
    for t in thread_list:
        print(f"memory-read probe, {t} thread(s): {probe[t]:.1f} GB/s")
    print(f"{'shape':>11} {'type':>7} {'path':>7} {'thr':>3} {'us/matvec':>10} {'GB/s':>7} {'%probe':>7}"
          f" {'ggml us':>8} {'vs ggml':>8}")
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        for name in args.types.split(","):
            ws = weights(name, rows, cols, rng)
            x = rng.standard_normal((1, cols)).astype(np.float32)
            for threads in thread_list:
                g = None
                if ggml and name in Ggml.TYPE_IDS:
                    g = ggml.time(name, ws, rows, cols, threads, args.reps)
                for path in args.paths.split(","):
                    t = time_ours(name, ws, cols, x, path, threads, args.reps) - call_overhead(path, threads)
                    gbs = ws[0].nbytes / t / 1e9
                    gcol = f"{g * 1e6:8.1f} {g / t:7.2f}x" if g else f"{'':>8} {'':>8}"
                    print(f"{shape:>11} {name:>7} {path:>7} {threads:>3} {t * 1e6:10.1f} {gbs:7.1f}"
                          f" {100 * gbs / probe[threads]:6.0f}% {gcol}", flush=True)


if __name__ == "__main__":
    main()
