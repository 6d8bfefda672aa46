"""Fuzzes the Python GGUF reader (bonsai_runner.gguf_reader) and what `bonsai inspect` does with a
file: open, metadata and types, tensor table, report, its text and JSON renderings encoded as
UTF-8 (as stdout would), and dequantizing the tensors. Only BonsaiError may escape.
Usage: see harness.py; seeds: make_seeds.py (OUT/gguf)."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

M = {}
PATH = harness.scratch_dir() / "input.gguf"


def _imports() -> None:
    from bonsai_runner import gguf_reader, inspect

    M["gguf_reader"], M["inspect"] = gguf_reader, inspect


def _read(use_mmap: bool) -> None:
    ins = M["inspect"]
    report = ins.inspect_file(PATH, use_mmap=use_mmap)
    ins.format_report(report).encode("utf-8")
    ins.format_report(report, tensors=False).encode("utf-8")
    json.dumps(report, indent=2, ensure_ascii=False).encode("utf-8")
    with M["gguf_reader"].open_gguf(PATH, use_mmap) as g:
        for key in g.metadata:
            g.value_type(key)
        for t in g.tensors[:16]:
            g.type_info(t.name)
            if t.nbytes <= 1 << 20:
                g.dequantize_tensor(t.name)


def one_input(data: bytes) -> None:
    PATH.write_bytes(data)
    harness.expect_bonsai_error(lambda: _read(use_mmap=bool(len(data) & 1)))


if __name__ == "__main__":
    harness.main(one_input, _imports)
