"""Activation-aware channel scaling (quantize/equalize.py, Quantizer._equalize).

Oracle: the block forward itself. The transforms are exact, so after scaling a stage the block
(float weights, and quantized weights with the folded v scales) must compute what it computed
before, up to float32 / float16-scale rounding; and the stage's Hessian returned for the scaled
inputs must equal the Hessian measured again on the transformed block.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_factory import make_hf_model

from bonsai_runner.quantize import QuantizeOptions
from bonsai_runner.quantize import equalize as eq
from bonsai_runner.quantize.hf_layers import INPUT_OF
from bonsai_runner.quantize.gptq import LayerResult, grid, quantize_rtn
from bonsai_runner.quantize.pipeline import Quantizer, _to_device


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def setup(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"eq-{request.param}")
    m = make_hf_model(d / "m", arch=request.param, tokenizer="bpe", hidden=128, ffn=256,
                      n_layer=1, n_head=4, n_head_kv=2, seed=7)
    q = Quantizer(QuantizeOptions(model_dir=str(m["dir"]), output_dir=str(d / "o"),
                                  progress=False, forward_dtype="float32", equalize=True),  # exact folds
                  log=lambda s: None)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, 16, 128)).astype(np.float32))
    return q, x


def _force_scales(monkeypatch, seed):
    rng = np.random.default_rng(seed)

    def fake(ws, H, tier, tie_groups=None, alphas=eq.ALPHAS):
        s = torch.from_numpy(np.exp(rng.uniform(-1, 1, H.shape[0])).astype(np.float32))
        if tie_groups is not None:
            s = s[tie_groups]             # one value per tie group, as the real choice gives
        return s, 0.5, 1.0, 0.9
    monkeypatch.setattr(eq, "choose_scales", fake)


@pytest.mark.parametrize("stage", [("q", "k", "v"), ("gate", "up"), ("o",)])
def test_scaling_keeps_the_block_function(setup, monkeypatch, stage):
    q, x = setup
    _force_scales(monkeypatch, 1)
    w = _to_device(q.loader.load_block(0), q.device)
    qw = dict(w)

    def block_forward(x, ws):
        return q.blocks.forward(0, ws, x).numpy()

    def hessian(ws):
        return q.blocks.hessian(0, ws, x, INPUT_OF[stage[0]]).numpy()
    stored = {}
    tiers, _ = q._block_tiers(0)
    if stage == ("o",):   # o folds into the already-quantized v: quantize v first
        g = grid("ptq1_0")
        codes, scales = quantize_rtn(w["v"], g)
        stored["v"] = (LayerResult("ptq1_0", codes, scales, 0.0, 0.0, 0.0), {})
        qw["v"] = stored["v"][0].dequantize()
    before_fp = block_forward(x, dict(w))
    before_q = block_forward(x, dict(qw))
    H = torch.from_numpy(hessian(qw))
    H2 = q._equalize(0, stage, w, qw, stored, H, tiers, {}).numpy()
    H = H.numpy()
    for k in stage:
        qw[k] = w[k]
    assert not np.allclose(H2, H)
    np.testing.assert_allclose(block_forward(x, w), before_fp, rtol=0, atol=2e-5)
    after_q = block_forward(x, qw)
    tol = 3e-3 if stage == ("o",) else 2e-5       # v's scales are re-rounded to float16
    np.testing.assert_allclose(after_q, before_q, rtol=0,
                               atol=tol * np.abs(before_q - x.numpy()).max())
    H_again = hessian(qw)
    np.testing.assert_allclose(H2, H_again, rtol=1e-3, atol=1e-4 * np.abs(H_again).max())


def test_choice_is_the_best_of_the_grid_and_never_worse_than_no_scaling():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((512, 256)) * np.exp(rng.uniform(-2, 2, 256))   # uneven channels
    H = torch.from_numpy(2 * X.T @ X / 512)
    ws = [torch.from_numpy(rng.standard_normal((64, 256))) for _ in range(2)]
    s, alpha, e0, e1 = eq.choose_scales(ws, H, "ptq1_0")
    a = eq.channel_rms(H)
    errs = {}
    for al in eq.ALPHAS:
        t = a ** al
        errs[al] = eq._stage_error(ws, H, t / torch.sqrt(t.max() * t.min()), "ptq1_0")
    assert alpha == min(errs, key=errs.get)
    assert e0 == pytest.approx(errs[0.0]) and e1 == pytest.approx(errs[alpha]) and e1 <= e0
    assert s.shape == (256,) and bool((s > 0).all())
