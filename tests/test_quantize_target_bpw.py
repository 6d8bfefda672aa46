"""--target-bpw: the greedy promotion (policy.py), the cheap plain-fit pre-pass (pipeline.py,
gptq.plain_fit_errors) and a tiny-model run that reaches its budget with a fallback table.

Oracles: hand-computed greedy orders; the full quantizer's own plain-fit error (quantize_layer's
err_plain) for the estimate; _hessian_of / forward_batched for the one-forward Hessians; the
written directory's tensor types for the budget.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from model_factory import make_hf_model, write_calibration

from bonsai_runner.errors import BonsaiError
from bonsai_runner.quantize import QuantizeOptions, pipeline, quantize_model
from bonsai_runner.quantize.hf_layers import INPUT_OF, STAGES, HfLayers
from bonsai_runner.quantize.calibration import Tokenizer, load_calibration
from bonsai_runner.quantize.gptq import plain_fit_errors, quantize_layer
from bonsai_runner.quantize.pipeline import BlockLoader, BlockRunner
from bonsai_runner.quantize.policy import promote_to_target, promotion_chain, tier_bpw

SMALL = dict(hidden=128, ffn=256, n_layer=2, n_head=4, n_head_kv=2)
FAST = dict(seq_len=32, max_samples=8, batch_size=4, progress=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_hf_model(tmp_path_factory.mktemp("tbpw") / "m", arch="qwen2", tokenizer="bpe",
                         seed=5, **SMALL)


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory):
    return write_calibration(tmp_path_factory.mktemp("calib") / "calib.jsonl")


def _errs(p1, q2, q4, q8):
    return {"ptq1_0": p1, "q2_0_4l": q2, "q4_0": q4, "q8_0": q8}


def _avg(choice, items):
    n = sum(it["params"] for it in items.values())
    return sum(items[k]["params"] * tier_bpw(t) for k, t in choice.items()) / n


# ----- the greedy promotion -----

def test_promotion_reaches_the_budget_in_gain_order_and_keeps_pinned():
    items = {
        "flat": {"params": 1000, "pinned": None, "err": _errs(0.30, 0.29, 0.28, 0.27)},
        "big_win": {"params": 1000, "pinned": None, "err": _errs(0.50, 0.20, 0.05, 0.01)},
        "mid": {"params": 1000, "pinned": None, "err": _errs(0.40, 0.30, 0.10, 0.02)},
        "pin": {"params": 1000, "pinned": "ptq1_0", "err": {}},
    }
    start = _avg({k: "ptq1_0" for k in items}, items)
    step = (tier_bpw("q2_0_4l") - tier_bpw("ptq1_0")) / 4          # one tensor one tier, averaged
    # the budget is a ceiling: half a step buys nothing
    assert set(promote_to_target(start + 0.5 * step, items, "ptq1_0").values()) == {"ptq1_0"}
    # one promotion: the largest error drop per bit that fits is big_win's PTQ1_0 -> Q2_0
    one = promote_to_target(start + 1.5 * step, items, "ptq1_0")
    assert one == {"flat": "ptq1_0", "big_win": "q2_0_4l", "mid": "ptq1_0", "pin": "ptq1_0"}
    # a higher budget is filled up to less than one tier step, never exceeded; the pinned tensor
    # stays
    for target in (3.0, 4.0, 6.0):
        c = promote_to_target(target, items, "ptq1_0")
        assert c["pin"] == "ptq1_0"
        got = _avg(c, items)
        assert target - (tier_bpw("q8_0") - tier_bpw("q4_0")) / 4 - 1e-9 < got <= target + 1e-9
    # the flat tensor is promoted last: not while the others' promotions fit, and at 3.0 only
    # to Q2_0, with the bits left over that no other promotion fits in
    c = promote_to_target(start + 2 * step, items, "ptq1_0")
    assert c == {"flat": "ptq1_0", "big_win": "q2_0_4l", "mid": "q2_0_4l", "pin": "ptq1_0"}
    c = promote_to_target(3.0, items, "ptq1_0")
    assert c["big_win"] != "ptq1_0" and c["mid"] != "ptq1_0" and c["flat"] in ("ptq1_0", "q2_0_4l")


def test_promotion_jumps_straight_to_the_tier_with_the_best_gain_per_bit():
    # "jump": Q2_0 barely helps, Q4_0 nearly removes the error; "step": Q2_0 helps a little more
    # per bit than jump's Q2_0 but less than jump's Q4_0. One Q4_0's worth of budget: a one-tier
    # greedy spends it on step (PTQ1_0 -> Q2_0 -> Q4_0, total loss 0.16 + 0.078); the jump on
    # jump's Q4_0 (0.0025 + 0.16).
    items = {
        "jump": {"params": 1000, "pinned": None, "err": _errs(0.40, 0.39, 0.05, 0.01)},
        "step": {"params": 1000, "pinned": None, "err": _errs(0.40, 0.37, 0.28, 0.27)},
    }
    target = _avg({"jump": "q4_0", "step": "ptq1_0"}, items)
    assert promote_to_target(target, items, "ptq1_0") == {"jump": "q4_0", "step": "ptq1_0"}
    # with budget for both, both are promoted and the average stays under the budget
    target = _avg({"jump": "q4_0", "step": "q4_0"}, items) + 0.1
    c = promote_to_target(target, items, "ptq1_0")
    assert c == {"jump": "q4_0", "step": "q4_0"} and _avg(c, items) <= target


def test_promotion_gain_is_weighted_by_output_energy():
    items = {
        "loud": {"params": 1000, "pinned": None, "err": _errs(0.3, 0.2, 0.1, 0.01),
                 "weight": 100.0},
        "quiet": {"params": 1000, "pinned": None, "err": _errs(0.6, 0.2, 0.1, 0.01),
                  "weight": 1.0},
    }
    target = _avg({"loud": "q2_0_4l", "quiet": "ptq1_0"}, items) + 1e-6   # one Q2_0 fits
    assert promote_to_target(target, items, "ptq1_0")["loud"] == "q2_0_4l"
    for it in items.values():
        it["weight"] = 1.0
    assert promote_to_target(target, items, "ptq1_0")["quiet"] == "q2_0_4l"


# ----- the cheap estimate -----

def _block_and_hessians(model, calib_file):
    from bonsai_runner.convert.arch import family_for
    from bonsai_runner.convert.hf_reader import HfCheckpoint

    ck = HfCheckpoint(model["dir"])
    fam = family_for(ck.config, "config.json")
    run = BlockRunner(HfLayers(ck.config, torch.device("cpu")), 3)
    cal = load_calibration(calib_file, Tokenizer(model["dir"]), 32, 8, 0, fam.hp.n_vocab)
    x = torch.from_numpy(BlockLoader(ck).read("model.embed_tokens.weight")[cal.tokens])
    w = {k: torch.from_numpy(v) for k, v in BlockLoader(ck).load_block(0).items()}
    return x, w, run


def test_one_forward_gives_every_stage_hessian(model, calib_file):
    x, w, run = _block_and_hessians(model, calib_file)
    wanted = {INPUT_OF[s[0]] for s in STAGES if s[0] in w}      # this layer's kind of stages
    Hs, out = run.stage_hessians(0, w, x, wanted)
    assert set(Hs) == wanted
    for name in wanted:
        np.testing.assert_allclose(Hs[name].numpy(), run.hessian(0, w, x, name).numpy(),
                                   rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(out.numpy(), run.forward(0, w, x).numpy())


def test_plain_fit_estimate_is_the_full_quantizers_plain_error(model, calib_file):
    x, w, run = _block_and_hessians(model, calib_file)
    for key in ("q", "o", "down"):
        H = run.hessian(0, w, x, INPUT_OF[key])
        est, energy = plain_fit_errors(w[key], H, promotion_chain("ptq1_0"))
        w64, H64 = w[key].double(), H.double()
        # float32 products against the float64 trace
        assert energy == pytest.approx(float(torch.trace(w64 @ H64 @ w64.T)), rel=1e-5)
        for t in promotion_chain("ptq1_0"):
            full = quantize_layer(w[key], H, t)
            assert est[t] == pytest.approx(full.err_plain, rel=1e-9)
            assert full.err <= est[t] + 1e-12
        assert est["ptq1_0"] > est["q2_0_4l"] > est["q4_0"] > est["q8_0"]


# ----- the pipeline -----

def test_target_bpw_run_reaches_its_budget_with_a_fallback_table(model, calib_file, tmp_path,
                                                                  monkeypatch):
    calls = []
    real = pipeline.quantize_layer

    def counting(w, H, tier, damp=0.01, prep=None):
        calls.append(tier)
        return real(w, H, tier, damp, prep)

    monkeypatch.setattr(pipeline, "quantize_layer", counting)
    logs = []
    target = 3.0
    res = quantize_model(QuantizeOptions(model_dir=str(model["dir"]), output_dir=str(tmp_path / "o"),
                                         calib_file=str(calib_file), target_bpw=target, **FAST),
                         log=logs.append)
    s = res["summary"]
    from bonsai_runner.convert.ptq1_dir import Ptq1Dir

    q = Ptq1Dir(tmp_path / "o").quant_config
    lin = {r["tensor"]: r for r in q["tensors"] if ".layers." in r["tensor"]
           and len(r["shape"]) == 2}
    sizes = {n: int(np.prod(r["shape"])) for n, r in lin.items()}
    biggest_step = max(sizes.values()) * 4.0 / sum(sizes.values())
    assert target - biggest_step <= s["bpw_linear"] <= target + 1e-9      # a ceiling
    promoted = [n for n, r in lin.items()
                if r["fallback_reason"] and "target-bpw" in r["fallback_reason"]]
    assert promoted and all(lin[n]["dtype"] != "ptq1_0" for n in promoted)
    assert any(r["dtype"] == "ptq1_0" for r in lin.values())
    table = logs[next(i for i, ln in enumerate(logs) if ln.startswith("fallback layer table")):]
    for n in promoted:
        assert any(ln.lstrip().startswith(n) for ln in table), n
    # the pre-pass ran no GPTQ: one quantize_layer per layer of the main pass, at its tier (a
    # layer at Q8_0 takes the reference blocks, no GPTQ)
    assert sorted(calls) == sorted(r["dtype"] for r in lin.values() if r["dtype"] != "q8_0")
    assert any(ln.startswith("--target-bpw 3.0:") and "promoted" in ln for ln in logs)


def test_target_bpw_just_above_all_ternary_quantizes_down_proj_ternary(model, calib_file,
                                                                       tmp_path):
    lo = tier_bpw("ptq1_0") + 1e-3
    res = quantize_model(QuantizeOptions(model_dir=str(model["dir"]), output_dir=str(tmp_path / "o"),
                                         calib_file=str(calib_file), target_bpw=lo, **FAST),
                         log=lambda m: None)
    by = res["summary"]["tensors_by_type"]
    n_lin = len(res["report"]["blocks"][0]["layers"])            # linears per block (7)
    assert by.get("ptq1_0", 0) >= 2 * n_lin - 1          # down_proj too: one promotion
    rows = res["report"]["blocks"]
    assert any(r["layers"]["down"]["tier"] == "ptq1_0" and r["layers"]["down"]["err_gptq"]
               is not None for r in rows)


def test_target_gain_must_be_known(model, calib_file, tmp_path):
    with pytest.raises(BonsaiError, match="target_gain"):
        quantize_model(QuantizeOptions(model_dir=str(model["dir"]), output_dir=str(tmp_path / "o"),
                                       calib_file=str(calib_file), target_bpw=3.0,
                                       target_gain="loss", **FAST), log=lambda m: None)


def test_output_weighted_gain_also_reaches_the_budget(model, calib_file, tmp_path):
    res = quantize_model(QuantizeOptions(model_dir=str(model["dir"]), output_dir=str(tmp_path / "o"),
                                         calib_file=str(calib_file), target_bpw=2.5,
                                         target_gain="output", **FAST), log=lambda m: None)
    assert 2.0 <= res["summary"]["bpw_linear"] <= 2.5
