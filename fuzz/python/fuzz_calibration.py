"""Fuzzes the quantizer's calibration-file reader (quantize/calibration.read_samples: JSONL with a
"text" field per line, or plain text in blank-line separated samples) and the domain classifier
the report uses. The input is written as .jsonl or .txt (first byte's low bit) so both parsers
see every input shape. Only BonsaiError may escape. Usage: see harness.py; seeds: make_seeds.py."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

M = {}
SCRATCH = harness.scratch_dir()


def _imports() -> None:
    from bonsai_runner.quantize import calibration

    M["calibration"] = calibration


def _read(path) -> None:
    cal = M["calibration"]
    for text, domain in cal.read_samples(path):
        assert isinstance(text, str) and text.strip(), text
        assert domain is None or isinstance(domain, str)
        cal.classify(text)
        cal.split_chunks(text)


def one_input(data: bytes) -> None:
    path = SCRATCH / ("calib.jsonl" if data[:1] and data[0] & 1 else "calib.txt")
    for p in SCRATCH.iterdir():
        p.unlink()
    path.write_bytes(data)
    harness.expect_bonsai_error(lambda: _read(path))


if __name__ == "__main__":
    harness.main(one_input, _imports)
