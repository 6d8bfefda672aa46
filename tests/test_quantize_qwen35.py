"""`bonsai quantize` on a tiny random Qwen3.5 (hybrid Gated DeltaNet + gated attention; issue #16).

The model (tests/qwen35_factory.py) has every quantized width a multiple of 128 and V heads of
dv = 128 (as the real Qwen3.5 models): the converter reorders out_proj's columns by whole V heads
(grouped -> tiled), which moves whole PTQ1_0 groups of a packed out_proj only when dv is a
multiple of the group. Its linear weights are made near-ternary (a ternary matrix per group of
128 plus 2% noise): random Gaussian weights lose ~40% of every layer's output at 1.58 bits, and
four such layers leave logits no closer to the float model's than chance, while a near-ternary
model says whether the quantizer finds the ternary structure through every GDN tensor. Calibrated
through transformers' own layers on a few short samples, on the CPU, into a PTQ1_0 directory and
a GGUF; checks:
- quant_config.json and the GGUF's fallback table: the GDN in_proj_qkv / in_proj_z / out_proj at
  PTQ1_0, in_proj_a / in_proj_b at F16, conv1d / A_log / dt_bias / norm at F32;
- the GGUF's ssm_out is exactly the tiled reorder of the directory's packed out_proj;
- the engine loads it (arch qwen35); its logits equal transformers' forward of the stored
  (dequantized) weights, and follow the float model's (cosine, top-1 agreement);
- exactly ternary GDN weights are detected and packed losslessly, without calibration;
- bonsai_run generates with it; the MoE variants are still refused before any work.
"""

from __future__ import annotations

import copy
import json
import subprocess

import numpy as np
import pytest

from conftest import bonsai_run_path, run_cli
from gguf_readback import read_gguf
from model_factory import write_calibration
from qwen35_factory import make_qwen35_model

torch = pytest.importorskip("torch")

# hidden 128, ffn 256, attention 2 x 64 (q_proj 2 x 128 rows: query and gate), GDN K 2 x 32,
# V 4 x 128: every quantized matrix has whole groups of 128 columns, out_proj whole heads of them
WIDE = dict(hidden_size=128, intermediate_size=256, head_dim=64, num_attention_heads=2,
            num_key_value_heads=1, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=32, linear_value_head_dim=128)
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 120, 64, 11, 200, 33, 1, 2, 90]
GDN_TERNARY = ("in_proj_qkv", "in_proj_z", "out_proj")
TERNARY_LINEARS = GDN_TERNARY + ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                 "down_proj")


