"""bonsai convert: Hugging Face checkpoints and GGUF files to GGUF, checked value for value.

Read-back goes through gguf.GGUFReader / gguf.quants where the types allow (independent of the
converter's writer and quantizers); expectations are computed here from the fixture's stored
values, with the llama rotary permutation re-implemented index by index.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gguf_readback import read_gguf

from bonsai_runner.convert import convert
from bonsai_runner.errors import BonsaiError

ARCHS = ["llama", "qwen2", "qwen3"]
BLOCK_NAMES = {  # HF suffix -> llama.cpp name
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{BLOCK_NAMES[rest]}"


def permute_oracle(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-halves rows -> llama.cpp adjacent pairs: row h*d + j*d/2 + i goes to h*d + 2i + j."""
    d = w.shape[0] // n_head
    out = np.empty_like(w)
    for h in range(n_head):
        for i in range(d // 2):
            for j in range(2):
                out[h * d + 2 * i + j] = w[h * d + j * (d // 2) + i]
    return out


def expected(m: dict, hf: str) -> np.ndarray:
    x = m["tensors"][hf]
    if m["arch"] == "llama":
        cfg = m["config"]
        if ".q_proj." in hf:
            return permute_oracle(x, cfg["num_attention_heads"])
        if ".k_proj." in hf:
            return permute_oracle(x, cfg["num_key_value_heads"])
    return x


def run_convert(src, out, outtype="auto", **kw):
    return convert(src, out, outtype, progress=False, log=lambda msg: None, **kw)


# ----- float checkpoints: every family, tied/untied, both tokenizers, four out types -----

@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("tokenizer", ["spm", "bpe"])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_float_roundtrip(hf_model, tmp_path, arch, tied, tokenizer, outtype):
    import gguf

    m = hf_model(arch=arch, tied=tied, tokenizer=tokenizer)
    out = run_convert(m["dir"], tmp_path / "m.gguf", outtype)
    rb = read_gguf(out)
    cfg, a = m["config"], arch
    md = rb.metadata
    assert md["general.architecture"] == arch
    assert md["general.file_type"] == {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}[outtype]
    assert md[f"{a}.block_count"] == cfg["num_hidden_layers"]
    assert md[f"{a}.embedding_length"] == cfg["hidden_size"]
    assert md[f"{a}.feed_forward_length"] == cfg["intermediate_size"]
    assert md[f"{a}.attention.head_count"] == cfg["num_attention_heads"]
    assert md[f"{a}.attention.head_count_kv"] == cfg["num_key_value_heads"]
    assert md[f"{a}.context_length"] == cfg["max_position_embeddings"]
    assert md[f"{a}.vocab_size"] == m["n_vocab"]
    assert md[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg["rms_norm_eps"])
    assert md[f"{a}.rope.freq_base"] == pytest.approx(cfg["rope_theta"])
    if arch == "qwen3":
        assert md[f"{a}.attention.key_length"] == m["head_dim"]
        assert md[f"{a}.attention.value_length"] == m["head_dim"]
    else:
        assert f"{a}.attention.key_length" not in md

    want_names = {gguf_name(n) for n in m["tensors"]}
    assert set(rb.types) == want_names
    assert ("output.weight" in rb.types) == (not tied)
    for hf, x in m["tensors"].items():
        name = gguf_name(hf)
        want = expected(m, hf)
        assert rb.shapes[name] == x.shape, name
        got = rb.values(name)
        if x.ndim == 1:
            assert rb.types[name] == "F32"
            np.testing.assert_array_equal(got, want, err_msg=name)
            continue
        assert rb.types[name] == outtype.upper(), name
        if outtype in ("f32", "f16"):
            np.testing.assert_array_equal(got, want, err_msg=name)
        elif outtype == "bf16":
            assert not (got.view(np.uint32) & 0xFFFF).any()
            np.testing.assert_allclose(got, want, rtol=2.0 ** -8, atol=0, err_msg=name)
        else:
            ref = gguf.quants.quantize(want, gguf.GGMLQuantizationType.Q8_0)
            np.testing.assert_array_equal(rb.raw[name].reshape(ref.shape), ref, err_msg=name)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_source_dtypes_and_shards(hf_model, tmp_path, dtype):
    m = hf_model(arch="qwen3", tokenizer="bpe", dtype=dtype, shards=3)
    out = run_convert(m["dir"], tmp_path / "m.gguf", "auto")
    rb = read_gguf(out)
    want_type = "BF16" if dtype == "bfloat16" else "F16"
    assert rb.types["blk.0.attn_q.weight"] == want_type
    assert rb.metadata["general.file_type"] == (32 if dtype == "bfloat16" else 1)
    for hf in m["tensors"]:
        got = rb.values(gguf_name(hf))
        want = m["tensors"][hf]
        if dtype == "bfloat16" or want.ndim == 1:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32))


def test_llama_permutation_matches_rope_semantics(hf_model, tmp_path):
    """Rotate-halves rope on HF rows == llama.cpp's pairwise rope on the converted rows."""
    m = hf_model(arch="llama")
    cfg = m["config"]
    n_head, d = cfg["num_attention_heads"], m["head_dim"]
    rb = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", "f32"))
    w_hf = m["tensors"]["model.layers.0.self_attn.q_proj.weight"]
    w_gg = rb.values("blk.0.attn_q.weight")
    x = np.random.default_rng(3).standard_normal(cfg["hidden_size"])
    pos = 5
    theta = pos * cfg["rope_theta"] ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(theta), np.sin(theta)
    q_hf = (w_hf.astype(np.float64) @ x).reshape(n_head, d)
    lo, hi = q_hf[:, : d // 2], q_hf[:, d // 2:]
    rot_hf = np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=1)
    q_gg = (w_gg.astype(np.float64) @ x).reshape(n_head, d)
    ev, od = q_gg[:, 0::2], q_gg[:, 1::2]
    rot_gg = np.empty_like(q_gg)
    rot_gg[:, 0::2], rot_gg[:, 1::2] = ev * cos - od * sin, od * cos + ev * sin
    # same vectors up to the within-head reordering: norms and dot products agree
    np.testing.assert_allclose(np.sort(rot_hf, axis=1), np.sort(rot_gg, axis=1), rtol=1e-9)
    np.testing.assert_allclose(rot_hf @ rot_hf.T, rot_gg @ rot_gg.T, rtol=1e-9)
    np.testing.assert_allclose(rot_hf[:, : d // 2], rot_gg[:, 0::2], rtol=1e-9)


def test_permute_rope_rows_against_oracle():
    from bonsai_runner.convert.arch.base import permute_rope_rows

    w = np.arange(8 * 6 * 3, dtype=np.float32).reshape(48, 3)
    for heads in (1, 2, 4, 8 // 2):
        np.testing.assert_array_equal(permute_rope_rows(w, heads), permute_oracle(w, heads))
    b = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(permute_rope_rows(b, 2), permute_oracle(b[:, None], 2)[:, 0])


# ----- tokenizer metadata -----

def test_spm_tokenizer_metadata(hf_model, tmp_path):
    import sentencepiece as spm

    m = hf_model(arch="llama", tokenizer="spm")
    md = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", "f16")).metadata
    sp = spm.SentencePieceProcessor(model_file=str(m["dir"] / "tokenizer.model"))
    n = sp.vocab_size()
    assert md["tokenizer.ggml.model"] == "llama"
    assert md["tokenizer.ggml.tokens"] == [sp.id_to_piece(i) for i in range(n)]
    np.testing.assert_array_equal(np.float32(md["tokenizer.ggml.scores"]),
                                  np.float32([sp.get_score(i) for i in range(n)]))
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
             for i in range(n)]
    assert md["tokenizer.ggml.token_type"] == types
    assert md["tokenizer.ggml.bos_token_id"] == sp.bos_id()
    assert md["tokenizer.ggml.eos_token_id"] == sp.eos_id()
    assert md["tokenizer.ggml.unknown_token_id"] == sp.unk_id()
    assert md["tokenizer.ggml.add_bos_token"] is True
    assert md["tokenizer.ggml.add_eos_token"] is False
    assert md["tokenizer.chat_template"] == m["tokens"]["chat_template"]


def test_spm_added_tokens(hf_model, tmp_path):
    import shutil

    base = hf_model(arch="llama", tokenizer="spm")
    m = hf_model(arch="llama", tokenizer="spm", vocab=base["n_tokens"] + 1)
    d = tmp_path / "m"
    shutil.copytree(m["dir"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    n = base["n_tokens"]
    cfg["added_tokens_decoder"] = {"1": {"content": "<s>", "special": True},
                                   str(n): {"content": "\u2581tool", "special": False}}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    md = read_gguf(run_convert(d, tmp_path / "m.gguf", "f16")).metadata
    assert md["tokenizer.ggml.tokens"][n] == " tool"
    assert md["tokenizer.ggml.token_type"][n] == 4 and md["tokenizer.ggml.scores"][n] == -1000.0
    assert md["tokenizer.ggml.token_type"][1] == 3
    assert len(md["tokenizer.ggml.tokens"]) == n + 1


def test_bpe_tokenizer_metadata(hf_model, tmp_path):
    from tokenizers import Tokenizer

    m = hf_model(arch="qwen2", tokenizer="bpe")
    md = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", "f16")).metadata
    tok = Tokenizer.from_file(str(m["dir"] / "tokenizer.json"))
    tj = json.loads((m["dir"] / "tokenizer.json").read_text())
    n = tok.get_vocab_size()
    assert md["tokenizer.ggml.model"] == "gpt2"
    assert md["tokenizer.ggml.pre"] == "qwen2"
    assert md["tokenizer.ggml.tokens"] == [tok.id_to_token(i) for i in range(n)]
    assert md["tokenizer.ggml.merges"] == [" ".join(p) for p in tj["model"]["merges"]]
    specials = {a["id"]: a["special"] for a in tj["added_tokens"]}
    types = [(3 if specials[i] else 4) if i in specials else 1 for i in range(n)]
    assert md["tokenizer.ggml.token_type"] == types
    assert 4 in types and 3 in types
    assert "tokenizer.ggml.scores" not in md
    assert md["tokenizer.ggml.eos_token_id"] == tok.token_to_id("<|im_end|>")
    assert md["tokenizer.ggml.padding_token_id"] == tok.token_to_id("<|endoftext|>")
    assert md["tokenizer.ggml.bos_token_id"] == m["config"]["bos_token_id"]
    assert md["tokenizer.ggml.add_bos_token"] is False
    assert md["tokenizer.chat_template"] == m["tokens"]["chat_template"]


def test_bpe_string_merges_and_pre_tokenizer_override(hf_model, tmp_path):
    import shutil

    m = hf_model(arch="qwen2", tokenizer="bpe")
    d = tmp_path / "m"
    shutil.copytree(m["dir"], d)
    tj = json.loads((d / "tokenizer.json").read_text())
    pairs = tj["model"]["merges"]
    tj["model"]["merges"] = [" ".join(p) for p in pairs]
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\s+|."
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(BonsaiError, match=r"unknown pre-tokenizer split pattern.*--pre-tokenizer"):
        run_convert(d, tmp_path / "a.gguf", "f16")
    assert not (tmp_path / "a.gguf").exists()
    md = read_gguf(run_convert(d, tmp_path / "b.gguf", "f16", pre_tokenizer="llama-bpe")).metadata
    assert md["tokenizer.ggml.pre"] == "llama-bpe"
    assert md["tokenizer.ggml.merges"] == [" ".join(p) for p in pairs]


def test_pre_tokenizer_detection():
    from bonsai_runner.convert.tokenizer_meta import detect_pre_tokenizer

    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    qwen2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}

    def seq(regex):
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated"}, byte_level]}
    assert detect_pre_tokenizer(seq(llama3)) == "llama-bpe"
    assert detect_pre_tokenizer(seq(qwen2)) == "qwen2"
    assert detect_pre_tokenizer({"type": "ByteLevel", "add_prefix_space": False,
                                 "use_regex": True}) == "gpt-2"
    with pytest.raises(BonsaiError, match="not byte-level"):
        detect_pre_tokenizer({"type": "Metaspace", "replacement": "\u2581"})


def test_mistral_converts_as_llama(hf_model, tmp_path):
    import shutil

    m = hf_model(arch="llama")
    d = tmp_path / "mistral"
    shutil.copytree(m["dir"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["MistralForCausalLM"], "mistral"
    (d / "config.json").write_text(json.dumps(cfg))
    rb = read_gguf(run_convert(d, tmp_path / "m.gguf", "f32"))
    assert rb.metadata["general.architecture"] == "llama"
    np.testing.assert_array_equal(rb.values("blk.1.attn_k.weight"),
                                  expected(m, "model.layers.1.self_attn.k_proj.weight"))


def test_padded_vocab_gets_pad_tokens(hf_model, tmp_path):
    m = hf_model(arch="qwen2", tokenizer="bpe", vocab=400)
    rb = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", "f16"))
    toks = rb.metadata["tokenizer.ggml.tokens"]
    assert len(toks) == 400 == rb.shapes["token_embd.weight"][0]
    assert toks[m["n_tokens"]:] == [f"[PAD{i}]" for i in range(m["n_tokens"], 400)]
    assert rb.metadata["tokenizer.ggml.token_type"][m["n_tokens"]:] == [5] * (400 - m["n_tokens"])


def test_llama_cpp_tokenizes_like_the_source(hf_model, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    import sentencepiece as spm
    from tokenizers import Tokenizer

    text = "Hello world, 你好 🚀 and code x = 333"
    spm_m = hf_model(arch="llama", tokenizer="spm")
    bpe_m = hf_model(arch="qwen2", tokenizer="bpe")
    sp = spm.SentencePieceProcessor(model_file=str(spm_m["dir"] / "tokenizer.model"))
    tk = Tokenizer.from_file(str(bpe_m["dir"] / "tokenizer.json"))
    for m, want in ((spm_m, sp.encode(text)), (bpe_m, tk.encode(text).ids)):
        out = run_convert(m["dir"], tmp_path / f"{m['arch']}.gguf", "f16")
        llm = llama_cpp.Llama(str(out), vocab_only=True, verbose=False)
        assert llm.tokenize(text.encode(), add_bos=False) == want
        del llm


def test_llama3_rope_factors(hf_model, tmp_path):
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
    m = hf_model(arch="llama", rope_scaling=rs)
    rb = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", "f16"))
    got = rb.values("rope_freqs.weight")
    d = m["head_dim"]
    want = []
    for i in range(0, d, 2):
        wavelen = 2 * np.pi * 10000.0 ** (i / d)
        if wavelen < 64 / 4.0:
            want.append(1.0)
        elif wavelen > 64 / 1.0:
            want.append(8.0)
        else:
            s = (64 / wavelen - 1.0) / (4.0 - 1.0)
            want.append(1 / ((1 - s) / 8.0 + s))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert len(set(np.round(got, 4))) > 2


def test_linear_rope_scaling_keys(hf_model, tmp_path):
    m = hf_model(arch="qwen2", tokenizer="bpe", rope_scaling={"type": "linear", "factor": 4.0})
    md = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", "f16")).metadata
    assert md["qwen2.rope.scaling.type"] == "linear"
    assert md["qwen2.rope.scaling.factor"] == 4.0


# ----- already-ternary checkpoints -----

@pytest.mark.parametrize("outtype", ["auto", "ptq1_0", "pq2_0", "q2_0"])
def test_ternary_g128_roundtrip_exact(ternary_model, tmp_path, outtype):
    m = ternary_model
    rb = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", outtype))
    want_type = "PTQ1_0" if outtype == "auto" else outtype.upper()
    for hf in m["tensors"]:
        name = gguf_name(hf)
        if name.startswith("blk.") and name.endswith("weight") and rb.shapes[name].__len__() == 2:
            assert rb.types[name] == want_type, name
        elif name in ("token_embd.weight", "output.weight"):
            assert rb.types[name] == "F16"
        np.testing.assert_array_equal(rb.values(name), expected(m, hf), err_msg=name)
    md = rb.metadata
    assert md["general.file_type"] == {"PTQ1_0": 129, "PQ2_0": 128, "Q2_0": 41}[want_type]
    assert md["bonsai.format_version"] == 1
    assert md["bonsai.quant.scheme"] == want_type.lower()
    assert md["bonsai.quant.group_size"] == (64 if want_type == "Q2_0" else 128)
    assert json.loads(md["bonsai.fallback_table"]) == []


@pytest.mark.parametrize("outtype", ["tq1_0", "tq2_0", "ptq1_0"])
def test_ternary_g256_roundtrip_exact(hf_model, tmp_path, outtype):
    m = hf_model(arch="qwen2", tokenizer="bpe", hidden=256, ffn=512, ternary=True, group=256,
                 dtype="bfloat16")
    rb = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", outtype))
    assert rb.types["blk.1.ffn_down.weight"] == outtype.upper()
    for hf in m["tensors"]:
        want = expected(m, hf)
        if gguf_name(hf) in ("token_embd.weight", "output.weight"):
            assert rb.types[gguf_name(hf)] == "F16"
            want = want.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(rb.values(gguf_name(hf)), want, err_msg=hf)


def test_ternary_g64_auto_picks_q2_0(hf_model, tmp_path):
    m = hf_model(arch="qwen3", tokenizer="bpe", hidden=256, ffn=512, ternary=True, group=64)
    rb = read_gguf(run_convert(m["dir"], tmp_path / "m.gguf", "auto"))
    assert rb.types["blk.0.attn_q.weight"] == "Q2_0"
    np.testing.assert_array_equal(rb.values("blk.0.ffn_up.weight"),
                                  m["tensors"]["model.layers.0.mlp.up_proj.weight"])


def test_ternary_type_that_does_not_fit_is_refused(ternary_model, tmp_path):
    out = tmp_path / "m.gguf"
    with pytest.raises(BonsaiError) as e:
        run_convert(ternary_model["dir"], out, "tq1_0")
    msg = str(e.value)
    assert "blk.0.attn_q.weight (ternary only per 128 weights)" in msg
    assert "--allow-lossy" in msg and "bonsai quantize" in msg
    assert not out.exists()
    run_convert(ternary_model["dir"], out, "tq1_0", allow_lossy=True)
    assert read_gguf(out).types["blk.0.attn_q.weight"] == "TQ1_0"


def test_float_model_to_ternary_or_q4_needs_allow_lossy(hf_model, tmp_path):
    m = hf_model(arch="llama", hidden=128, ffn=256)
    for t in ("ptq1_0", "q4_0"):
        with pytest.raises(BonsaiError, match="--allow-lossy"):
            run_convert(m["dir"], tmp_path / f"{t}.gguf", t)
        assert not (tmp_path / f"{t}.gguf").exists()
    rb = read_gguf(run_convert(m["dir"], tmp_path / "q4.gguf", "q4_0", allow_lossy=True))
    assert rb.types["blk.0.ffn_up.weight"] == "Q4_0" and rb.types["output.weight"] == "F16"
    rb = read_gguf(run_convert(m["dir"], tmp_path / "auto.gguf", "auto"))
    assert rb.types["blk.0.ffn_up.weight"] == "F16" and "bonsai.format_version" not in rb.metadata


# ----- GGUF -> GGUF -----

def test_gguf_ptq1_to_q2_0_is_lossless(ternary_model, tmp_path):
    src = run_convert(ternary_model["dir"], tmp_path / "ptq1.gguf", "ptq1_0")
    out = run_convert(src, tmp_path / "q2.gguf", "q2_0")
    a, b = read_gguf(src), read_gguf(out)
    assert b.types["blk.0.ffn_down.weight"] == "Q2_0"
    assert b.metadata["general.file_type"] == 41
    assert b.metadata["bonsai.quant.scheme"] == "q2_0"
    for name in a.types:
        np.testing.assert_array_equal(a.values(name), b.values(name), err_msg=name)
    keep = [k for k in a.metadata if k.startswith("tokenizer.") or k.startswith("llama.")]
    for k in keep:
        assert a.metadata[k] == b.metadata[k], k


def test_gguf_q8_to_q4_needs_allow_lossy(hf_model, tmp_path):
    m = hf_model(arch="qwen2", tokenizer="bpe")
    src = run_convert(m["dir"], tmp_path / "q8.gguf", "q8_0")
    out = tmp_path / "q4.gguf"
    with pytest.raises(BonsaiError) as e:
        run_convert(src, out, "q4_0")
    assert "blk.0.attn_q.weight" in str(e.value) and "--allow-lossy" in str(e.value)
    assert not out.exists()
    assert not list(tmp_path.glob("*.tmp*"))
    run_convert(src, out, "q4_0", allow_lossy=True)
    assert read_gguf(out).types["blk.0.attn_q.weight"] == "Q4_0"


def test_gguf_to_f32_and_back_is_exact(hf_model, tmp_path):
    m = hf_model(arch="qwen3", tokenizer="bpe")
    q8 = run_convert(m["dir"], tmp_path / "q8.gguf", "q8_0")
    f32 = run_convert(q8, tmp_path / "f32.gguf", "f32")
    back = run_convert(f32, tmp_path / "back.gguf", "q8_0")
    a, b = read_gguf(q8), read_gguf(back)
    for name in a.types:
        np.testing.assert_array_equal(a.raw[name], b.raw[name], err_msg=name)
    assert a.metadata["general.file_type"] == b.metadata["general.file_type"] == 7
    assert read_gguf(f32).metadata["general.file_type"] == 0


def test_engine_vocab_reads_converted_tokenizers(hf_model, tmp_path):
    """The engine's tokenizer, built from the converted metadata, agrees with the source ones."""
    _core = pytest.importorskip("bonsai_runner._core")
    import sentencepiece as spm
    from tokenizers import Tokenizer

    texts = ["Hello world, 你好 🚀 and code x = 333", "I've been told he's there.",
             "def add(a, b): return a + b"]
    spm_m = hf_model(arch="llama", tokenizer="spm")
    bpe_m = hf_model(arch="qwen3", tokenizer="bpe", vocab=400)
    sp = spm.SentencePieceProcessor(model_file=str(spm_m["dir"] / "tokenizer.model"))
    tk = Tokenizer.from_file(str(bpe_m["dir"] / "tokenizer.json"))
    for m, encode in ((spm_m, sp.encode), (bpe_m, lambda t: tk.encode(t).ids)):
        v = _core.Vocab.from_gguf(str(run_convert(m["dir"], tmp_path / f"{m['arch']}.gguf",
                                                  "f16")))
        assert v.n_vocab == m["n_vocab"]
        assert v.eos == m["config"]["eos_token_id"]
        for text in texts:
            assert v.tokenize(text, add_special=False) == encode(text), (m["arch"], text)
    assert v.pre == "qwen2" and v.find_token("<|im_end|>") == v.eos


# ----- --embed-type -----

def test_embed_type_q8_0_for_head_and_embedding(ternary_model, tmp_path):
    """--embed-type q8_0 stores token_embd / output.weight as Q8_0 (rounded without --allow-lossy:
    the choice is explicit) and leaves every other tensor as --outtype gives it, on every path."""
    from bonsai_runner.quants import quantize

    m = ternary_model
    plain = read_gguf(run_convert(m["dir"], tmp_path / "plain.gguf", "ptq1_0"))
    for src, kw, what in ((m["dir"], {}, "hf"), (tmp_path / "plain.gguf", {}, "gguf"),
                          (m["dir"], {"hadamard": 32}, "hf rotated")):
        out = run_convert(src, tmp_path / f"{what.replace(' ', '_')}.gguf", "ptq1_0",
                          embed_type="q8_0", allow_lossy=bool(kw), **kw)
        rb = read_gguf(out)
        for name in ("token_embd.weight", "output.weight"):
            if name not in plain.types:
                continue
            assert rb.types[name] == "Q8_0", (what, name)
            if not kw:  # Q8_0 of the F16 values: the same bytes as quantizing them directly
                f16 = plain.values(name)
                np.testing.assert_array_equal(rb.raw[name].reshape(-1),
                                              quantize(f16, "q8_0").reshape(-1), err_msg=name)
        assert rb.types["blk.0.attn_q.weight"] == "PTQ1_0", what
        if not kw:
            np.testing.assert_array_equal(rb.values("blk.0.attn_q.weight"),
                                          plain.values("blk.0.attn_q.weight"))


def test_embed_type_unknown_is_refused(ternary_model, tmp_path):
    out = tmp_path / "m.gguf"
    with pytest.raises(BonsaiError, match="--embed-type 'q4_k'"):
        run_convert(ternary_model["dir"], out, "ptq1_0", embed_type="q4_k")
    assert not out.exists()
