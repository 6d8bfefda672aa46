"""The quantizer on GGUF input (quantize/gguf_input.py, quantize/gguf_tokenizer.py).

Fixtures: tiny llama (SentencePiece) and qwen2 (byte-level BPE) models made in HF layout
(tests/model_factory.py) and converted to F16 and Q8_0 GGUF by the project's converter.
Oracles: the HF checkpoint's own values (F16 GGUF holds them exactly, so the llama q/k
un-permutation must give them back bit for bit); the quantizer's output on the HF directory
(same weights and same tokenization for qwen2 -> the same bytes); the input file's tokenizer.*
metadata (carried through to the output GGUF unchanged); the engine running the output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_factory import make_hf_model, write_calibration

from bonsai_runner.convert import convert
from bonsai_runner.convert.hf_reader import HfCheckpoint
from bonsai_runner.errors import BonsaiError
from bonsai_runner.quantize import QuantizeOptions, quantize_model
from bonsai_runner.quantize.gguf_input import GgufCheckpoint

SMALL = dict(hidden=128, ffn=256, n_layer=2, n_head=4, n_head_kv=2)
FAST = dict(seq_len=32, max_samples=8, batch_size=4, progress=False)


def quiet(msg):
    pass


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    base = tmp_path_factory.mktemp("gguf_in")
    out = {}
    for arch, tok in (("llama", "spm"), ("qwen2", "bpe")):
        m = make_hf_model(base / arch, arch=arch, tokenizer=tok, seed=3, **SMALL)
        files = {}
        for t in ("f16", "q8_0"):
            files[t] = base / f"{arch}-{t}.gguf"
            convert(str(m["dir"]), str(files[t]), t, progress=False, log=quiet)
        out[arch] = {"model": m, **files}
    out["calib"] = write_calibration(base / "calib.jsonl")
    return out


def _tokenizer_metadata(path) -> dict:
    from bonsai_runner.gguf_reader import open_gguf

    with open_gguf(path) as g:
        return {k: v for k, v in g.metadata.items() if k.startswith("tokenizer.")}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_weights_and_config_match_the_hf_checkpoint(ggufs, arch):
    m = ggufs[arch]["model"]
    hf = HfCheckpoint(m["dir"])
    for t, tol in (("f16", 0.0), ("q8_0", 0.01)):
        ck = GgufCheckpoint(ggufs[arch][t])
        try:
            assert set(ck.tensor_names()) == set(hf.tensor_names())
            for n in hf.tensor_names():
                assert ck.shape(n) == hf.shape(n), n
                diff = np.abs(ck.read_float32(n) - hf.read_float32(n)).max()
                assert diff <= tol * max(np.abs(hf.read_float32(n)).max(), 1e-6), (t, n, diff)
            for k in ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "vocab_size",
                      "tie_word_embeddings", "rope_theta"):
                assert ck.config[k] == hf.config[k], k
            assert ck.config["rms_norm_eps"] == pytest.approx(hf.config["rms_norm_eps"], rel=1e-6)
        finally:
            ck.close()
        assert not ck.tokenizer_dir.exists()


def test_qwen2_gguf_input_gives_the_hf_result_bit_for_bit(ggufs, tmp_path):
    a, b = tmp_path / "from-hf", tmp_path / "from-gguf"
    g = ggufs["qwen2"]
    quantize_model(QuantizeOptions(model_dir=str(g["model"]["dir"]), output_dir=str(a),
                                   calib_file=str(ggufs["calib"]), **FAST), log=quiet)
    res = quantize_model(QuantizeOptions(model_dir=str(g["f16"]), output_dir=str(b),
                                         calib_file=str(ggufs["calib"]), **FAST), log=quiet)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    qc = json.loads((b / "quant_config.json").read_text())
    assert qc["calibration"]["model_source"]["gguf"] == str(g["f16"])
    assert res["summary"]["tensors_by_type"]["ptq1_0"] == 12


@pytest.mark.parametrize("arch,src", [("llama", "f16"), ("llama", "q8_0"), ("qwen2", "q8_0")])
def test_gguf_input_quantizes_converts_and_runs(ggufs, tmp_path, arch, src):
    from bonsai_runner.llama import Llama

    g = ggufs[arch]
    out, gg = tmp_path / "ptq1", tmp_path / "q.gguf"
    quantize_model(QuantizeOptions(model_dir=str(g[src]), output_dir=str(out), outfile=str(gg),
                                   calib_file=str(ggufs["calib"]), **FAST), log=quiet)
    names = {p.name for p in out.iterdir()}
    assert ("tokenizer.model" if arch == "llama" else "tokenizer.json") in names
    assert _tokenizer_metadata(gg) == _tokenizer_metadata(g[src])
    with Llama(str(gg), n_ctx=64, logits_all=True, verbose=False) as llm:
        ids = llm.tokenize("def add(a, b):".encode())
        llm.eval(ids)
        logits = np.asarray(llm.scores[len(ids) - 1])
        assert logits.shape == (g["model"]["n_vocab"],)
        assert np.all(np.isfinite(logits)) and logits.std() > 0


def test_gguf_input_errors(ggufs, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(BonsaiError, match="bad.gguf"):
        quantize_model(QuantizeOptions(model_dir=str(bad), output_dir=str(tmp_path / "o"),
                                       **FAST), log=quiet)
    assert not (tmp_path / "o").exists()
