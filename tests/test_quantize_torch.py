"""The quantizer's torch substrate and transformers' layers (issue #16).

Oracles: the previous numpy float64 quantizer (tests/numpy_quantizer.py) for the exact ternary
fit, the GPTQ sweep and the scale refit; transformers' own whole-model forward for the one-layer
machinery (hf_layers.py) on a tiny random Qwen3.5 (hybrid Gated DeltaNet + gated attention).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from model_factory import make_hf_model, write_calibration
from numpy_quantizer import fit_ternary_groups as np_fit
from numpy_quantizer import quantize_layer as np_quantize_layer

from bonsai_runner.errors import BonsaiError
from bonsai_runner.quantize.gptq import quantize_layer
from bonsai_runner.quantize.hf_layers import (HfLayers, linear_inputs, resolve_device,
                                              resolve_forward_dtype)
from bonsai_runner.quantize.ternary_fit import fit_ternary_groups

TIERS = ("ptq1_0", "q2_0", "q2_0_4l", "q4_0", "q8_0")


def _layer_problem(seed=0, rows=96, cols=256, n=1024):
    """A layer with uneven input channels (as real activations have) and its Hessian."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, cols)) * np.exp(rng.standard_normal(cols))
    return rng.standard_normal((rows, cols)).astype(np.float32), 2 * X.T @ X / n


def test_fit_matches_the_numpy_oracle_in_float64_and_float32():
    rng = np.random.default_rng(4)
    w, h = rng.standard_normal((40, 3, 128)), rng.exponential(size=128)
    want_c, want_s = np_fit(w, h)
    c, s = fit_ternary_groups(torch.from_numpy(w), torch.from_numpy(h))
    np.testing.assert_array_equal(c.numpy(), want_c)
    np.testing.assert_array_equal(s.numpy().astype(np.float32), want_s)
    c32, s32 = fit_ternary_groups(torch.from_numpy(w).float(), torch.from_numpy(h).float())
    assert (c32.numpy() == want_c).mean() > 0.999
    np.testing.assert_allclose(s32.numpy(), want_s, rtol=1e-3)


@pytest.mark.parametrize("tier", TIERS)
def test_gptq_and_refit_match_the_numpy_oracle(tier):
    w, H = _layer_problem()
    want = np_quantize_layer(w, H, tier)
    # float64: the same algorithm, the same codes (scales to one float16 step of a refit tie)
    got = quantize_layer(torch.from_numpy(w).double(), torch.from_numpy(H), tier, cd_sweeps=0)
    np.testing.assert_array_equal(got.codes.numpy(), want.codes)
    np.testing.assert_allclose(got.scales.numpy(), want.scales, rtol=2e-3, atol=0)
    assert got.err == pytest.approx(want.err, rel=1e-6)
    # float32, the quantizer's default: the same layer-output errors to float32 rounding
    f32 = quantize_layer(torch.from_numpy(w), torch.from_numpy(H).float(), tier, cd_sweeps=0)
    for name in ("err_plain", "err_gptq", "err"):
        assert getattr(f32, name) == pytest.approx(getattr(want, name), rel=2e-3), name
    assert (f32.codes.numpy() == want.codes).mean() > 0.99


