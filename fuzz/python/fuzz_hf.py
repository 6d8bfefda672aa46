"""Fuzzes the Hugging Face directory readers: config.json (convert/hf_reader.read_json and the
architecture families' hyperparameter parsing), the safetensors header parser and tensor reads
(convert/safetensors_file.py), and the shard index. Only BonsaiError may escape.

An input is a "bundle" of files, repeated (u8 name length, name, u32 little-endian size, bytes);
names are reduced to [A-Za-z0-9._-] and the files written into a fresh directory, which is then
opened as a checkpoint. Usage: see harness.py; seeds: make_seeds.py (OUT/hf)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

M = {}
SCRATCH = harness.scratch_dir()
MAX_FILES = 6


def _imports() -> None:
    from bonsai_runner.convert import arch, hf_reader, safetensors_file

    M["arch"], M["hf_reader"], M["safetensors_file"] = arch, hf_reader, safetensors_file


def unbundle(data: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    i = 0
    while i < len(data) and len(files) < MAX_FILES:
        n = data[i]
        name = re.sub(r"[^A-Za-z0-9._-]", "_", data[i + 1:i + 1 + n].decode("latin-1")).lstrip(".")
        i += 1 + n
        if i + 4 > len(data):
            break
        (size,) = struct.unpack_from("<I", data, i)
        i += 4
        files[name or "_"] = data[i:i + size]
        i += size
    return files


def _read_config(d) -> None:
    """config.json alone through the architecture families (reached even when the weights are bad)."""
    cfg = M["hf_reader"].read_json(d / "config.json")
    if isinstance(cfg, dict):
        fam = M["arch"].family_for(cfg, str(d / "config.json"))
        fam.metadata()
        fam.tensor_specs()


def _read(d) -> None:
    for name in os.listdir(d):
        if name.endswith(".safetensors"):
            sf = M["safetensors_file"].SafetensorsFile(d / name)
            for t in list(sf.entries)[:16]:
                sf.read_raw(t)
    ck = M["hf_reader"].HfCheckpoint(d)
    for name in ck.tensor_names()[:16]:
        ck.shape(name), ck.dtype(name)
        if ck.dtype(name) in M["safetensors_file"].FLOAT_DTYPES:
            ck.read_float32(name)
        else:
            ck.read_raw(name)
    ck.float_source_dtype()
    ck.optional_json("tokenizer_config.json")
    fam = M["arch"].family_for(ck.config, str(d / "config.json"))
    fam.metadata()
    fam.validate_tensors({n: ck.shape(n) for n in ck.tensor_names()}, str(d))


def one_input(data: bytes) -> None:
    d = SCRATCH / "model"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for name, blob in unbundle(data).items():
        (d / name).write_bytes(blob)
    harness.expect_bonsai_error(lambda: _read_config(d))
    harness.expect_bonsai_error(lambda: _read(d))


if __name__ == "__main__":
    harness.main(one_input, _imports)
