"""What a GGUF file holds: metadata, tensor types, size breakdown and the fallback layer table.

``inspect_file(path)`` builds a JSON-serializable report; ``format_report(report)`` renders it as
text (the same facts as ``bonsai_run --inspect``). Bits per weight are reported honestly, block
scales included: stored bytes * 8 / elements over the linear layers of the blocks (2-D
``blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight``), and file size * 8 /
all elements over the whole file.

The fallback layer table (which tensors were kept at a wider type than the ternary default, and
why) is read from ``bonsai.fallback_table``: a JSON string holding a list of objects with at least
``tensor``, ``type`` and ``reason`` (an ARRAY[STRING] of one JSON object per row is accepted too).

Strings that are not valid UTF-8 (the reader keeps them as surrogate escapes) are shown with each
bad byte as ``\\xNN`` and listed under ``invalid_utf8`` with a warning, so the report always
prints and serializes; anything else malformed is a BonsaiError from the reader.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from .errors import BonsaiError
from .gguf_reader import escape_invalid_utf8, has_invalid_utf8, open_gguf
from .hadamard import format_rotation

FALLBACK_KEY = "bonsai.fallback_table"
LINEAR_RE = re.compile(
    r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
MAX_ITEMS = 8        # array elements shown
MAX_STRING = 120     # characters of a string value shown


def is_linear_weight(name: str) -> bool:
    return LINEAR_RE.fullmatch(name) is not None


def _printable(v: Any) -> Any:
    """`v` (str, or lists/dicts of them, any depth) with invalid-UTF-8 bytes written as \\xNN."""
    if isinstance(v, str):
        return escape_invalid_utf8(v) if has_invalid_utf8(v) else v
    if isinstance(v, list):
        return [_printable(x) for x in v]
    if isinstance(v, dict):
        return {_printable(k): _printable(x) for k, x in v.items()}
    return v


def _holds_invalid_utf8(v: Any) -> bool:
    if isinstance(v, str):
        return has_invalid_utf8(v)
    return isinstance(v, list) and any(isinstance(x, str) and has_invalid_utf8(x) for x in v)


def summarize_value(value: Any, type_name: str) -> dict:
    """{"type", "value"} for scalars; long strings shortened with their "length"; arrays as
    {"type", "count", "first": first few items}."""
    if type_name.startswith("ARRAY"):
        first = [summarize_value(v, "STRING")["value"] if isinstance(v, str) else v
                 for v in value[:MAX_ITEMS]]
        return {"type": type_name, "count": len(value), "first": first}
    if isinstance(value, str) and len(value) > MAX_STRING:
        return {"type": type_name, "value": _printable(value[:MAX_STRING]), "length": len(value)}
    return {"type": type_name, "value": _printable(value)}


def parse_fallback_table(path: str, value: Any) -> list[dict]:
    """Rows of the fallback layer table stored under FALLBACK_KEY."""
    try:
        rows = json.loads(value) if isinstance(value, str) else [json.loads(v) for v in value]
    except (TypeError, json.JSONDecodeError) as e:
        raise BonsaiError(f"{path}: metadata key {FALLBACK_KEY} is not valid JSON ({e}); the file "
                          "was written by a broken converter, re-convert it") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise BonsaiError(f"{path}: metadata key {FALLBACK_KEY} must be a list of objects with "
                          "tensor, type and reason; re-convert the file")
    return _printable(rows)


def _architecture(md: dict) -> dict:
    arch = md.get("general.architecture")
    out = {"arch": arch, "name": md.get("general.name")}
    for field in ("block_count", "embedding_length", "feed_forward_length", "context_length"):
        out[field] = md.get(f"{arch}.{field}")
    out["head_count"] = md.get(f"{arch}.attention.head_count")
    out["head_count_kv"] = md.get(f"{arch}.attention.head_count_kv")
    out = {k: _printable(v) if isinstance(v, str) else v for k, v in out.items()}
    tokens = md.get("tokenizer.ggml.tokens")
    out["vocab_size"] = len(tokens) if isinstance(tokens, list) else None
    return out


def inspect_file(path: str | os.PathLike, use_mmap: bool = True) -> dict:
    """The report of one file (raises BonsaiError for files that do not open)."""
    path = os.fspath(path)
    with open_gguf(path, use_mmap) as g:
        md, types = g.metadata, g.metadata_types
        tensors = [{"name": t.name, "type": t.type_name, "shape": list(t.shape),
                    "elements": t.n_elements, "nbytes": t.nbytes, "offset": t.offset,
                    "supported": t.supported} for t in g.tensors]
        report = {
            "path": path, "file_size": g.file_size, "version": g.version,
            "alignment": g.alignment, "data_offset": g.data_offset,
        }
    report["architecture"] = _architecture(md)
    report["path"] = _printable(path)
    report["metadata"] = {k: summarize_value(v, types[k]) for k, v in md.items()}
    report["invalid_utf8"] = [k for k, v in md.items() if _holds_invalid_utf8(v)]
    report["tensors"] = tensors

    by_type: dict[str, dict] = {}
    for t in tensors:
        x = by_type.setdefault(t["type"], {"tensors": 0, "elements": 0, "bytes": 0,
                                           "supported": t["supported"]})
        x["tensors"] += 1
        x["elements"] += t["elements"]
        x["bytes"] += t["nbytes"]
    for x in by_type.values():
        x["bpw"] = 8.0 * x["bytes"] / x["elements"] if x["elements"] else None
    report["types"] = dict(sorted(by_type.items()))

    linear = [t for t in tensors if len(t["shape"]) == 2 and is_linear_weight(t["name"])]
    lin_el = sum(t["elements"] for t in linear)
    lin_b = sum(t["nbytes"] for t in linear)
    total_el = sum(t["elements"] for t in tensors)
    report["bpw"] = {
        "linear": 8.0 * lin_b / lin_el if lin_el else None,
        "linear_tensors": len(linear), "linear_elements": lin_el, "linear_bytes": lin_b,
        "file": 8.0 * report["file_size"] / total_el if total_el else None,
        "total_elements": total_el,
    }
    report["unsupported"] = {k: x["tensors"] for k, x in report["types"].items()
                             if not x["supported"]}
    report["fallback_table"] = (parse_fallback_table(path, md[FALLBACK_KEY])
                                if FALLBACK_KEY in md else None)
    report["rotation"] = format_rotation(md)
    return report


def _human_bytes(n: int) -> str:
    x, unit = float(n), "B"
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if x < 1024:
            break
        x, unit = x / 1024, u
    return f"{n} B" if unit == "B" else f"{x:.2f} {unit}"


def format_table(rows: list[list[str]], header: list[str], right: set[int] = frozenset()) -> str:
    """Plain-text table, columns padded to their widest cell; `right` = right-aligned columns."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(lines)