@pytest.mark.parametrize("tier", ["ptq1_0", "q2_0_4l", "q4_0"])
def test_coordinate_descent_reaches_a_coordinate_wise_optimum(tier):
    """Every sweep keeps or lowers tr(E H E^T); once it stops moving, no single code of any row
    can be changed to another grid value for a lower error (checked by brute force), and the
    quantize_layer result with it is better than GPTQ + refit alone."""
    from bonsai_runner.quantize.gptq import coordinate_descent, dequantize, grid, output_error

    w, H = _layer_problem(seed=3, rows=12, cols=256, n=512)
    W, Ht = torch.from_numpy(w).double(), torch.from_numpy(H)
    g = grid(tier)
    base = quantize_layer(W, Ht, tier, cd_sweeps=0)
    codes, errs = base.codes, [output_error(W, base.dequantize(torch.float64), Ht)]
    for _ in range(30):
        codes, changed = coordinate_descent(W, codes, base.scales, Ht, g, sweeps=1)
        errs.append(output_error(W, dequantize(codes, base.scales, g.group, torch.float64), Ht))
        if changed == 0:
            break
    assert changed == 0 and all(b <= a * (1 + 1e-12) for a, b in zip(errs, errs[1:]))
    assert errs[-1] < 0.97 * errs[0]
    S = base.scales.repeat_interleave(g.group, dim=1)
    E = codes.double() * S - W
    f = torch.einsum("rc,cd,rd->r", E, Ht, E)
    for c in range(0, 256, 7):                       # every 7th column, every other code value
        for v in range(g.qmin, g.qmax + 1):
            E2 = E.clone()
            E2[:, c] = v * S[:, c] - W[:, c]
            f2 = torch.einsum("rc,cd,rd->r", E2, Ht, E2)
            assert bool((f2 >= f - 1e-9 * f.abs()).all()), (c, v)
    if g.coarse:
        assert quantize_layer(W, Ht, tier).err < base.err


def test_device_choice():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(BonsaiError, match="one of auto, cpu, cuda"):
        resolve_device("gpu")
    if torch.cuda.is_available():
        assert resolve_device("auto").type == "cuda"
        with pytest.raises(BonsaiError, match="CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
    else:
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(BonsaiError, match="no CUDA GPU"):
            resolve_device("cuda")


# ----- Qwen3.5 (hybrid) through transformers' own layer code -----

QWEN35 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=300, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_conv_kernel_dim=4, full_attention_interval=4)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("qwen3_5_text", **QWEN35)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    d = tmp_path_factory.mktemp("qwen35") / "m"
    model.save_pretrained(d)
    return d, model


