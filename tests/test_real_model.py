"""The real model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M from PyPI) through our converter.

Converted to F16 with `bonsai convert` and to Q8_0 with scripts/fetch_real_model.py: `bonsai
inspect` describes both; every F16 tensor is exactly the gguf package's dequantization of the
Q4_K_M tensor rounded to fp16; llama-cpp-python (upstream llama.cpp) runs our F16 file with the same logits as the float64 numpy reference; and it
tokenizes with our F16 file exactly as with the original file, so the tokenizer metadata survived.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import run_cli
from real_model import real_model_path  # noqa: F401  (session fixture)

pytestmark = pytest.mark.real_model

REPO = Path(__file__).resolve().parent.parent

N_PARAMS = 630_167_424  # elements in the file (its output head is stored, not tied)
TEXT = ("def quicksort(items):\n    \"\"\"Sort a list with the quicksort algorithm.\"\"\"\n"
        "    if len(items) <= 1:\n        return items\n    pivot = items[len(items) // 2]\n"
        "    left = [x for x in items if x < pivot]\n")
CORPUS = [
    TEXT,
    "Hello, world! It's a test: don't panic; we'll see... 12345 + 67.89 = ?",
    "  leading spaces,\ttabs\tand\n\n\nnewlines   trailing   ",
    "你好，世界！这是一个测试。机器学习模型的量化。",
    "Émigré café naïve façade — “quotes” and ‘apostrophes’ … ✓ 🚀🔥 ∑∫√",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // C++\nSELECT * FROM t WHERE x<>1;",
    "https://example.com/path?q=1&r=two#frag user@example.org 0x1F 1e-9 3.14159",
]


def _convert(src, out_dir, outtype):
    out = out_dir / f"qwen2.5-coder-0.5b-instruct-{outtype}.gguf"
    run_cli("convert", src, "--outfile", out, "--outtype", outtype, "--allow-lossy", check=True,
            timeout=900)
    return out


@pytest.fixture(scope="module")
def f16_path(real_model_path, tmp_path_factory):  # noqa: F811
    return _convert(real_model_path, tmp_path_factory.mktemp("real_f16"), "f16")


@pytest.fixture(scope="module")
def q8_0_path(real_model_path, tmp_path_factory):  # noqa: F811
    """Made by scripts/fetch_real_model.py --convert q8_0 (the README's first command) in a cache
    directory that already holds the model (a symlink), so nothing is downloaded again."""
    cache = tmp_path_factory.mktemp("real_cache")
    (cache / real_model_path.name).symlink_to(real_model_path)
    cmd = [sys.executable, str(REPO / "scripts" / "fetch_real_model.py"), "--cache", str(cache),
           "--convert", "q8_0"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr
    out = cache / "qwen2.5-coder-0.5b-instruct-q8_0.gguf"
    assert first.stdout.split() == [str(cache / real_model_path.name), str(out)]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already exists" in again.stderr, again.stderr
    return out


@pytest.mark.parametrize("outtype,linear_bpw,file_bpw", [("f16", 16.0, (16.0, 16.2)),
                                                         ("q8_0", 8.5, (8.5, 8.7))])
def test_inspect_describes_the_converted_model(request, outtype, linear_bpw, file_bpw):
    path = request.getfixturevalue(f"{outtype}_path")
    text = run_cli("inspect", "--no-tensors", path, check=True).stdout
    assert "qwen2" in text and "151936" in text
    report = json.loads(run_cli("inspect", "--json", "--no-tensors", path, check=True).stdout)
    arch = report["architecture"]
    assert (arch["arch"], arch["block_count"], arch["vocab_size"]) == ("qwen2", 24, 151936)
    assert (arch["embedding_length"], arch["head_count"], arch["head_count_kv"]) == (896, 14, 2)
    assert report["file_size"] == path.stat().st_size
    assert report["bpw"]["total_elements"] == N_PARAMS
    assert set(report["types"]) == {outtype.upper(), "F32"}
    assert report["bpw"]["linear"] == pytest.approx(linear_bpw)
    assert file_bpw[0] < report["bpw"]["file"] < file_bpw[1]
    assert report["bpw"]["file"] * N_PARAMS / 8 == pytest.approx(report["file_size"])
    assert report["unsupported"] == {}


def test_f16_tensors_are_the_rounded_dequantized_q4_k_m(real_model_path, f16_path):  # noqa: F811
    src = gguf.GGUFReader(str(real_model_path))
    dst = gguf.GGUFReader(str(f16_path))
    dst_tensors = {t.name: t for t in dst.tensors}
    assert set(dst_tensors) == {t.name for t in src.tensors}
    for t in src.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        got_t = dst_tensors[t.name]
        assert got_t.shape.tolist() == t.shape.tolist(), t.name
        got = np.asarray(got_t.data).reshape(want.shape)
        if got_t.tensor_type == gguf.GGMLQuantizationType.F16:
            np.testing.assert_array_equal(got, want.astype(np.float16), err_msg=t.name)
        else:
            assert got_t.tensor_type == gguf.GGMLQuantizationType.F32, (t.name, got_t.tensor_type)
            np.testing.assert_array_equal(got, want, err_msg=t.name)


def test_llama_cpp_logits_on_our_f16_match_the_reference(f16_path):
    """54 tokens; the measured mean KL is ~4e-7 (llama.cpp rounds activations and KV to fp16)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from bonsai_runner.reference import ReferenceModel

    llm = llama_cpp.Llama(model_path=str(f16_path), n_ctx=256, logits_all=True, verbose=False)
    tokens = llm.tokenize(TEXT.encode(), add_bos=False)
    llm.eval(tokens)
    theirs = np.array(llm.scores[:len(tokens)], dtype=np.float64)
    llm.close()
    ours = ReferenceModel.from_gguf(f16_path).logits(tokens)

    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    lp, lq = log_softmax(ours), log_softmax(theirs)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    assert np.mean(ours.argmax(1) == theirs.argmax(1)) >= 0.99
    assert kl.mean() < 1e-4, f"mean KL {kl.mean():.3g} (max {kl.max():.3g})"
    assert np.abs(ours - theirs).max() < 1e-2 * np.abs(ours).max()


def test_tokenization_of_our_f16_equals_the_original(real_model_path, f16_path):  # noqa: F811
    llama_cpp = pytest.importorskip("llama_cpp")
    orig = llama_cpp.Llama(model_path=str(real_model_path), vocab_only=True, verbose=False)
    ours = llama_cpp.Llama(model_path=str(f16_path), vocab_only=True, verbose=False)
    assert ours.n_vocab() == orig.n_vocab() == 151936
    assert (ours.token_bos(), ours.token_eos()) == (orig.token_bos(), orig.token_eos())
    for text in CORPUS:
        for add_bos in (False, True):
            for special in (False, True):
                want = orig.tokenize(text.encode(), add_bos=add_bos, special=special)
                assert ours.tokenize(text.encode(), add_bos=add_bos, special=special) == want, text
        assert ours.detokenize(want) == orig.detokenize(want)
    assert len(orig.tokenize(CORPUS[5].encode(), special=True)) < len(
        orig.tokenize(CORPUS[5].encode(), special=False))  # the corpus exercises special tokens
    orig.close()
    ours.close()
