"""Throughput benchmark of the engine in llama-bench's shape.

For every model and every combination of threads x KV types x batch size x activation mode it runs
the prompt-processing tests (pp<N>: N random tokens decoded as one batch into an empty context, in
chunks of n_batch) and the generation tests (tg<N>: N tokens decoded one at a time from an empty
context), each `repetitions` times after one warm-up decode, and reports tokens/s as mean +- sample
standard deviation over the repetitions. Every test gets a context of exactly N cells.

Roofline (--bandwidth): a built-in probe (_core.measure_read_bandwidth) measures the memory-read
rate with the row's thread count; a generated token must read every weight once (one row of the
token embedding; the whole tied head) plus the K/V rows of the cells before it (on average (N-1)/2
of a tgN run), so bandwidth / those bytes is the most tokens/s the machine can give, and the table
shows each tg figure as a percentage of it. Prompt processing is compute-bound: no roofline.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import BonsaiError

DEFAULTS = {"type_k": "f16", "type_v": "f16", "n_batch": 512, "act_mode": "int8"}
PROBE_BYTES = 256 << 20


@dataclass
class BenchConfig:
    models: list[str]
    n_prompt: list[int] = field(default_factory=lambda: [512])
    n_gen: list[int] = field(default_factory=lambda: [128])
    repetitions: int = 5
    threads: list[int] = field(default_factory=lambda: [os.cpu_count() or 1])
    type_k: list[str] = field(default_factory=lambda: ["f16"])
    type_v: list[str] = field(default_factory=lambda: ["f16"])
    n_batch: list[int] = field(default_factory=lambda: [512])
    act_mode: list[str] = field(default_factory=lambda: ["int8"])
    bandwidth: bool = False
    probe_bytes: int = PROBE_BYTES
    seed: int = 1234


@dataclass
class BenchResult:
    model: str              # "llama 27B PTQ1_0" style label
    model_path: str
    size: int               # weight bytes the engine binds
    params: int
    backend: str
    threads: int
    type_k: str
    type_v: str
    n_batch: int
    act_mode: str
    test: str               # "pp512", "tg128"
    n_prompt: int
    n_gen: int
    samples_ts: list[float]
    avg_ts: float
    stddev_ts: float
    bytes_per_token: int | None = None     # tg: weights + mean KV bytes read per token
    bandwidth: float | None = None         # bytes/s measured with `threads`
    roofline_ts: float | None = None
    roofline_pct: float | None = None


def check_config(cfg: BenchConfig) -> None:
    if not cfg.models:
        raise BonsaiError("no model given; pass -m MODEL.gguf (repeat -m for several)")
    for m in cfg.models:
        if not os.path.isfile(m):
            raise BonsaiError(f"-m {m}: file not found")
    if cfg.repetitions < 1:
        raise BonsaiError(f"-r {cfg.repetitions}: repetitions must be at least 1")
    for name, vals in (("-p", cfg.n_prompt), ("-n", cfg.n_gen)):
        if any(v < 0 for v in vals):
            raise BonsaiError(f"{name}: token counts must be >= 0 (0 skips the test)")
    if not any(v > 0 for v in cfg.n_prompt + cfg.n_gen):
        raise BonsaiError("-p and -n are all 0: nothing to run")
    if any(t < 1 for t in cfg.threads):
        raise BonsaiError(f"-t {cfg.threads}: thread counts must be at least 1")
    if any(b < 1 for b in cfg.n_batch):
        raise BonsaiError(f"-b {cfg.n_batch}: batch sizes must be at least 1")
    for name, vals in (("-ctk", cfg.type_k), ("-ctv", cfg.type_v)):
        for v in vals:
            if v not in ("f16", "q8_0"):
                raise BonsaiError(f"{name} {v}: KV cache types are f16 and q8_0")
    for v in cfg.act_mode:
        if v not in ("int8", "float"):
            raise BonsaiError(f"--act-mode {v}: use int8 or float")


def parse_list(text: str, what: str, conv=int) -> list:
    """'1,2,4' -> [1, 2, 4]; a bad item is one BonsaiError naming the flag."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            out.append(conv(part))
        except ValueError:
            raise BonsaiError(f"{what} {text!r}: {part!r} is not a valid value") from None
    return out


