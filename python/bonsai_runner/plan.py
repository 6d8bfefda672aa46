"""The memory planner: what a model needs on each device before anything is loaded, the largest
context that fits a budget, and the decode-speed ceiling that memory bandwidth allows.

CPU figures use the engine's own allocation formulas (they must agree with what
`_core.Model.memory_report()` + `_core.Context.memory_report()` report; tests/test_plan.py checks):
  weights   every tensor the engine binds, at its stored size (mapped from the file; the matrices
            the CPU streams are then copied into huge pages and their mapped pages released, so
            the resident total stays the same)
  KV cache  n_ctx cells x n_layer x (row_bytes(type_k, n_embd_kv) + row_bytes(type_v, n_embd_kv))
            (cpp/src/kv_cache.cpp; n_ctx counts cells over all --parallel sequences); for a
            hybrid model (qwen35) only its attention blocks count
  recurrent state
            qwen35 only: per sequence (--parallel) and Gated DeltaNet block, the conv window
            (conv_kernel - 1) x conv_dim and the delta-rule state V heads x dv x dk, float32,
            held twice (the live state and one checkpoint of it for exact prompt-prefix reuse;
            cpp/src/recurrent_state.cpp)
  compute   float32 scratch for nb = min(n_batch, n_ctx) tokens: x, cur [nb, n_embd], q, attn
            [nb, n_embd_q], k, v [nb, n_embd_kv], gate, up [nb, n_ff], rope [nb, n_rot], plus per
            thread n_rep (n_ctx + head_dim + 2) floats of attention scratch plus its AVX-512 pass 1's
            K rows and arranged queries (cpp/src/context.cpp compute_layout,
            cpp/backends/cpu/attention.cpp attention_group_scratch_floats);
            qwen35 adds query+gate [nb, 2 n_embd_q], gate [nb, n_embd_q], qkv [nb, conv_dim],
            z, o [nb, V heads x dv] and alpha, beta [nb, V heads]
  logits    n_seq_max x n_vocab float32
  overhead  float32 copies of the 1-D tensors (exact) and the vocabulary tables (estimate)

GPU figures are the CUDA backend's own allocations (cpp/backends/cuda/gpu_model.cu and
gpu_context.cu; tests/test_cuda_engine.py compares them with the engine's report and with
cudaMemGetInfo). The first --n-gpu-layers blocks (-1 = all) hold their matrices packed as stored
and their 1-D tensors as float32 in one device allocation; when every block is offloaded,
output_norm (float32) and the output head (a copy of token_embd when tied) join it. The token
embedding and the rope table stay on the host. Per context, one more allocation of 256-byte
aligned pieces: K and V of the GPU layers for n_ctx cells, then float32 x, cur [nb, n_embd], q,
attn [nb, n_embd_q], k, v [nb, n_embd_kv], gate, up [nb, n_ff], rope [nb, n_rot], int8
activations [nb * max(n_embd, n_embd_q, n_ff)] + scales [nb], token metadata (3 x int32 + uint64
per token) and cell metadata (int32 + uint64 per cell); with the head on the GPU, logits for
min(nb, 64) rows. A qwen35 context puts K/V of the offloaded attention blocks only, then the
recurrent state of the offloaded GDN blocks (per --parallel sequence, live + checkpoint, float32;
counted in the GPU's recurrent figure, the host keeps the CPU blocks' part), and adds token
sequence ids, query+gate, gate, qkv, z, alpha, beta and o after the cell metadata; its int8
activations cover max(n_embd, n_embd_q, n_ff, V heads x dv). There is no attention score matrix (one-pass online softmax). Runtime overhead
is a fixed allowance (--gpu-overhead, default 512 MiB: CUDA context and kernels). The host keeps
the KV cells of the CPU blocks only; with every block offloaded its compute buffer is the gathered
embeddings and the rope table [nb, n_embd + n_rot].

Decode ceiling: one decode step reads every weight matrix once (one row of token_embd; the tied
output head reads all of it), the 1-D tensors, and the K/V rows of every cell in use; the time for
one step is the sum over devices of bytes read / bandwidth, and the step yields one token per
sequence.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .errors import BonsaiError
from .ggml_types import type_info
from .plan_model import ROLE_EMBD, ROLE_VECTOR, ModelDesc

MAX_SEQ = 64                 # KvCache::kMaxSeq
MAX_CTX = 1 << 24            # search limit for the largest context
VOCAB_ENTRY_BYTES = 96       # per-token table overhead of the engine's vocabulary (estimate)
VOCAB_TEXT_ESTIMATE = 8      # bytes of text per token when the vocabulary is not known
GPU_OVERHEAD_DEFAULT = 512 << 20
KV_TYPES = ("f16", "q8_0")


@dataclass
class PlanParams:
    n_ctx: int = 4096
    n_batch: int = 512
    n_parallel: int = 1
    n_threads: int = 0           # 0 = os.cpu_count(), as the engine's hardware_concurrency
    type_k: str = "f16"
    type_v: str = "f16"
    n_gpu_layers: int = 0
    flash_attn: bool = False
    memory: int | None = None    # budget in bytes of the planned device
    bandwidth: float | None = None       # bytes/s of the planned device
    cpu_bandwidth: float | None = None   # bytes/s of the CPU when layers are split
    gpu_overhead: int = GPU_OVERHEAD_DEFAULT


def resolve_threads(n: int) -> int:
    return n if n > 0 else (os.cpu_count() or 1)


def check_params(d: ModelDesc, p: PlanParams) -> None:
    """The engine's validation of context parameters, with the same messages' substance."""
    if p.n_ctx <= 0:
        raise BonsaiError(f"--ctx-size must be positive, got {p.n_ctx}")
    if p.n_batch <= 0:
        raise BonsaiError(f"--batch-size must be positive, got {p.n_batch}")
    if not 1 <= p.n_parallel <= MAX_SEQ:
        raise BonsaiError(f"--parallel must be between 1 and {MAX_SEQ}, got {p.n_parallel}")
    if p.n_threads < 0:
        raise BonsaiError(f"--threads must be >= 0 (0 = all cores), got {p.n_threads}")
    if p.n_gpu_layers < -1:
        raise BonsaiError(f"--n-gpu-layers must be >= -1 (-1 = all layers), got {p.n_gpu_layers}")
    for which, t in (("K", p.type_k), ("V", p.type_v)):
        if t.lower() not in KV_TYPES:
            raise BonsaiError(f"KV cache type {which} = {t} is not supported; use f16 or q8_0")
        if t.lower() == "q8_0" and d.head_dim % 32:
            raise BonsaiError(f"KV cache type {which} = q8_0 needs a head size that is a multiple "
                              f"of 32, this model's is {d.head_dim}; use f16")


# ----- the engine's formulas -----

def kv_bytes(d: ModelDesc, n_cells: int, type_k: str, type_v: str,
             n_layer: int | None = None) -> int:
    """KvCache::bytes_needed for n_layer KV layers (all attention blocks by default)."""
    layers = d.n_kv_layer if n_layer is None else n_layer
    row = type_info(type_k).row_bytes(d.n_embd_kv) + type_info(type_v).row_bytes(d.n_embd_kv)
    return n_cells * layers * row


def recurrent_bytes(d: ModelDesc, n_seq: int, n_layers: int | None = None) -> int:
    """RecurrentState::bytes_needed: live state + one checkpoint per sequence, float32, for
    n_layers of the GDN blocks (all by default)."""
    if not d.n_state_layer:
        return 0
    layers = d.n_state_layer if n_layers is None else n_layers
    return 2 * 4 * n_seq * (d.recurrent_floats_per_seq // d.n_state_layer) * layers


def attention_scratch_floats(d: ModelDesc, n_cells: int) -> int:
    n_rep, hd = d.n_head // d.n_head_kv, d.head_dim
    cell_group = 8  # attention.cpp kCellGroup
    k_rows = cell_group * 16 * -(-hd // 16)  # K rows in 16-float chunks
    queries = 16 * -(-n_rep // 4) * -(-hd // 4)  # four heads to a vector, four dimensions a step
    return n_rep * n_cells + n_rep * hd + 2 * n_rep + k_rows + queries


def activation_floats(d: ModelDesc, nb: int) -> int:
    per_token = 2 * d.n_embd + 2 * d.n_embd_q + 2 * d.n_embd_kv + 2 * d.n_ff + d.n_rot
    if d.attn_output_gate:
        per_token += 3 * d.n_embd_q
    if d.n_state_layer:
        v_dim = d.ssm_n_v_heads * d.ssm_dv
        per_token += d.ssm_conv_dim + 2 * v_dim + 2 * d.ssm_n_v_heads
    return nb * per_token


def cpu_compute_bytes(d: ModelDesc, n_ctx: int, n_batch: int, n_threads: int) -> int:
    """Context compute_layout(...).total * sizeof(float)."""
    nb = min(n_batch, n_ctx)
    return 4 * (activation_floats(d, nb) + n_threads * attention_scratch_floats(d, n_ctx))


def logits_bytes(d: ModelDesc, n_seq: int) -> int:
    return 4 * n_seq * d.n_vocab


GPU_ALIGN = 256
GPU_LOGITS_ROWS = 64
GPU_FLASH_PARTIAL_ROWS = 512 * 16   # cpp/backends/cuda/flash_attention.cu flash_partial_floats


def _align(n: int) -> int:
    return (n + GPU_ALIGN - 1) // GPU_ALIGN * GPU_ALIGN


def gpu_context_bytes(d: ModelDesc, n_ctx: int, n_batch: int, type_k: str, type_v: str, n_gpu: int,
                      output: bool, flash_attn: bool = False, n_gpu_state: int = 0, n_seq: int = 1) -> dict:
    """The CUDA context allocation (cpp/backends/cuda/gpu_context.cu layout): kv (n_gpu KV
    layers), recurrent (n_gpu_state GDN layers, n_seq sequences), compute, logits."""
    nb = min(n_batch, n_ctx)
    v_dim = d.ssm_n_v_heads * d.ssm_dv
    pieces_kv = [n_gpu * n_ctx * type_info(type_k).row_bytes(d.n_embd_kv),
                 n_gpu * n_ctx * type_info(type_v).row_bytes(d.n_embd_kv)]
    per_seq = (d.recurrent_floats_per_seq // d.n_state_layer) * n_gpu_state if d.n_state_layer else 0
    pieces_rs = [4 * n_seq * per_seq] * 2 if per_seq else []
    pieces = [4 * nb * d.n_embd, 4 * nb * d.n_embd, 4 * nb * d.n_embd_q, 4 * nb * d.n_embd_q,
              4 * nb * d.n_embd_kv, 4 * nb * d.n_embd_kv, 4 * nb * d.n_ff, 4 * nb * d.n_ff, 4 * nb * d.n_rot,
              nb * max(d.n_embd, d.n_embd_q, d.n_ff, v_dim), 4 * nb, 4 * nb, 4 * nb, 4 * nb, 8 * nb,
              4 * n_ctx, 8 * n_ctx, 4]
    if d.n_state_layer:   # token sequence ids, query+gate, gate, qkv, z, alpha, beta, o
        pieces += [4 * nb, 4 * nb * 2 * d.n_embd_q, 4 * nb * d.n_embd_q, 4 * nb * d.ssm_conv_dim, 4 * nb * v_dim,
                   4 * nb * d.ssm_n_v_heads, 4 * nb * d.ssm_n_v_heads, 4 * nb * v_dim]
    if flash_attn:
        pieces.append(4 * GPU_FLASH_PARTIAL_ROWS * (d.head_dim + 2))
    total = 0
    kv = rs_end = 0
    for i, b in enumerate(pieces_kv + pieces_rs + pieces):
        total = (_align(total) if i else 0) + b
        if i == len(pieces_kv) - 1:
            kv = total
        if pieces_rs and i == len(pieces_kv) + len(pieces_rs) - 1:
            rs_end = _align(total)
    recurrent = rs_end - kv if pieces_rs else 0
    before_logits = _align(total)
    logits = 4 * min(nb, GPU_LOGITS_ROWS) * d.n_vocab if output else 0
    return {"kv_bytes": kv, "recurrent_bytes": recurrent, "compute_bytes": before_logits - kv - recurrent,
            "logits_bytes": logits}


# ----- the plan -----

def _gpu_holds(t, n_gpu: int, all_on_gpu: bool) -> bool:
    if t.name == "prism.hadamard.sign_values":
        return n_gpu > 0       # every sign vector goes up with the first offloaded layer
    if t.layer is not None:
        return t.layer < n_gpu
    if t.role == ROLE_EMBD:
        return False
    if t.name == "rope_freqs.weight":
        return False           # the rope table is built on the host
    return all_on_gpu          # output_norm, output


def _device(name: str) -> dict:
    return {"device": name, "weights_by_type": {}, "weights_bytes": 0, "kv_bytes": 0,
            "recurrent_bytes": 0, "compute_bytes": 0, "logits_bytes": 0, "overhead_bytes": 0,
            "overhead_items": {}, "read_per_token_bytes": 0, "n_layers": 0}


def _add_weight(dev: dict, t, nbytes: int | None = None, type_name: str | None = None) -> None:
    b = t.nbytes if nbytes is None else nbytes
    name = t.type_name if type_name is None else type_name
    dev["weights_by_type"][name] = dev["weights_by_type"].get(name, 0) + b
    dev["weights_bytes"] += b


def _read_bytes(t) -> int:
    """Bytes of tensor t read by one decode step (the engine reads 1-D tensors as float copies)."""
    if t.role == ROLE_VECTOR:
        return 4 * t.n_elements
    if t.role == ROLE_EMBD:
        return t.nbytes // (t.n_elements // t.n_cols)
    return t.nbytes


def n_gpu_layers(d: ModelDesc, p: PlanParams) -> int:
    """Offloaded blocks: -1 or more than n_layer means all (as the engine)."""
    return d.n_layer if p.n_gpu_layers < 0 or p.n_gpu_layers > d.n_layer else p.n_gpu_layers


def device_budgets(d: ModelDesc, p: PlanParams, n_ctx: int | None = None) -> dict[str, dict]:
    """Per device ("CPU", and "GPU" when --n-gpu-layers > 0): itemized bytes at context n_ctx."""
    n_ctx = p.n_ctx if n_ctx is None else n_ctx
    n_gpu = n_gpu_layers(d, p)
    all_on_gpu = n_gpu == d.n_layer
    threads = resolve_threads(p.n_threads)
    cpu = _device("CPU")
    cpu["n_layers"] = d.n_layer - n_gpu
    devs = {"CPU": cpu}
    gpu = None
    if n_gpu > 0:
        gpu = _device("GPU")
        gpu["n_layers"] = n_gpu
        gpu["estimate"] = True        # the runtime allowance; the rest is the engine's layout
        devs["GPU"] = gpu
    for t in d.tensors:
        dev = gpu if gpu is not None and _gpu_holds(t, n_gpu, all_on_gpu) else cpu
        if dev is gpu and t.role == ROLE_VECTOR:      # 1-D tensors live on the GPU as F32 copies
            _add_weight(gpu, t, 4 * t.n_elements, "F32")
        else:
            _add_weight(dev, t)
        dev["read_per_token_bytes"] += _read_bytes(t)
        if t.role == ROLE_VECTOR:                     # the engine's float32 copies at load (all)
            cpu["overhead_items"]["1-D tensors as float32"] = (
                cpu["overhead_items"].get("1-D tensors as float32", 0) + 4 * t.n_elements)
        if t.role == ROLE_EMBD and d.tied:
            head = gpu if gpu is not None and all_on_gpu else cpu
            if head is gpu:
                _add_weight(gpu, t)   # the tied head needs its own copy on the GPU
            head["read_per_token_bytes"] += t.nbytes
    cpu["kv_bytes"] = kv_bytes(d, n_ctx, p.type_k, p.type_v,
                               d.n_kv_layer - d.kv_layers_below(n_gpu))
    n_gpu_state = n_gpu - d.kv_layers_below(n_gpu) if d.n_state_layer else 0
    cpu["recurrent_bytes"] = recurrent_bytes(d, p.n_parallel,   # host memory (the live state and
                                             d.n_state_layer - n_gpu_state)
    cpu["read_per_token_bytes"] += cpu["recurrent_bytes"] // 2  # its checkpoint); a step reads one
    cpu["logits_bytes"] = logits_bytes(d, p.n_parallel)
    nb = min(p.n_batch, n_ctx)
    if n_gpu < d.n_layer:
        cpu["compute_bytes"] = cpu_compute_bytes(d, n_ctx, p.n_batch, threads)
    else:
        cpu["compute_bytes"] = 4 * nb * (d.n_embd + d.n_rot)   # embeddings + rope table for upload
    vocab_text = d.vocab_text_bytes if d.vocab_text_bytes is not None else \
        VOCAB_TEXT_ESTIMATE * d.n_vocab
    cpu["overhead_items"]["vocabulary (estimate)"] = vocab_text + VOCAB_ENTRY_BYTES * d.n_vocab
    if gpu is not None:
        g = gpu_context_bytes(d, n_ctx, p.n_batch, p.type_k, p.type_v, d.kv_layers_below(n_gpu),
                              all_on_gpu, p.flash_attn, n_gpu_state, p.n_parallel)
        gpu["kv_bytes"] = g["kv_bytes"]
        gpu["recurrent_bytes"] = g["recurrent_bytes"]
        gpu["read_per_token_bytes"] += g["recurrent_bytes"] // 2
        gpu["compute_bytes"] = g["compute_bytes"]
        gpu["logits_bytes"] = g["logits_bytes"]
        gpu["overhead_items"]["runtime allowance (estimate)"] = p.gpu_overhead
    for dev in devs.values():
        dev["overhead_bytes"] = sum(dev["overhead_items"].values())
        dev["total_bytes"] = (dev["weights_bytes"] + dev["kv_bytes"] + dev["recurrent_bytes"]
                              + dev["compute_bytes"] + dev["logits_bytes"] + dev["overhead_bytes"])
    return devs


def budget_device(p: PlanParams) -> str:
    return "GPU" if p.n_gpu_layers != 0 else "CPU"


def largest_context(d: ModelDesc, p: PlanParams) -> int:
    """Largest n_ctx whose budgeted device total fits p.memory (0 when not even one cell fits)."""
    dev = budget_device(p)

    def fits(n: int) -> bool:
        return device_budgets(d, p, n)[dev]["total_bytes"] <= p.memory

    if not fits(1):
        return 0
    lo, hi = 1, MAX_CTX
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def decode_ceiling(d: ModelDesc, p: PlanParams, n_ctx: int) -> dict | None:
    """Tokens/s limit from bandwidth with n_ctx cells in use (None without the bandwidths)."""
    devs = device_budgets(d, p, n_ctx)
    if "GPU" in devs:
        bw = {"GPU": p.bandwidth, "CPU": p.cpu_bandwidth}
    else:
        bw = {"CPU": p.bandwidth}
    seconds, read = 0.0, 0
    for name, dev in devs.items():
        b = dev["read_per_token_bytes"] + dev["kv_bytes"]
        if name == "CPU" and "GPU" in devs and dev["n_layers"] == 0 and not bw["CPU"]:
            continue          # only the embedding row and the logits: negligible
        if not bw[name]:
            return None
        seconds += b / bw[name]
        read += b
    return {"n_ctx": n_ctx, "bytes_per_step": read, "step_seconds": seconds,
            "tokens_per_s": p.n_parallel / seconds if seconds else float("inf"),
            "per_sequence_tokens_per_s": 1.0 / seconds if seconds else float("inf")}


def make_plan(d: ModelDesc, p: PlanParams) -> dict:
    """The whole report as a JSON-ready dict."""
    check_params(d, p)
    devs = device_budgets(d, p)
    plan = {
        "model": {"source": d.source, "scheme": d.scheme, "arch": d.arch, "n_layer": d.n_layer,
                  "n_embd": d.n_embd, "n_ff": d.n_ff, "n_head": d.n_head, "n_head_kv": d.n_head_kv,
                  "head_dim": d.head_dim, "n_vocab": d.n_vocab, "tied_output": d.tied,
                  "n_params": d.n_params, "weights_bytes": sum(t.nbytes for t in d.tensors),
                  "linear_bpw": round(d.linear_bpw(), 4), "n_kv_layer": d.n_kv_layer,
                  "n_recurrent_layer": d.n_state_layer},
        "settings": {"n_ctx": p.n_ctx, "n_batch": min(p.n_batch, p.n_ctx),
                     "n_parallel": p.n_parallel, "n_threads": resolve_threads(p.n_threads),
                     "type_k": p.type_k.lower(), "type_v": p.type_v.lower(),
                     "n_gpu_layers": n_gpu_layers(d, p), "flash_attn": p.flash_attn},
        "devices": devs,
        "notes": list(d.notes),
    }
    if "GPU" in devs:
        plan["notes"].append("GPU weights, KV cache, compute buffers and logits are the CUDA "
                             "backend's allocations; the runtime overhead is an allowance")
    if p.memory is not None:
        dev = budget_device(p)
        total = devs[dev]["total_bytes"]
        plan["budget"] = {"device": dev, "memory_bytes": p.memory, "fits": total <= p.memory,
                          "free_bytes": p.memory - total, "max_ctx": largest_context(d, p)}
    if p.bandwidth:
        ceil = {"at_empty": decode_ceiling(d, p, min(p.n_parallel, p.n_ctx)),
                "at_ctx": decode_ceiling(d, p, p.n_ctx)}
        mx = plan.get("budget", {}).get("max_ctx")
        if mx:
            ceil["at_max_ctx"] = decode_ceiling(d, p, mx)
        if ceil["at_ctx"] is None:
            plan["notes"].append("no decode ceiling: layers are split between GPU and CPU; give "
                                 "the CPU's bandwidth with --cpu-bandwidth")
        else:
            plan["decode_ceiling"] = ceil
    return plan


# ----- units -----

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str, what: str = "--memory", default_unit: str = "gib") -> int:
    """'24GiB', '24 GB', '512MiB', '24' (default unit) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = (m.group(2).lower() if m else "") or default_unit
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise BonsaiError(f"{what} {text!r}: expected a positive size such as 24GiB, 24GB or "
                          "512MiB")
    return int(float(m.group(1)) * _UNITS[unit])


