"""The tiny-model factory (tests/model_factory.py) writes what Hugging Face tools would read.

Checked with independent readers: the `safetensors` package for the weights, `sentencepiece` and
`tokenizers` for the tokenizers, plain json for the configs.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from model_factory import BPE_SPECIALS, BPE_USER_TOKEN, make_hf_model


def _load_all(d):
    from safetensors.numpy import load_file

    files = sorted(d.glob("*.safetensors"))
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_config_and_tensor_names(hf_model, arch):
    m = hf_model(arch=arch, tokenizer="spm" if arch == "llama" else "bpe")
    cfg = json.loads((m["dir"] / "config.json").read_text())
    assert cfg["architectures"] == [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                     "qwen3": "Qwen3ForCausalLM"}[arch]]
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                "max_position_embeddings", "vocab_size", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "torch_dtype"):
        assert key in cfg, key
    assert ("head_dim" in cfg) == (arch == "qwen3")
    tensors = _load_all(m["dir"])
    assert tensors["model.embed_tokens.weight"].shape == (m["n_tokens"], 64)
    assert cfg["vocab_size"] == m["n_tokens"]
    assert tensors["lm_head.weight"].shape == (m["n_tokens"], 64)
    assert ("model.layers.0.self_attn.q_proj.bias" in tensors) == (arch == "qwen2")
    assert ("model.layers.1.self_attn.k_norm.weight" in tensors) == (arch == "qwen3")
    hd = m["head_dim"]
    assert tensors["model.layers.1.self_attn.q_proj.weight"].shape == (4 * hd, 64)
    assert tensors["model.layers.1.self_attn.o_proj.weight"].shape == (64, 4 * hd)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (2 * hd, 64)
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (64, 128)
    assert set(tensors) == set(m["tensors"])
    for name, x in tensors.items():
        np.testing.assert_array_equal(x.astype(np.float32), m["tensors"][name])


def test_tied_model_has_no_lm_head(hf_model):
    m = hf_model(arch="qwen2", tied=True, tokenizer="bpe")
    assert "lm_head.weight" not in _load_all(m["dir"])
    assert json.loads((m["dir"] / "config.json").read_text())["tie_word_embeddings"] is True


def test_spm_tokenizer(hf_model):
    import sentencepiece as spm

    m = hf_model(arch="llama")
    sp = spm.SentencePieceProcessor(model_file=str(m["dir"] / "tokenizer.model"))
    assert 280 <= sp.vocab_size() <= 512
    assert sp.vocab_size() == m["n_tokens"]
    assert sum(sp.is_byte(i) for i in range(sp.vocab_size())) == 256
    ids = sp.encode("你好 🚀 hello")
    assert sp.decode(ids) == "你好 🚀 hello"
    cfg = json.loads((m["dir"] / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == sp.id_to_piece(sp.bos_id())


def test_bpe_tokenizer(hf_model):
    from tokenizers import Tokenizer

    m = hf_model(arch="qwen2", tokenizer="bpe")
    tok = Tokenizer.from_file(str(m["dir"] / "tokenizer.json"))
    assert tok.get_vocab_size() == m["n_tokens"]
    for s in BPE_SPECIALS + [BPE_USER_TOKEN]:
        assert tok.token_to_id(s) is not None
    text = "def f(x):\n    return '你好' + \"🚀\""
    assert tok.decode(tok.encode(text).ids) == text
    cfg = json.loads((m["dir"] / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in cfg["chat_template"]
    assert m["config"]["eos_token_id"] == tok.token_to_id("<|im_end|>")


def test_ternary_weights_are_exact(ternary_model):
    t = ternary_model["tensors"]
    w = t["model.layers.0.mlp.down_proj.weight"]
    g = np.abs(w.reshape(w.shape[0], -1, 128))
    s = g.max(axis=2, keepdims=True)
    assert ((g == 0) | (g == s)).all()
    assert (s.astype(np.float16).astype(np.float32) == s).all()
    # scales differ between neighbouring groups, so the model is ternary at 128, not at 256
    assert (s[:, 0::2] != s[:, 1::2]).any()
    assert not np.array_equal(t["model.embed_tokens.weight"],
                              np.round(t["model.embed_tokens.weight"]))


def test_bf16_and_shards(hf_model):
    m = hf_model(arch="qwen3", tokenizer="bpe", dtype="bfloat16", shards=3)
    idx = json.loads((m["dir"] / "model.safetensors.index.json").read_text())
    assert sorted(set(idx["weight_map"].values())) == m["files"] and len(m["files"]) == 3
    header = (m["dir"] / m["files"][0]).read_bytes()
    n = int.from_bytes(header[:8], "little")
    dtypes = {v["dtype"] for k, v in json.loads(header[8:8 + n]).items() if k != "__metadata__"}
    assert dtypes == {"BF16"}
    for x in m["tensors"].values():
        assert not (x.view(np.uint32) & 0xFFFF).any()


def test_padded_vocab(hf_model):
    m = hf_model(arch="qwen2", tokenizer="bpe", vocab=400)
    assert m["n_vocab"] == 400 and m["n_tokens"] < 400
    assert m["tensors"]["model.embed_tokens.weight"].shape == (400, 64)


def test_generation_is_fast_and_deterministic(tmp_path):
    t0 = time.perf_counter()
    a = make_hf_model(tmp_path / "a", arch="qwen3", tokenizer="bpe", hidden=256, ffn=512,
                      ternary=True, seed=7)
    assert time.perf_counter() - t0 < 2.0
    b = make_hf_model(tmp_path / "b", arch="qwen3", tokenizer="bpe", hidden=256, ffn=512,
                      ternary=True, seed=7)
    for name in a["tensors"]:
        np.testing.assert_array_equal(a["tensors"][name], b["tensors"][name])