def _make_ternary(d, noise: float, seed: int = 0) -> None:
    """Rewrites d/model.safetensors with every block linear weight but in_proj_a / in_proj_b
    replaced by scale x {-1, 0, +1} per group of 128 (absmean threshold) plus `noise` x its scale
    of Gaussian noise."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(seed)
    path = d / "model.safetensors"
    tensors = load_file(str(path))
    for name, w in tensors.items():
        if not any(f".{k}." in name for k in TERNARY_LINEARS):
            continue
        g = w.reshape(w.shape[0], -1, 128).astype(np.float64)
        mean = np.abs(g).mean(axis=2, keepdims=True)
        codes = np.sign(g) * (np.abs(g) > 0.7 * mean)
        scale = (np.abs(g) * np.abs(codes)).sum(2, keepdims=True) / np.maximum(
            np.abs(codes).sum(2, keepdims=True), 1)
        scale = scale.astype(np.float16).astype(np.float64)       # an fp16 scale: exact
        t = codes * scale * (1.0 + noise * rng.standard_normal(g.shape))
        tensors[name] = t.reshape(w.shape).astype(np.float32)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _float_model(d):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()


def _cosines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    a, b = x - x.mean(1, keepdims=True), y - y.mean(1, keepdims=True)
    return (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35_quant")
    m = make_qwen35_model(d / "hf", seed=3, **WIDE)
    _make_ternary(d / "hf", noise=0.02)
    r = run_cli("quantize", "--model-dir", d / "hf", "--output-dir", d / "ptq1",
                "--outfile", d / "m.gguf", "--calib-file", write_calibration(d / "c.jsonl"),
                "--max-samples", 8, "--seq-len", 64, "--device", "cpu", "--no-progress",
                # the near-ternary weights quantize almost losslessly, so what the logits test
                # below measures is the GDN path; a Q8_0 embedding and head (the default) would be
                # most of this random model's remaining error
                "--embed-type", "f16")
    assert r.returncode == 0, r.stderr
    return m, d, r.stderr


def test_types_in_quant_config_and_fallback_table(quantized):
    _, d, log = quantized
    qc = json.loads((d / "ptq1" / "quant_config.json").read_text())
    types = {r["tensor"]: r["dtype"] for r in qc["tensors"]}
    for i in range(3):                                          # layers 0-2: GDN
        la = f"model.layers.{i}.linear_attn."
        for n in GDN_TERNARY:
            assert types[la + n + ".weight"] == "ptq1_0", n
        assert types[la + "in_proj_a.weight"] == types[la + "in_proj_b.weight"] == "F16"
        for n in ("conv1d.weight", "A_log", "dt_bias", "norm.weight"):
            assert types[la + n] == "F32", n
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):          # layer 3: gated attention
        assert types[f"model.layers.3.self_attn.{n}.weight"] == "ptq1_0"
    assert "fallback layer table" in log and "in_proj_a.weight  F16" in log

    rb = read_gguf(d / "m.gguf")
    assert rb.metadata["general.architecture"] == "qwen35"
    fallback = json.loads(rb.metadata["bonsai.fallback_table"])
    by_name = {e["tensor"]: e for e in fallback}
    for i in range(3):
        assert rb.types[f"blk.{i}.attn_qkv.weight"] == "PTQ1_0"
        assert rb.types[f"blk.{i}.attn_gate.weight"] == "PTQ1_0"
        assert rb.types[f"blk.{i}.ssm_out.weight"] == "PTQ1_0"
        assert rb.types[f"blk.{i}.ssm_conv1d.weight"] == "F32"
        assert rb.types[f"blk.{i}.ssm_a"] == "F32"
        for n in ("ssm_alpha", "ssm_beta"):
            assert rb.types[f"blk.{i}.{n}.weight"] == "F16"
            assert by_name[f"blk.{i}.{n}.weight"]["type"].upper() == "F16"
        assert f"blk.{i}.ssm_out.weight" not in by_name


def test_packed_out_proj_is_reordered_exactly(quantized):
    from bonsai_runner.convert.arch.qwen35 import tile_v_heads
    from bonsai_runner.convert.ptq1_dir import Ptq1Dir

    _, d, _ = quantized
    src = Ptq1Dir(d / "ptq1")
    rb = read_gguf(d / "m.gguf")
    for i in range(3):
        want = tile_v_heads(src.read_float32(f"model.layers.{i}.linear_attn.out_proj.weight"),
                            1, 2, 4, 128)
        np.testing.assert_array_equal(rb.values(f"blk.{i}.ssm_out.weight"), want)
        # and the rows of z: a row permutation of the packed tensor
        z = tile_v_heads(src.read_float32(f"model.layers.{i}.linear_attn.in_proj_z.weight"),
                         0, 2, 4, 128)
        np.testing.assert_array_equal(rb.values(f"blk.{i}.attn_gate.weight"), z)


def test_engine_logits_follow_the_float_model(quantized):
    from bonsai_runner.convert.ptq1_dir import Ptq1Dir

    core = pytest.importorskip("bonsai_runner._core")
    _, d, _ = quantized
    fm = _float_model(d / "hf")
    stored = copy.deepcopy(fm)
    src = Ptq1Dir(d / "ptq1")
    sd = stored.state_dict()
    with torch.no_grad():
        for n, v in sd.items():
            v.copy_(torch.from_numpy(src.read_float32(n).reshape(v.shape)))
        want = fm(torch.tensor([PROMPT])).logits[0].numpy()
        ref = stored(torch.tensor([PROMPT])).logits[0].numpy()
    with core.Model(str(d / "m.gguf")) as mm:
        assert mm.arch == "qwen35"
        assert mm.layer_table().count("GDN qkv PTQ1_0  z PTQ1_0  alpha F16  beta F16  out PTQ1_0") == 3
        logits = {}
        for act in ("float", "int8"):
            with core.Context(mm, n_ctx=64, n_batch=64, n_threads=2, act_mode=act) as ctx:
                logits[act] = ctx.decode(PROMPT, logits="all").astype(np.float64)
    # the file is exactly the stored weights (float activations)
    assert np.abs(logits["float"] - ref).max() <= 1e-3 * ref.std()
    # and the stored weights keep the float model's logits (random: cosine ~0, top-1 ~1/336)
    for act, got in logits.items():
        cos, top1 = _cosines(got, want), (got.argmax(1) == want.argmax(1)).mean()
        # the float model's top token among the quantized model's best 3 (the random model's
        # leading logits are often near ties, which 2% weight noise can swap)
        top3 = np.mean([want[t].argmax() in np.argsort(-got[t])[:3] for t in range(len(got))])
        assert cos.mean() > 0.95 and cos.min() > 0.85, (act, cos)
        assert top1 >= 0.4 and top3 >= 0.8, (act, top1, top3)


def test_bonsai_run_generates(quantized):
    _, d, _ = quantized
    # bytes: a random model's tokens need not decode as UTF-8
    r = subprocess.run([bonsai_run_path(), "--model", str(d / "m.gguf"), "-p", "def add(a, b):",
                        "-n", "8", "--temp", "0", "--threads", "2"], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    assert r.stdout.startswith(b"def add(a, b):") and len(r.stdout) > len(b"def add(a, b):")


def test_exactly_ternary_gdn_weights_are_packed_losslessly(tmp_path):
    make_qwen35_model(tmp_path / "hf", seed=2, **WIDE)
    _make_ternary(tmp_path / "hf", noise=0.0)
    r = run_cli("quantize", "--model-dir", tmp_path / "hf", "--output-dir", tmp_path / "o",
                "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "already ternary: packing them losslessly without calibration" in r.stderr
    assert not any(ln.startswith("calibration:") for ln in r.stderr.splitlines())
    from bonsai_runner.convert.ptq1_dir import Ptq1Dir
    from safetensors.numpy import load_file

    src = Ptq1Dir(tmp_path / "o")
    want = load_file(str(tmp_path / "hf" / "model.safetensors"))
    for i in range(3):
        la = f"model.layers.{i}.linear_attn."
        for n in GDN_TERNARY:
            assert src.tier_of(la + n + ".weight").name == "ptq1_0"
            np.testing.assert_allclose(src.read_float32(la + n + ".weight"),
                                       want[la + n + ".weight"], rtol=1e-3, atol=0)
        assert src.tier_of(la + "in_proj_a.weight") is None
        np.testing.assert_array_equal(src.read_float32(la + "A_log"), want[la + "A_log"])
        np.testing.assert_array_equal(src.read_float32(la + "conv1d.weight"),
                                      want[la + "conv1d.weight"])


def test_out_proj_whose_heads_split_groups_is_refused_before_work(tmp_path):
    """dv = 64 with PTQ1_0 groups of 128: the tiled reorder would split the packed groups."""
    wide = dict(WIDE, linear_value_head_dim=64)
    make_qwen35_model(tmp_path / "hf", seed=1, **wide)
    r = run_cli("quantize", "--model-dir", tmp_path / "hf", "--output-dir", tmp_path / "o",
                "--calib-file", write_calibration(tmp_path / "c.jsonl"), "--no-progress")
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert "out_proj.weight" in err[-1] and "whole V heads" in err[-1], r.stderr
    assert "out_proj=q8_0" in err[-1]
    assert not any(ln.startswith("calibration:") for ln in err)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("model_type", ["qwen3_5_moe_text", "qwen3_5_moe"])
def test_moe_variants_are_refused_before_any_work(tmp_path, model_type):
    make_qwen35_model(tmp_path / "hf", seed=1, **WIDE)
    cfg_path = tmp_path / "hf" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_type"] = model_type
    cfg_path.write_text(json.dumps(cfg))
    r = run_cli("quantize", "--model-dir", tmp_path / "hf", "--output-dir", tmp_path / "o",
                "--calib-file", write_calibration(tmp_path / "c.jsonl"), "--no-progress")
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert model_type in err[-1] and "engine cannot run it" in err[-1], r.stderr
    assert not (tmp_path / "o").exists()


def test_conditional_layout_is_refused_clearly(tmp_path):
    make_qwen35_model(tmp_path / "hf", seed=1, layout="conditional", **WIDE)
    r = run_cli("quantize", "--model-dir", tmp_path / "hf", "--output-dir", tmp_path / "o",
                "--calib-file", write_calibration(tmp_path / "c.jsonl"), "--no-progress")
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert "Qwen3_5ForConditionalGeneration" in err[-1] and "not supported" in err[-1], r.stderr
    assert not (tmp_path / "o").exists()