def parse_bandwidth(text: str, what: str = "--bandwidth") -> float:
    """'1008GB/s', '1TB/s', '60GiB/s', '1008' (GB/s) -> bytes/s."""
    s = str(text).strip()
    if s.lower().endswith("/s"):
        s = s[:-2]
    try:
        return float(parse_size(s, what, default_unit="gb"))
    except BonsaiError:
        raise BonsaiError(f"{what} {text!r}: expected a positive rate such as 1008GB/s or "
                          "60GiB/s") from None


def format_bytes(n: float) -> str:
    n = float(n)
    for u in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or u == "GiB":
            return f"{n:.0f} {u}" if u == "B" else f"{n:.2f} {u}"
        n /= 1024
    return f"{n:.2f} GiB"


def format_plan(plan: dict) -> str:
    m, s, devs = plan["model"], plan["settings"], plan["devices"]
    out = [f"model: {m['source']} ({m['arch']}, {m['n_layer']} layers, n_embd {m['n_embd']}, "
           f"n_ff {m['n_ff']}, heads {m['n_head']}/{m['n_head_kv']} x {m['head_dim']}, "
           f"vocab {m['n_vocab']}{', tied output' if m['tied_output'] else ''})",
           f"types: {m['scheme']}; {m['n_params'] / 1e9:.2f} B parameters, "
           f"{format_bytes(m['weights_bytes'])}, linear layers {m['linear_bpw']:.3f} bpw",
           f"context: {s['n_ctx']} cells over {s['n_parallel']} sequence(s), batch {s['n_batch']}, "
           f"KV {s['type_k']}/{s['type_v']}, {s['n_threads']} threads, "
           f"{s['n_gpu_layers']} layer(s) on the GPU"
           f"{', flash attention' if s['flash_attn'] else ''}",
           ""]
    names = list(devs)
    head = ["CPU" if n == "CPU" else "GPU (estimate)" for n in names]
    rows: list[tuple[str, list[str]]] = []
    types = sorted({t for d in devs.values() for t in d["weights_by_type"]})
    rows.append(("weights", [format_bytes(devs[n]["weights_bytes"]) for n in names]))
    for t in types:
        rows.append((f"  {t}", [format_bytes(devs[n]["weights_by_type"].get(t, 0)) for n in names]))
    hybrid = m.get("n_recurrent_layer", 0) > 0
    n_kv = m.get("n_kv_layer", 0)
    kv_of = f", {n_kv} attention layer{'' if n_kv == 1 else 's'}" if hybrid else ""
    rows.append((f"KV cache ({s['type_k']}/{s['type_v']}{kv_of})",
                 [format_bytes(devs[n]["kv_bytes"]) for n in names]))
    if hybrid:
        rows.append((f"recurrent state ({m['n_recurrent_layer']} GDN layers, x2 checkpoint)",
                     [format_bytes(devs[n]["recurrent_bytes"]) for n in names]))
    rows.append(("compute buffers", [format_bytes(devs[n]["compute_bytes"]) for n in names]))
    rows.append(("logits", [format_bytes(devs[n]["logits_bytes"]) for n in names]))
    rows.append(("runtime overhead", [format_bytes(devs[n]["overhead_bytes"]) for n in names]))
    items = sorted({k for d in devs.values() for k in d["overhead_items"]})
    for k in items:
        rows.append((f"  {k}", [format_bytes(devs[n]["overhead_items"].get(k, 0)) for n in names]))
    rows.append(("total", [format_bytes(devs[n]["total_bytes"]) for n in names]))
    w0 = max(len(r[0]) for r in rows) + 2
    ws = [max(len(h), *(len(r[1][i]) for r in rows)) + 2 for i, h in enumerate(head)]
    out.append(" " * w0 + "".join(h.rjust(w) for h, w in zip(head, ws)))
    for label, vals in rows:
        out.append(label.ljust(w0) + "".join(v.rjust(w) for v, w in zip(vals, ws)))
    out.append("")
    b = plan.get("budget")
    if b:
        verdict = (f"fits, {format_bytes(b['free_bytes'])} to spare" if b["fits"] else
                   f"does NOT fit: {format_bytes(-b['free_bytes'])} over")
        out.append(f"budget: {b['memory_bytes'] / 1e9:.2f} GB = {format_bytes(b['memory_bytes'])} "
                   f"on the {b['device']}: {verdict}")
        per_seq = (f" = {b['max_ctx'] // s['n_parallel']} per sequence"
                   if s["n_parallel"] > 1 else "")
        out.append(f"largest context that fits: {b['max_ctx']} tokens{per_seq}" if b["max_ctx"] else
                   "largest context that fits: none (weights and buffers alone exceed the budget)")
    c = plan.get("decode_ceiling")
    if c:
        for key, label in (("at_empty", "empty context"), ("at_ctx", f"{s['n_ctx']} tokens"),
                           ("at_max_ctx", "the largest context")):
            e = c.get(key)
            if e:
                par = (f" ({e['per_sequence_tokens_per_s']:.1f} per sequence)"
                       if s["n_parallel"] > 1 else "")
                out.append(f"decode ceiling at {label} ({e['n_ctx']} cells in use): "
                           f"{e['tokens_per_s']:.1f} tokens/s{par}, "
                           f"{format_bytes(e['bytes_per_step'])} read per step")
    for n in plan["notes"]:
        out.append(f"note: {n}")
    return "\n".join(out) + "\n"
