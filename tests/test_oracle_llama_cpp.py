"""Upstream llama.cpp (llama-cpp-python) runs GGUF files as our numpy reference does.

First on F32 files written by the `gguf` package (tests/tiny_gguf.py, independent of our
converter): this pins the reference's conventions (rope modes, GQA, qwen2 biases, qwen3 q/k norms
and head size, linear rope scaling, rope_freqs factors, tied head) to llama.cpp's. Then tiny random
HF models of each architecture are converted by `bonsai convert` to F32, F16 and Q8_0, and ternary
ones (hidden and ffn multiples of 256, weights exactly s x {-1, 0, +1}) to TQ2_0 and Q2_0.
llama-cpp-python loads each file (so its metadata, tokenizer included, is what llama.cpp expects) and its
logits over a short sequence are compared with bonsai_runner.reference run on the same file's
dequantized weights.

Tolerances (max |llama.cpp - reference| / max |reference| measured on these fixtures in brackets).
llama.cpp is run with an F32 KV cache and without flash attention, so the differences come from its
matmuls: F32 weights are multiplied in float32 [6e-7; bound 1e-5]; F16 weights with the activations
rounded to fp16 [1.1e-3; bound 3e-3]. Q8_0, Q2_0 and TQ2_0 weights are multiplied with the
activations quantized to 8 bits per block (Q8_0 / Q8_K: up to 0.4% per element, compounded over the
layers of a random model): [Q8_0 3e-2, ternary 1.2e-2; bounds 6e-2 / 3e-2]. There, near-tied logits
of the random models may swap ranks (top-1 agreement measured 0.93-1.0; bound 0.85), and the logits
must stay correlated (1 - r measured <= 2.3e-4; bound 1e-3). A wrong block layout or element order
gives r near 0 and relative errors near 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from bonsai_runner.gguf_reader import open_gguf
from conftest import run_cli
from model_factory import make_hf_model
from tiny_gguf import make_hf_weights, write_gguf

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

pytestmark = pytest.mark.slow

ARCHS = {"llama": "spm", "qwen2": "bpe", "qwen3": "bpe"}
TEXT = "def add(a, b):\n    return a + b  # The quick brown fox, 你好 🚀 3.14159"
GGML_TYPE_F32 = 0


def _convert(tmp_path_factory, arch: str, outtype: str, ternary: bool):
    base = tmp_path_factory.mktemp(f"{arch}_{outtype}")
    if ternary:
        make_hf_model(base / "hf", arch=arch, tokenizer=ARCHS[arch], hidden=256, ffn=512,
                      n_head=4, n_head_kv=2, ternary=True, group=256, seed=7)
    else:
        make_hf_model(base / "hf", arch=arch, tokenizer=ARCHS[arch], seed=7)
    out = base / f"{arch}-{outtype}.gguf"
    run_cli("convert", base / "hf", "--outfile", out, "--outtype", outtype, "--allow-lossy",
            check=True)
    return out


def _both_logits(path, tokens=None):
    """(llama.cpp logits, reference logits), both float64, over `tokens` (default: TEXT tokenized
    by llama.cpp)."""
    from bonsai_runner.reference import ReferenceModel

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False,
                          type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, flash_attn=False)
    if tokens is None:
        tokens = llm.tokenize(TEXT.encode(), add_bos=True)
        assert len(tokens) >= 12, tokens
    llm.eval(tokens)
    theirs = np.array(llm.scores[:len(tokens)], dtype=np.float64)
    llm.close()
    ours = ReferenceModel.from_gguf(path).logits(tokens)
    assert theirs.shape == ours.shape
    return theirs, ours


@pytest.mark.parametrize("arch,variant", [("llama", None), ("llama", "linear"), ("llama", "freqs"),
                                          ("qwen2", None), ("qwen2", "tied"), ("qwen3", None)])
def test_reference_conventions_match_llama_cpp(tmp_path, arch, variant):
    """Measured max relative difference ~2e-7: both sides compute in (at least) float32."""
    cfg, w = make_hf_weights(arch, seed=11, tied=variant == "tied",
                             rope_scaling={"type": "linear", "factor": 4.0} if variant == "linear"
                             else None)
    extra = {}
    if variant == "freqs":
        extra["rope_freqs.weight"] = np.linspace(1.0, 8.0, cfg["head_dim"] // 2)
    path = write_gguf(tmp_path / "m.gguf", cfg, w, extra_tensors=extra, vocab=True)
    theirs, ours = _both_logits(path, tokens=[1, 17, 250, 3, 99, 42, 7, 7, 128, 255, 64, 5, 200])
    rel = np.abs(theirs - ours).max() / np.abs(ours).max()
    assert rel < 1e-5, f"max |llama.cpp - reference| / max |reference| = {rel:.3g}"


@pytest.mark.parametrize("outtype,tol", [("f32", 1e-5), ("f16", 3e-3)])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_float_files_match_tightly(tmp_path_factory, arch, outtype, tol):
    theirs, ours = _both_logits(_convert(tmp_path_factory, arch, outtype, ternary=False))
    rel = np.abs(theirs - ours).max() / np.abs(ours).max()
    assert rel < tol, f"max |llama.cpp - reference| / max |reference| = {rel:.3g}"
    assert (theirs.argmax(1) == ours.argmax(1)).all()


@pytest.mark.parametrize("outtype,ternary,tol", [("q8_0", False, 6e-2), ("tq2_0", True, 3e-2),
                                                 ("q2_0", True, 3e-2)])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_quantized_files_agree(tmp_path_factory, arch, outtype, ternary, tol):
    path = _convert(tmp_path_factory, arch, outtype, ternary=ternary)
    with open_gguf(path) as g:
        types = {t.type_name for t in g.tensors if t.name.endswith("ffn_up.weight")}
    assert types == {outtype.upper()}, types
    theirs, ours = _both_logits(path)
    agree = np.mean(theirs.argmax(1) == ours.argmax(1))
    corr = np.corrcoef(theirs.ravel(), ours.ravel())[0, 1]
    rel = np.abs(theirs - ours).max() / np.abs(ours).max()
    assert agree >= 0.85, f"top-1 agreement {agree:.2f}"
    assert 1.0 - corr < 1e-3, f"correlation {corr:.6f}"
    assert rel < tol, f"max |llama.cpp - reference| / max |reference| = {rel:.3g}"
