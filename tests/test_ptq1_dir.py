"""The PTQ1_0 directory format (docs/ptq1_directory.md): writer, reader, and exact conversion.

A directory with all four tiers is written from a float fixture with known codes and scales; the
packed files are checked with the `safetensors` package and a bit-by-bit unpacker written here,
and the converted GGUF must hold exactly scale x code for every weight, plus the fallback table.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gguf_readback import read_gguf
from test_convert import gguf_name, permute_oracle, run_convert

from bonsai_runner.convert.ptq1_dir import Ptq1Dir, Ptq1DirWriter
from bonsai_runner.errors import BonsaiError

TIER_OF = {"q_proj": "ptq1_0", "k_proj": "ptq1_0", "gate_proj": "ptq1_0", "up_proj": "ptq1_0",
           "v_proj": "q2_0", "o_proj": "q4_0", "down_proj": "q8_0"}
RANGE = {"ptq1_0": (-1, 1, 128), "q2_0": (-1, 1, 64), "q4_0": (-8, 7, 32), "q8_0": (-128, 127, 32)}
GGUF_TYPE = {"ptq1_0": "PTQ1_0", "q2_0": "Q2_0", "q4_0": "Q4_0", "q8_0": "Q8_0"}
CALIBRATION = {"samples": 64, "tokens": 32768, "domains": {"code": 0.5, "chat": 0.5}}


def _tier(name: str) -> str | None:
    for key, tier in TIER_OF.items():
        if name.endswith(f".{key}.weight"):
            return tier
    return None


def build_ptq1_dir(m: dict, out, max_shard_bytes: int = 4 << 30, seed: int = 1) -> dict:
    """Writes a PTQ1_0 directory for fixture `m`; returns {hf name: (tier, codes, scales)}."""
    rng = np.random.default_rng(seed)
    truth = {}
    with Ptq1DirWriter(out, m["config"], tokenizer_dir=m["dir"], calibration=CALIBRATION,
                       max_shard_bytes=max_shard_bytes) as w:
        for name, x in m["tensors"].items():
            tier = _tier(name)
            if tier is None:
                w.add_plain(name, x)
                continue
            lo, hi, g = RANGE[tier]
            codes = rng.integers(lo, hi + 1, size=x.shape).astype(np.int8)
            scales = (rng.integers(1, 1024, size=(x.shape[0], x.shape[1] // g)) / 65536.0
                      ).astype(np.float16)
            kw = {}
            if tier == "q2_0":
                kw = {"cosine": 0.975, "fallback_reason": "cosine 0.975 < 0.98 at PTQ1_0"}
            elif tier == "q4_0":
                kw = {"rel_err": 0.12, "fallback_reason": "target-bpw: promoted to Q4_0"}
            elif tier == "q8_0":
                kw = {"loss_delta": 0.031, "cosine": 0.99, "fallback_reason": "default: down_proj"}
            elif name.endswith("q_proj.weight"):
                kw = {"cosine": 0.991, "rel_err": 0.2}
            w.add_quantized(name, tier, codes, scales, **kw)
            truth[name] = (tier, codes, scales)
    return truth


@pytest.fixture(scope="module")
def ptq1_setup(hf_model, tmp_path_factory):
    m = hf_model(arch="llama", hidden=256, ffn=512, tokenizer="spm")
    d = tmp_path_factory.mktemp("ptq1") / "model-ptq1"
    truth = build_ptq1_dir(m, d)
    return m, d, truth


def unpack_bits(words: np.ndarray, bits: int) -> np.ndarray:
    """Independent unpacker: element k of word w is bits [k*bits, (k+1)*bits), offset 2^(bits-1)."""
    per = 32 // bits
    rows, n_words = words.shape
    out = np.empty((rows, n_words * per), dtype=np.int64)
    u = words.astype(np.int64) & 0xFFFFFFFF
    for k in range(per):
        out[:, k::per] = ((u >> (k * bits)) & ((1 << bits) - 1)) - (1 << (bits - 1))
    return out


def test_directory_layout(ptq1_setup):
    from safetensors.numpy import load_file

    m, d, truth = ptq1_setup
    files = {p.name for p in d.iterdir()}
    assert {"config.json", "quant_config.json", "model.safetensors", "tokenizer.model",
            "tokenizer_config.json"} <= files
    st = load_file(str(d / "model.safetensors"))
    for name, (tier, codes, scales) in truth.items():
        mod = name[: -len(".weight")]
        bits = {"ptq1_0": 2, "q2_0": 2, "q4_0": 4, "q8_0": 8}[tier]
        assert st[f"{mod}.weight_packed"].dtype == np.int32
        assert st[f"{mod}.weight_packed"].shape == (codes.shape[0], codes.shape[1] * bits // 32)
        assert st[f"{mod}.weight_scale"].dtype == np.float16
        np.testing.assert_array_equal(st[f"{mod}.weight_scale"], scales)
        np.testing.assert_array_equal(st[f"{mod}.weight_shape"], np.array(codes.shape))
        assert st[f"{mod}.weight_shape"].dtype == np.int64
        np.testing.assert_array_equal(unpack_bits(st[f"{mod}.weight_packed"], bits), codes)
        assert name not in st
    assert st["model.embed_tokens.weight"].dtype == np.float16
    assert st["model.norm.weight"].dtype == np.float32

    qc = json.loads((d / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["bonsai"]["format_version"] == 1 and qc["bonsai"]["scheme"] == "ptq1_0"
    by_tier = {qc["bonsai"]["tiers"][g]: grp for g, grp in qc["config_groups"].items()}
    assert set(by_tier) == {"ptq1_0", "q2_0", "q4_0", "q8_0"}
    for tier, grp in by_tier.items():
        w = grp["weights"]
        assert (w["num_bits"], w["group_size"]) == ({"ptq1_0": 2, "q2_0": 2, "q4_0": 4,
                                                     "q8_0": 8}[tier], RANGE[tier][2])
        assert w["type"] == "int" and w["symmetric"] is True and w["strategy"] == "group"
        assert sorted(grp["targets"]) == sorted(n[: -len(".weight")] for n, t in truth.items()
                                                if t[0] == tier)
    assert "lm_head" in qc["ignore"]


def test_quant_config_table_and_bpw(ptq1_setup):
    m, d, truth = ptq1_setup
    qc = json.loads((d / "quant_config.json").read_text())
    rows = {r["tensor"]: r for r in qc["tensors"]}
    assert set(rows) == set(m["tensors"])
    down = rows["model.layers.1.mlp.down_proj.weight"]
    assert down["dtype"] == "q8_0" and down["group_size"] == 32
    assert down["fallback_reason"] == "default: down_proj" and down["loss_delta"] == 0.031
    s = truth["model.layers.1.mlp.down_proj.weight"][2].astype(np.float32)
    assert down["scale_min"] == pytest.approx(s.min()) and down["scale_max"] == pytest.approx(s.max())
    assert down["scale_mean"] == pytest.approx(s.mean())
    assert qc["calibration"] == CALIBRATION
    bpw = {"ptq1_0": 1.75, "q2_0": 2.25, "q4_0": 4.5, "q8_0": 8.5}
    bits = sum(c.size * bpw[t] for t, c, _ in truth.values())
    n = sum(c.size for _, c, _ in truth.values())
    assert qc["summary"]["bpw_linear"] == pytest.approx(bits / n, abs=1e-4)
    other = sum(x.size * (16 if x.ndim == 2 else 32) for k, x in m["tensors"].items()
                if k not in truth)
    n_all = sum(x.size for x in m["tensors"].values())
    assert qc["summary"]["bpw_file"] == pytest.approx((bits + other) / n_all, abs=1e-4)
    assert qc["summary"]["fallback_count"] == 2 * 3


def test_converts_bit_exactly_with_fallback_table(ptq1_setup, tmp_path):
    m, d, truth = ptq1_setup
    rb = read_gguf(run_convert(d, tmp_path / "m.gguf"))
    cfg = m["config"]
    for name, (tier, codes, scales) in truth.items():
        g = RANGE[tier][2]
        want = (codes.astype(np.float32).reshape(codes.shape[0], -1, g)
                * scales.astype(np.float32)[..., None]).reshape(codes.shape)
        if ".q_proj." in name:
            want = permute_oracle(want, cfg["num_attention_heads"])
        if ".k_proj." in name:
            want = permute_oracle(want, cfg["num_key_value_heads"])
        gn = gguf_name(name)
        assert rb.types[gn] == GGUF_TYPE[tier], gn
        np.testing.assert_array_equal(rb.values(gn), want, err_msg=gn)
    np.testing.assert_array_equal(rb.values("token_embd.weight"),
                                  m["tensors"]["model.embed_tokens.weight"])
    assert rb.types["token_embd.weight"] == "F16" and rb.types["output_norm.weight"] == "F32"
    md = rb.metadata
    assert md["general.file_type"] == 129
    assert md["bonsai.format_version"] == 1
    assert md["bonsai.quant.scheme"] == "ptq1_0" and md["bonsai.quant.group_size"] == 128
    assert md["bonsai.quant.activation_mode"] == "int8_per_token"
    assert json.loads(md["bonsai.quant.calibration"]) == CALIBRATION
    table = {e["tensor"]: e for e in json.loads(md["bonsai.fallback_table"])}
    assert set(table) == {f"blk.{i}.{t}.weight" for i in range(2)
                          for t in ("attn_v", "attn_output", "ffn_down")}
    assert table["blk.0.ffn_down.weight"] == {"tensor": "blk.0.ffn_down.weight", "type": "Q8_0",
                                              "reason": "default: down_proj", "cosine": 0.99,
                                              "loss_delta": 0.031}
    assert table["blk.1.attn_v.weight"]["type"] == "Q2_0"
    assert table["blk.1.attn_output.weight"]["rel_err"] == 0.12
    sens = json.loads(md["bonsai.quant.sensitivity"])
    assert sens["blk.0.attn_q.weight"] == {"cosine": 0.991, "rel_err": 0.2}
    assert "blk.0.ffn_up.weight" not in sens
    assert md["tokenizer.ggml.model"] == "llama"


def test_retyping_a_ptq1_dir(ptq1_setup, tmp_path):
    m, d, truth = ptq1_setup
    rb = read_gguf(run_convert(d, tmp_path / "q2.gguf", "q2_0"))
    assert rb.types["blk.0.ffn_gate.weight"] == "Q2_0"
    assert rb.types["blk.0.ffn_down.weight"] == "Q8_0"
    assert rb.types["blk.0.attn_output.weight"] == "Q4_0"
    ref = read_gguf(run_convert(d, tmp_path / "auto.gguf"))
    for name in ref.types:
        np.testing.assert_array_equal(rb.values(name), ref.values(name), err_msg=name)
    assert json.loads(rb.metadata["bonsai.fallback_table"])[0]["type"] in ("Q2_0", "Q4_0", "Q8_0")
    with pytest.raises(BonsaiError, match=r"(?s)would change value.*blk\.0\.ffn_down\.weight"):
        run_convert(d, tmp_path / "f16.gguf", "f16")
    assert not (tmp_path / "f16.gguf").exists()
    f32 = read_gguf(run_convert(d, tmp_path / "f32.gguf", "f32"))
    for name in ref.types:
        np.testing.assert_array_equal(f32.values(name), ref.values(name), err_msg=name)


def test_sharded_directory(hf_model, tmp_path):
    m = hf_model(arch="qwen2", tokenizer="bpe", hidden=256, ffn=512)
    d = tmp_path / "sharded"
    truth = build_ptq1_dir(m, d, max_shard_bytes=200_000)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) > 2
    src = Ptq1Dir(d)
    for name, (tier, codes, scales) in truth.items():
        p = src.packed(name)
        assert p.tier.name == tier
        np.testing.assert_array_equal(p.codes, codes)
        np.testing.assert_array_equal(p.scales, scales)
    rb = read_gguf(run_convert(d, tmp_path / "m.gguf"))
    assert rb.types["blk.0.attn_q.bias"] == "F32"
    np.testing.assert_array_equal(rb.values("blk.0.attn_q.bias"),
                                  m["tensors"]["model.layers.0.self_attn.q_proj.bias"])


def test_writer_leaves_nothing_on_error(hf_model, tmp_path):
    m = hf_model(arch="qwen2", tokenizer="bpe", hidden=256, ffn=512)
    out = tmp_path / "broken"
    with pytest.raises(BonsaiError, match="codes must lie in"):
        with Ptq1DirWriter(out, m["config"]) as w:
            w.add_plain("model.norm.weight", m["tensors"]["model.norm.weight"])
            w.add_quantized("model.layers.0.mlp.up_proj.weight", "ptq1_0",
                            np.full((512, 256), 2, np.int8), np.ones((512, 2), np.float16))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(BonsaiError, match="already exists"):
        Ptq1DirWriter(tmp_path, m["config"])


def test_malformed_directory_is_reported(ptq1_setup, tmp_path):
    from safetensors.numpy import load_file, save_file

    m, d, truth = ptq1_setup
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    st = load_file(str(bad / "model.safetensors"))
    st["model.layers.0.mlp.up_proj.weight_scale"] = st["model.layers.0.mlp.up_proj.weight_scale"][:, :1]
    del st["model.layers.1.self_attn.v_proj.weight_packed"]
    save_file(st, str(bad / "model.safetensors"))
    with pytest.raises(BonsaiError) as e:
        run_convert(bad, tmp_path / "m.gguf")
    msg = str(e.value)
    assert "model.layers.0.mlp.up_proj.weight_scale" in msg
    assert "model.layers.1.self_attn.v_proj.weight_packed" in msg
    assert not (tmp_path / "m.gguf").exists()

    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    other = tmp_path / "gptq"
    shutil.copytree(d, other)
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BonsaiError, match="'gptq' is not a PTQ1_0 directory"):
        run_convert(other, tmp_path / "g.gguf")


def test_ternary_code_minus_two_is_refused(ptq1_setup, tmp_path):
    from safetensors.numpy import load_file, save_file

    m, d, truth = ptq1_setup
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    st = load_file(str(bad / "model.safetensors"))
    st["model.layers.0.mlp.gate_proj.weight_packed"][0, 0] = 0   # offset code 0 = value -2
    save_file(st, str(bad / "model.safetensors"))
    with pytest.raises(BonsaiError, match=r"gate_proj.weight: ptq1_0 codes must lie in \[-1, 1\]"):
        run_convert(bad, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
