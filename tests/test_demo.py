"""Tests of `bonsai demo --tiny` (the whole pipeline on a generated model) and of the GGUF ->
Hugging Face exporter the real-model demo feeds the quantizer with."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from bonsai_runner.errors import BonsaiError
from bonsai_runner.gguf_reader import open_gguf
from conftest import run_cli
from model_factory import make_hf_model


def _has_engine() -> bool:
    try:
        from bonsai_runner import _core
    except ImportError:
        return False
    return hasattr(_core, "Context")


engine = pytest.mark.skipif(not _has_engine(), reason="needs the native engine")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_export_hf_round_trip(tmp_path, arch):
    """HF -> GGUF -> exported HF -> GGUF gives the same tensors and tokenizer metadata."""
    from bonsai_runner.convert import convert
    from bonsai_runner.export_hf import export_hf

    m = make_hf_model(tmp_path / "hf", arch=arch, tokenizer="bpe", vocab=400, seed=2)
    first = tmp_path / "a.gguf"
    convert(str(m["dir"]), str(first), "f16", progress=False, log=lambda s: None)
    out = export_hf(first, tmp_path / "exported")
    assert not list(tmp_path.glob("*.tmp"))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == 400 and cfg["model_type"] == arch
    second = tmp_path / "b.gguf"
    convert(str(out), str(second), "f16", progress=False, log=lambda s: None)
    with open_gguf(first) as a, open_gguf(second) as b:
        ma, mb = a.metadata, b.metadata
        diff = [k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k) and k != "general.name"]
        assert diff == []
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
        for t in a.tensors:
            assert np.array_equal(a.tensor_array(t.name), b.tensor_array(t.name)), t.name


def test_export_refuses_llama_and_existing_output(tmp_path):
    from bonsai_runner.convert import convert
    from bonsai_runner.export_hf import export_hf

    m = make_hf_model(tmp_path / "hf", arch="llama", tokenizer="bpe", seed=2)
    g = tmp_path / "l.gguf"
    convert(str(m["dir"]), str(g), "f16", progress=False, log=lambda s: None)
    with pytest.raises(BonsaiError, match="architecture 'llama'"):
        export_hf(g, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    (tmp_path / "exists").mkdir()
    with pytest.raises(BonsaiError, match="already exists"):
        export_hf(g, tmp_path / "exists")


@engine
def test_demo_tiny_end_to_end(tmp_path):
    p = run_cli("demo", "--tiny", "--cache", tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    for n in range(1, 7):
        assert f"=== step {n} " in out
    assert "fallback layer table" in p.stdout + p.stderr
    assert re.search(r"PPL ratio     : [\d.]+", out)
    assert re.search(r"verdict: (PASS|FAIL)", out)
    assert re.search(r"PTQ1_0 is [\d.]+x smaller than F16", out)
    q = tmp_path / "demo-tiny" / "tiny-ptq1_0.gguf"
    with open_gguf(q) as r:
        assert any(t.type_name == "PTQ1_0" for t in r.tensors)
        assert "bonsai.fallback_table" in r.metadata


@engine
def test_demo_tiny_without_cache_does_not_point_at_its_removed_directory(tmp_path):
    """Without --cache the work directory is temporary: the summary must not send the user
    there once it is gone (issue #13)."""
    import os

    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = run_cli("demo", "--tiny", "--max-samples", "2", "--seq-len", "32", "--chunks", "2",
                timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = p.stdout[p.stdout.index("demo finished"):]
    assert "--cache DIR to keep them" in summary
    # the temporary directory really is gone; torchinductor_<user> is torch's own cache directory,
    # which torch creates in TMPDIR when transformers imports torch._dynamo (not a demo file)
    assert [p for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")] == []
    for path in re.findall(re.escape(str(tmp_path)) + r"\S*", summary):
        assert os.path.exists(path.rstrip(".;,")), f"the summary names {path}, which does not exist"
