"""The numpy reference forward (bonsai_runner.reference) is right and self-consistent.

Tiny random models are written as GGUF files by the `gguf` package (independently of this
project's converter and writer) from Hugging Face-layout weights, with llama.cpp's q/k row
permutation for llama. The reference's logits on such a file must equal those of an independent
forward written directly on the HF weights with HF's rotate_half rope (tests/hf_forward.py; the
files come from tests/tiny_gguf.py), and so must our converter's output of model_factory
checkpoints. Then prefix, cache, tied-head, rope-factor and lossless-ternary consistency, and
clear errors on bad files.
"""

from __future__ import annotations

import numpy as np
import pytest

from bonsai_runner.errors import BonsaiError
from bonsai_runner.reference import ReferenceModel
from hf_forward import hf_logits
from tiny_gguf import VOCAB, make_hf_weights, write_gguf

TOKENS = [1, 17, 250, 3, 99, 42, 7, 7, 128, 255, 64, 5]


def _f32(w):
    """The weights as the F32 file stores them, so both forwards see identical values."""
    return {k: v.astype(np.float32).astype(np.float64) for k, v in w.items()}


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("arch,scaling", [("llama", None),
                                          ("llama", {"type": "linear", "factor": 4.0}),
                                          ("qwen2", None), ("qwen3", None)])
@pytest.mark.parametrize("tied", [False, True])
def test_matches_independent_hf_forward(tmp_path, arch, scaling, tied):
    cfg, w = make_hf_weights(arch, tied=tied, rope_scaling=scaling)
    model = ReferenceModel.from_gguf(write_gguf(tmp_path / "m.gguf", cfg, w))
    ours = model.logits(TOKENS)
    assert ours.shape == (len(TOKENS), VOCAB)
    assert _rel(ours, hf_logits(cfg, _f32(w), TOKENS)) < 1e-10