def _size_label(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.0f}B" if n >= 1e10 else f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


@dataclass
class _ModelFacts:
    label: str
    size: int
    params: int
    read_per_token: int     # weight bytes read per generated token
    desc: object            # plan_model.ModelDesc (KV cell sizes)


def _model_facts(path: str) -> _ModelFacts:
    from .plan import PlanParams, device_budgets
    from .plan_model import ROLE_EMBD, ROLE_OUTPUT, ROLE_MATRIX, describe_gguf

    d = describe_gguf(path)
    by_type: dict[str, int] = {}
    for t in d.tensors:
        if t.role in (ROLE_MATRIX, ROLE_EMBD, ROLE_OUTPUT):
            by_type[t.type_name] = by_type.get(t.type_name, 0) + t.n_elements
    main = max(by_type, key=by_type.get) if by_type else "?"
    cpu = device_budgets(d, PlanParams(n_ctx=1, n_threads=1))["CPU"]
    return _ModelFacts(f"{d.arch} {_size_label(d.n_params)} {main}",
                       sum(x.nbytes for x in d.tensors), d.n_params,
                       cpu["read_per_token_bytes"], d)


def _stats(samples: list[float]) -> tuple[float, float]:
    mean = sum(samples) / len(samples)
    if len(samples) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((s - mean) ** 2 for s in samples) / (len(samples) - 1))


def _run_test(model, n_tokens: int, gen: bool, combo: dict, reps: int, rng,
              n_vocab: int) -> list[float]:
    from . import _core

    with _core.Context(model, n_ctx=n_tokens, n_batch=combo["n_batch"], n_seq_max=1,
                       n_threads=combo["threads"], type_k=combo["type_k"],
                       type_v=combo["type_v"], act_mode=combo["act_mode"]) as ctx:
        ctx.decode(rng.integers(0, n_vocab, size=min(n_tokens, combo["n_batch"])))   # warm-up
        samples = []
        for _ in range(reps):
            ctx.clear()
            tokens = rng.integers(0, n_vocab, size=n_tokens)
            t0 = time.perf_counter()
            if gen:
                for tok in tokens:
                    ctx.decode([int(tok)])
            else:
                ctx.decode(tokens)
            samples.append(n_tokens / max(time.perf_counter() - t0, 1e-12))
    return samples


def run_bench(cfg: BenchConfig, progress=None) -> tuple[list[BenchResult], dict]:
    """Runs the matrix; returns the results and the bandwidth probes by thread count."""
    from . import _core
    from .plan import kv_bytes

    check_config(cfg)
    probes: dict[int, dict] = {}
    if cfg.bandwidth:
        for t in sorted(set(cfg.threads)):
            probes[t] = _core.measure_read_bandwidth(cfg.probe_bytes, t, 5)
    rng = np.random.default_rng(cfg.seed)
    results: list[BenchResult] = []
    for path in cfg.models:
        facts = _model_facts(path)
        with _core.Model(path) as model:
            n_vocab = model.n_vocab
            combos = [dict(threads=t, type_k=k, type_v=v, n_batch=b, act_mode=a)
                      for t in cfg.threads for k in cfg.type_k for v in cfg.type_v
                      for b in cfg.n_batch for a in cfg.act_mode]
            tests = [(f"pp{n}", n, False) for n in cfg.n_prompt if n > 0] + \
                    [(f"tg{n}", n, True) for n in cfg.n_gen if n > 0]
            for combo in combos:
                for name, n, gen in tests:
                    if progress:
                        progress(f"{facts.label} {name} t={combo['threads']} "
                                 f"kv={combo['type_k']}/{combo['type_v']} b={combo['n_batch']}")
                    samples = _run_test(model, n, gen, combo, cfg.repetitions, rng, n_vocab)
                    mean, sd = _stats(samples)
                    r = BenchResult(facts.label, path, facts.size, facts.params, "CPU",
                                    combo["threads"], combo["type_k"], combo["type_v"],
                                    combo["n_batch"], combo["act_mode"], name,
                                    0 if gen else n, n if gen else 0, samples, mean, sd)
                    if gen:
                        kv_cell = kv_bytes(facts.desc, 1, combo["type_k"], combo["type_v"])
                        r.bytes_per_token = int(facts.read_per_token + kv_cell * (n - 1) / 2)
                    if gen and combo["threads"] in probes:
                        r.bandwidth = probes[combo["threads"]]["bytes_per_s"]
                        r.roofline_ts = r.bandwidth / r.bytes_per_token
                        r.roofline_pct = 100.0 * mean / r.roofline_ts
                    results.append(r)
    return results, probes