def _value_text(s: dict) -> str:
    if "count" in s:
        items = ", ".join(json.dumps(v, ensure_ascii=False) for v in s["first"])
        more = ", ..." if s["count"] > len(s["first"]) else ""
        return f"[{s['count']} items] {items}{more}"
    if s["type"] == "FLOAT32":
        return str(np.float32(s["value"]))  # shortest text that reads back as the float32
    v = json.dumps(s["value"], ensure_ascii=False)
    return v + (f"... ({s['length']} chars)" if "length" in s else "")


def format_report(r: dict, tensors: bool = True) -> str:
    a = r["architecture"]
    out = [f"file: {r['path']} ({_human_bytes(r['file_size'])}, GGUF v{r['version']}, alignment "
           f"{r['alignment']}, {len(r['tensors'])} tensors, {len(r['metadata'])} metadata keys)"]
    parts = [f"{label} {a[k]}" for k, label in (
        ("block_count", "blocks"), ("vocab_size", "vocab"), ("embedding_length", "embedding"),
        ("feed_forward_length", "ffn"), ("head_count", "heads"), ("head_count_kv", "kv heads"),
        ("context_length", "context")) if a.get(k) is not None]
    out.append(f"architecture: {a['arch'] or '(general.architecture missing)'}"
               + (f" ({', '.join(parts)})" if parts else ""))
    if a.get("name"):
        out.append(f"name: {a['name']}")

    out += ["", "metadata:", format_table(
        [[k, s["type"], _value_text(s)] for k, s in r["metadata"].items()], ["key", "type", "value"])]
    if tensors:
        out += ["", "tensors:", format_table(
            [[t["name"], t["type"], " x ".join(map(str, t["shape"])), t["nbytes"]]
             for t in r["tensors"]], ["name", "type", "shape", "bytes"], right={3})]

    rows = [[k, x["tensors"], x["elements"], x["bytes"], "-" if x["bpw"] is None else f"{x['bpw']:.4f}"]
            for k, x in r["types"].items()]
    el = sum(x["elements"] for x in r["types"].values())
    by = sum(x["bytes"] for x in r["types"].values())
    rows.append(["total", len(r["tensors"]), el, by, f"{8.0 * by / el:.4f}" if el else "-"])
    out += ["", "totals per type:",
            format_table(rows, ["type", "tensors", "elements", "bytes", "bpw"], right={1, 2, 3, 4})]

    b = r["bpw"]
    out += ["", "bits per weight (stored bytes incl. scales):"]
    if b["linear"] is not None:
        out.append(f"  linear layers: {b['linear']:.4f} bpw over {b['linear_tensors']} tensors "
                   f"({b['linear_elements']} weights, {_human_bytes(b['linear_bytes'])})")
    else:
        out.append("  linear layers: none found (no blk.N.attn_*/ffn_* weights)")
    if b["file"] is not None:
        out.append(f"  whole file:    {b['file']:.4f} bpw ({_human_bytes(r['file_size'])} over "
                   f"{b['total_elements']} weights)")

    if r["fallback_table"] is not None:
        rows_ft = r["fallback_table"]
        cols = ["tensor", "type", "reason"]
        for row in rows_ft:
            cols += [k for k in row if k not in cols]
        out += ["", f"fallback layer table ({len(rows_ft)} tensors kept wider than ternary):"]
        if rows_ft:
            out.append(format_table([[_cell(row.get(c)) for c in cols] for row in rows_ft], cols))
        else:
            out.append("  (empty: every eligible tensor is ternary)")

    if r.get("invalid_utf8"):
        out += ["", f"warning: {len(r['invalid_utf8'])} metadata keys hold strings that are not valid "
                f"UTF-8 (bad bytes shown as \\xNN): {', '.join(r['invalid_utf8'][:MAX_ITEMS])}"
                + (", ..." if len(r["invalid_utf8"]) > MAX_ITEMS else "")]
    if r.get("rotation"):
        out += ["", r["rotation"]]
    if r["unsupported"]:
        n = sum(r["unsupported"].values())
        kinds = ", ".join(f"{k} ({v})" for k, v in r["unsupported"].items())
        out += ["", f"warning: {n} tensors have types the engine cannot run: {kinds}; re-convert "
                "the model with bonsai-convert to run it"]
    return "\n".join(out) + "\n"


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return v if isinstance(v, str) else json.dumps(v)