@pytest.mark.parametrize("arch,tokenizer,extra", [
    ("llama", "spm", {}), ("llama", "spm", {"tied": True, "n_head_kv": 4}),
    ("llama", "bpe", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
    ("qwen2", "bpe", {}), ("qwen2", "bpe", {"tied": True}), ("qwen3", "bpe", {})])
def test_converted_hf_model_matches_hf_forward(tmp_path, arch, tokenizer, extra):
    """Our converter's output (F32, lossless from the F16 checkpoint) under the reference equals
    the HF-layout forward on the checkpoint itself: converter permutation and reference rope
    agree."""
    from conftest import run_cli
    from model_factory import make_hf_model

    info = make_hf_model(tmp_path / "hf", arch=arch, tokenizer=tokenizer, seed=5, **extra)
    out = tmp_path / "m.gguf"
    run_cli("convert", tmp_path / "hf", "--outfile", out, "--outtype", "f32", check=True)
    tokens = [t % info["n_vocab"] for t in TOKENS]
    ours = ReferenceModel.from_gguf(out).logits(tokens)
    weights = {k: np.asarray(v, dtype=np.float64) for k, v in info["tensors"].items()}
    assert _rel(ours, hf_logits(info["config"], weights, tokens)) < 1e-10


def test_llama_without_the_qk_permutation_does_not_match(tmp_path):
    """Guards the test above: the permutation (normal-mode rope) is what makes llama agree."""
    cfg, w = make_hf_weights("llama")
    model = ReferenceModel.from_gguf(write_gguf(tmp_path / "m.gguf", cfg, w, permute=False))
    assert _rel(model.logits(TOKENS), hf_logits(cfg, _f32(w), TOKENS)) > 1e-3


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny_model(request, tmp_path_factory):
    cfg, w = make_hf_weights(request.param, seed=3)
    path = write_gguf(tmp_path_factory.mktemp(request.param) / "m.gguf", cfg, w)
    return ReferenceModel.from_gguf(path)


def test_prefix_logits_equal_the_first_rows(tiny_model):
    full = tiny_model.logits(TOKENS)
    for k in (1, 5, len(TOKENS) - 1):
        np.testing.assert_allclose(tiny_model.logits(TOKENS[:k]), full[:k], rtol=0, atol=1e-12)


def test_cached_decoding_equals_the_full_pass(tiny_model):
    full = tiny_model.logits(TOKENS)
    cache = tiny_model.new_cache()
    rows = [tiny_model.logits(TOKENS[:4], cache=cache)]
    rows += [tiny_model.logits([t], cache=cache) for t in TOKENS[4:]]
    assert cache.n_past == len(TOKENS)
    np.testing.assert_allclose(np.concatenate(rows), full, rtol=0, atol=1e-12)


def test_start_pos_drops_the_rest_of_the_cache(tiny_model):
    cache = tiny_model.new_cache()
    tiny_model.logits([9, 8, 7, 6, 5, 4, 3], cache=cache)
    tail = tiny_model.logits(TOKENS[2:], cache=cache, start_pos=2)
    want = tiny_model.logits([9, 8] + TOKENS[2:])[2:]
    np.testing.assert_allclose(tail, want, rtol=0, atol=1e-12)


def test_tied_head_equals_an_explicit_copy_of_the_embedding(tmp_path):
    cfg, w = make_hf_weights("qwen2", tied=True)
    tied = ReferenceModel.from_gguf(write_gguf(tmp_path / "tied.gguf", cfg, w))
    assert "output.weight" not in tied.weights
    w_copy = dict(w, **{"lm_head.weight": w["model.embed_tokens.weight"].copy()})
    untied = ReferenceModel.from_gguf(write_gguf(tmp_path / "untied.gguf", cfg, w_copy))
    np.testing.assert_array_equal(tied.logits(TOKENS), untied.logits(TOKENS))


def test_uniform_rope_freq_factors_equal_linear_scaling(tmp_path):
    """rope_freqs.weight divides every frequency; a uniform factor c is linear scaling by c."""
    cfg, w = make_hf_weights("llama")
    half = cfg["head_dim"] // 2
    plain = ReferenceModel.from_gguf(write_gguf(tmp_path / "a.gguf", cfg, w))
    ones = ReferenceModel.from_gguf(write_gguf(tmp_path / "b.gguf", cfg, w,
                                               extra_tensors={"rope_freqs.weight": np.ones(half)}))
    threes = ReferenceModel.from_gguf(write_gguf(
        tmp_path / "c.gguf", cfg, w, extra_tensors={"rope_freqs.weight": np.full(half, 3.0)}))
    cfg_lin = dict(cfg, rope_scaling={"type": "linear", "factor": 3.0})
    linear = ReferenceModel.from_gguf(write_gguf(tmp_path / "d.gguf", cfg_lin, w))
    np.testing.assert_array_equal(plain.logits(TOKENS), ones.logits(TOKENS))
    np.testing.assert_allclose(threes.logits(TOKENS), linear.logits(TOKENS), rtol=0, atol=1e-10)
    assert _rel(threes.logits(TOKENS), plain.logits(TOKENS)) > 1e-3


def test_unknown_architecture_is_refused(tmp_path):
    cfg, w = make_hf_weights("llama")
    path = write_gguf(tmp_path / "m.gguf", cfg, w, arch="gpt2")
    with pytest.raises(BonsaiError, match="unsupported architecture 'gpt2'"):
        ReferenceModel.from_gguf(path)


def test_missing_and_misshaped_tensors_are_named(tmp_path):
    cfg, w = make_hf_weights("qwen3")
    path = write_gguf(tmp_path / "m.gguf", cfg, w, drop=("blk.1.attn_k_norm.weight",))
    with pytest.raises(BonsaiError, match=r"missing tensor blk\.1\.attn_k_norm\.weight"):
        ReferenceModel.from_gguf(path)
    bad = write_gguf(tmp_path / "bad.gguf", cfg, w,
                     extra_tensors={"blk.0.ffn_up.weight": np.zeros((96, 32))})
    with pytest.raises(BonsaiError, match=r"blk\.0\.ffn_up\.weight has shape \(96, 32\)"):
        ReferenceModel.from_gguf(bad)


def test_out_of_range_token_is_refused(tiny_model):
    with pytest.raises(BonsaiError, match="out of range"):
        tiny_model.logits([0, VOCAB])


@pytest.fixture(scope="module")
def ternary_checkpoint(tmp_path_factory):
    """A ternary qwen3 checkpoint (every linear weight s x {-1, 0, +1}, 256 per scale) and the
    reference logits of its lossless F32 conversion."""
    from conftest import run_cli
    from model_factory import make_hf_model

    base = tmp_path_factory.mktemp("ternary")
    info = make_hf_model(base / "hf", arch="qwen3", tokenizer="bpe", hidden=256, ffn=512,
                         ternary=True, group=256, seed=9)
    out = base / "f32.gguf"
    run_cli("convert", base / "hf", "--outfile", out, "--outtype", "f32", check=True)
    tokens = [t % info["n_vocab"] for t in TOKENS]
    return base / "hf", tokens, ReferenceModel.from_gguf(out).logits(tokens)


@pytest.mark.parametrize("outtype", ["ptq1_0", "pq2_0", "tq1_0"])
def test_ternary_types_dequantize_to_the_same_model(ternary_checkpoint, tmp_path, outtype):
    """Packing exact ternary weights is lossless, so the reference on the packed file (through
    bonsai_runner.quants) computes bit-identical logits. (TQ2_0 and Q2_0 are compared with
    llama.cpp in test_oracle_llama_cpp.py.)"""
    from bonsai_runner.gguf_reader import open_gguf
    from conftest import run_cli

    src, tokens, want = ternary_checkpoint
    out = tmp_path / f"{outtype}.gguf"
    run_cli("convert", src, "--outfile", out, "--outtype", outtype, check=True)
    with open_gguf(out) as g:
        assert g.tensor("blk.0.attn_q.weight").type_name == outtype.upper()
    np.testing.assert_array_equal(ReferenceModel.from_gguf(out).logits(tokens), want)