# ----- output -----

def _varying(results: list[BenchResult]) -> list[str]:
    """Optional columns: a parameter is shown when it varies or differs from its default."""
    cols = []
    for key, default in DEFAULTS.items():
        vals = {getattr(r, key) for r in results}
        if len(vals) > 1 or vals != {default}:
            cols.append(key)
    return cols


def _fmt_size(n: int) -> str:
    for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s:
            return f"{n / s:.2f} {u}"
    return f"{n} B"


def _fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def format_md(results: list[BenchResult], probes: dict) -> str:
    extra = _varying(results)
    roof = bool(probes)
    head = ["model", "size", "params", "backend", "threads"] + extra + ["test", "t/s"]
    align = ["---", "---:", "---:", "---", "---:"] + ["---:"] * len(extra) + ["---:", "---:"]
    if roof:
        head += ["roofline t/s", "% of roofline"]
        align += ["---:", "---:"]
    lines = []
    for t, p in sorted(probes.items()):
        lines.append(f"memory read bandwidth ({t} thread{'s' if t > 1 else ''}): "
                     f"{p['bytes_per_s'] / 1e9:.2f} GB/s (best of {p['repeats']} reads of "
                     f"{_fmt_size(p['buffer_bytes'])}; "
                     f"mean {p['mean_bytes_per_s'] / 1e9:.2f} GB/s)")
    if lines:
        lines.append("")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("| " + " | ".join(align) + " |")
    for r in results:
        row = [r.model, _fmt_size(r.size), _fmt_params(r.params), r.backend, str(r.threads)]
        row += [str(getattr(r, k)) for k in extra]
        row += [r.test, f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}"]
        if roof:
            row += ([f"{r.roofline_ts:.2f}", f"{r.roofline_pct:.1f}%"] if r.roofline_ts
                    else ["-", "-"])
        lines.append("| " + " | ".join(row) + " |")
    from . import __version__

    lines += ["", f"build: bonsai-runner {__version__} (CPU backend, {platform.machine()}, "
              f"{os.cpu_count()} logical CPUs)"]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ["model", "model_path", "size", "params", "backend", "threads", "type_k", "type_v",
              "n_batch", "act_mode", "test", "n_prompt", "n_gen", "avg_ts", "stddev_ts",
              "bytes_per_token", "bandwidth", "roofline_ts", "roofline_pct", "samples_ts"]


def format_csv(results: list[BenchResult]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in results:
        d = asdict(r)
        d["samples_ts"] = ";".join(f"{s:.4f}" for s in r.samples_ts)
        w.writerow(["" if d[k] is None else d[k] for k in CSV_FIELDS])
    return buf.getvalue()


def format_json(results: list[BenchResult], probes: dict) -> str:
    from . import __version__

    doc = {"build": {"bonsai_runner": __version__, "machine": platform.machine(),
                     "cpu_count": os.cpu_count()},
           "bandwidth_probes": [dict(p) for _, p in sorted(probes.items())],
           "results": [asdict(r) for r in results]}
    return json.dumps(doc, indent=2) + "\n"


def format_results(results: list[BenchResult], probes: dict, fmt: str) -> str:
    if fmt == "md":
        return format_md(results, probes)
    if fmt == "csv":
        return format_csv(results)
    if fmt == "json":
        return format_json(results, probes)
    raise BonsaiError(f"-o {fmt}: use md, csv or json")