def test_qwen35_layers_run_as_transformers_runs_them(qwen35):
    d, model = qwen35
    config = json.loads((d / "config.json").read_text())
    hl = HfLayers(config, torch.device("cpu"))
    sd = model.state_dict()
    ids = torch.randint(0, QWEN35["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    kinds = []
    for i in range(QWEN35["num_hidden_layers"]):
        params = {n: sd[f"model.layers.{i}.{n}"] for n in hl.param_names(i)}
        with torch.no_grad():
            got = hl.forward(i, params, states[i])
        want = states[i + 1] if i + 1 < QWEN35["num_hidden_layers"] else None
        if want is not None:               # the last hidden state is after the final norm
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        kinds.append(linear_inputs(hl, i, params, states[i]))
    gdn = ["linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
           "linear_attn.in_proj_a"]
    mlp = [["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]
    assert kinds[0] == [gdn, ["linear_attn.out_proj"]] + mlp
    assert kinds[3] == [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
                        ["self_attn.o_proj"]] + mlp


def test_bfloat16_forward_is_float32_outside_and_close_to_the_float32_one(qwen35):
    """--forward-dtype bfloat16: the layer output and every captured input come back float32,
    within bfloat16's rounding of the float32 forward; the stage discovery is unchanged, and a
    forward under autograd (the refinement) stays float32 exactly."""
    d, model = qwen35
    config = json.loads((d / "config.json").read_text())
    f32 = HfLayers(config, torch.device("cpu"))
    bf16 = HfLayers(config, torch.device("cpu"), forward_dtype=torch.bfloat16)
    sd = model.state_dict()
    x = torch.randn(2, 16, QWEN35["hidden_size"], generator=torch.Generator().manual_seed(4))
    for i in (0, 3):                                   # a GDN layer and an attention layer
        params = {n: sd[f"model.layers.{i}.{n}"] for n in f32.param_names(i)}
        caps = {}
        with torch.no_grad():
            want = f32.forward(i, params, x, lambda n, a: caps.setdefault(("f", n), a))
            got = bf16.forward(i, params, x, lambda n, a: caps.setdefault(("b", n), a))
        assert got.dtype == torch.float32
        rel = float((got - want).norm() / (want - x).norm())
        assert 0 < rel < 0.03, rel
        for (tag, n), a in caps.items():
            if tag == "b":
                assert a.dtype == torch.float32
                ref = caps[("f", n)]
                assert float((a - ref).norm() / ref.norm()) < 0.03, n
        assert linear_inputs(bf16, i, params, x) == linear_inputs(f32, i, params, x)
        with torch.enable_grad():
            torch.testing.assert_close(bf16.forward(i, params, x), want, rtol=0, atol=0)


def test_forward_dtype_choice():
    cpu = torch.device("cpu")
    assert resolve_forward_dtype("float32", cpu) == torch.float32
    assert resolve_forward_dtype("bfloat16", cpu) == torch.bfloat16
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert resolve_forward_dtype("auto", cpu) == (torch.bfloat16 if native else torch.float32)
    with pytest.raises(BonsaiError, match="--forward-dtype 'half'"):
        resolve_forward_dtype("half", cpu)


def test_qwen35_gdn_projection_is_calibrated_by_gptq(qwen35):
    """The GDN in_proj_qkv is a linear weight like any other: its Hessian from the captured
    inputs of transformers' layer, then GPTQ lowers its output error below the plain fit."""
    d, model = qwen35
    hl = HfLayers(json.loads((d / "config.json").read_text()), torch.device("cpu"))
    sd = model.state_dict()
    params = {n: sd[f"model.layers.0.{n}"] for n in hl.param_names(0)}
    x = torch.randn(4, 32, QWEN35["hidden_size"], generator=torch.Generator().manual_seed(2))
    got = []
    with torch.no_grad():
        hl.forward(0, params, x, lambda n, a: got.append(a) if n.endswith("in_proj_qkv") else None,
                   "linear_attn.in_proj_qkv")
    a = got[0]
    res = quantize_layer(params["linear_attn.in_proj_qkv.weight"], 2 * a.T @ a / a.shape[0],
                         "q2_0")
    assert res.err_gptq < res.err_plain and res.err <= res.err_gptq


def test_qwen35_moe_is_refused_before_any_work(qwen35, tmp_path):
    """Qwen3.5 quantizes (tests/test_quantize_qwen35.py); its MoE variant the engine cannot run."""
    d, _ = qwen35
    moe = tmp_path / "moe"
    moe.mkdir()
    cfg = json.loads((d / "config.json").read_text())
    (moe / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3_5_moe_text"}))
    for f in d.iterdir():
        if f.name != "config.json":
            (moe / f.name).symlink_to(f)
    out = tmp_path / "o"
    r = run_cli("quantize", "--model-dir", moe, "--output-dir", out,
                "--calib-file", write_calibration(tmp_path / "c.jsonl"), "--no-progress")
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert "qwen3_5_moe_text" in err[-1] and "engine cannot run it" in err[-1], r.stderr
    assert not any(ln.startswith("calibration:") for ln in err)      # nothing tokenized
    assert not out.exists()


def test_report_has_the_device_and_time_per_stage(tmp_path):
    from bonsai_runner.convert.ptq1_dir import Ptq1Dir
    from bonsai_runner.quantize import QuantizeOptions, quantize_model

    m = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", seed=3, hidden=128,
                      ffn=256, n_layer=1, n_head=4, n_head_kv=2)
    logs = []
    res = quantize_model(QuantizeOptions(
        model_dir=str(m["dir"]), output_dir=str(tmp_path / "o"),
        calib_file=str(write_calibration(tmp_path / "c.jsonl")), seq_len=32, max_samples=4,
        batch_size=2, calib_steps=1, progress=False, device="cpu"), log=logs.append)
    timing = Ptq1Dir(tmp_path / "o").quant_config["calibration"]["compute"]
    assert timing == res["report"]["timing"] and timing["device"] == "cpu"
    assert timing["forward_dtype"] in ("float32", "bfloat16")
    assert {"load", "hessian", "gptq", "refine", "forward", "write"} <= set(timing["seconds"])
    assert timing["total_seconds"] >= sum(timing["seconds"].values()) - 1e-3
    assert any(ln.startswith("time on cpu:") for ln in logs)


def test_bfloat16_forward_runs_the_whole_pipeline(tmp_path):
    """An explicit --forward-dtype bfloat16 (emulated on CPUs without it, native where auto picks
    it): the Hessians captured inside the autocast forward are float32 sums (the --target-bpw
    pre-pass accumulates them in the capture hook), the result is written and says its dtype."""
    from bonsai_runner.convert.ptq1_dir import Ptq1Dir
    from bonsai_runner.quantize import QuantizeOptions, quantize_model

    m = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", seed=5, hidden=128,
                      ffn=256, n_layer=2, n_head=4, n_head_kv=2)
    res = quantize_model(QuantizeOptions(
        model_dir=str(m["dir"]), output_dir=str(tmp_path / "o"), target_bpw=3.0,
        calib_file=str(write_calibration(tmp_path / "c.jsonl")), seq_len=32, max_samples=4,
        batch_size=2, progress=False, device="cpu", forward_dtype="bfloat16"), log=lambda m: None)
    assert Ptq1Dir(tmp_path / "o").quant_config["calibration"]["compute"]["forward_dtype"] \
        == "bfloat16"
    errs = [v["err"] for b in res["report"]["blocks"] for v in b["layers"].values()
            if isinstance(v, dict) and "err" in v]
    assert errs and all(0 <= e < 1 for e in errs)


@pytest.mark.parametrize("arch", ["qwen2", "qwen35"])
@pytest.mark.parametrize("forward_dtype", ["float32", "bfloat16"])
def test_mixer_shortcut_changes_nothing(tmp_path, monkeypatch, arch, forward_dtype):
    """The later stages of a block take the attention / Gated DeltaNet output from the cached
    inputs of o_proj / out_proj (pipeline.Shortcut): the written tensors are the same bytes as
    with the mixer re-run at every stage, and the shortcut was taken (checked exact, not
    fallen back)."""
    from bonsai_runner.quantize import QuantizeOptions, quantize_model
    from bonsai_runner.quantize import pipeline

    if arch == "qwen2":
        d = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", seed=6, hidden=128,
                          ffn=256, n_layer=2, n_head=4, n_head_kv=2)["dir"]
    else:
        from qwen35_factory import make_qwen35_model

        d = tmp_path / "m"
        make_qwen35_model(d, seed=3, hidden_size=128, intermediate_size=256, head_dim=64,
                          num_attention_heads=2, num_key_value_heads=1, linear_num_key_heads=2,
                          linear_num_value_heads=4, linear_key_head_dim=32,
                          linear_value_head_dim=128)
    calib = write_calibration(tmp_path / "c.jsonl")
    made = []
    real = pipeline.BlockRunner.shortcut
    monkeypatch.setattr(pipeline.BlockRunner, "shortcut",
                        lambda self, *a: made.append(real(self, *a)) or made[-1])
    outs = {}
    for tag, inputs in (("short", pipeline.SHORTCUT_INPUTS), ("full", ())):
        monkeypatch.setattr(pipeline, "SHORTCUT_INPUTS", inputs)
        quantize_model(QuantizeOptions(
            model_dir=str(d), output_dir=str(tmp_path / tag), calib_file=str(calib), seq_len=32,
            max_samples=6, batch_size=4, progress=False, device="cpu",
            forward_dtype=forward_dtype), log=lambda m: None)
        outs[tag] = (tmp_path / tag / "model.safetensors").read_bytes()
    n_layer = 2 if arch == "qwen2" else 4
    assert len(made) == n_layer and all(s is not None for s in made)
    assert outs["short"] == outs["full"]


def test_hessian_sums_by_panels_are_the_full_gram_matrix():
    """_gram_add sums only on and above the diagonal; _symmetric mirrors it: the result is
    2 X^T X / n of all batches, exactly symmetric, for widths that do not split evenly too."""
    from bonsai_runner.quantize.pipeline import _gram_add, _symmetric

    g = torch.Generator().manual_seed(7)
    for n in (1, 5, 130, 896):
        batches = [torch.randn(64, n, generator=g, dtype=torch.float64) for _ in range(3)]
        H = None
        for a in batches:
            H = _gram_add(H, a)
        got = _symmetric(H, 2.0 / 192)
        X = torch.cat(batches)
        torch.testing.assert_close(got, 2 * X.T @ X / 192, rtol=1e-12, atol=1e-12)
        assert torch.equal(got, got.T)
