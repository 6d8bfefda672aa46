"""The ridge of the layer objective (gptq.with_ridge / auto_ridge, `bonsai quantize --ridge`).

With fewer calibration tokens than a layer's input width, H = 2 X^T X is rank-deficient and the
undamped objective fits the calibration set's noise: the quantized layer's error on other tokens
of the same distribution is larger than it needs to be. The ridge trades a little train error for
a lower held-out one; with plenty of tokens the auto ridge is small and changes little."""

from __future__ import annotations

import pytest
import torch

from bonsai_runner.quantize.gptq import (RIDGE_MAX, ErrorMeter, auto_ridge, quantize_layer,
                                         with_ridge)

ROWS, COLS = 64, 512


def _layer(seed: int):
    """A weight and a sampler of correlated activations with uneven channel scales."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(COLS, COLS, generator=g) / COLS ** 0.5 * torch.exp(
        0.5 * torch.randn(COLS, generator=g))
    w = torch.randn(ROWS, COLS, generator=g)

    def hessian(tokens: int) -> torch.Tensor:
        x = torch.randn(tokens, COLS, generator=g) @ mix.T
        return 2.0 * x.T @ x / tokens

    return w, hessian


def _held_out_errors(seed: int, tokens: int, tier: str) -> tuple[float, float]:
    w, hessian = _layer(seed)
    h_train, h_test = hessian(tokens), hessian(8192)
    plain = quantize_layer(w, h_train, tier).dequantize()
    ridged = quantize_layer(w, with_ridge(h_train, auto_ridge(COLS, tokens)), tier).dequantize()
    meter = ErrorMeter(w, h_test)
    return meter(plain), meter(ridged)


@pytest.mark.parametrize("tier", ["ptq1_0", "q4_0"])
@pytest.mark.parametrize("seed", [0, 1])
def test_auto_ridge_lowers_held_out_error_with_few_tokens(seed, tier):
    plain, ridged = _held_out_errors(seed, COLS // 2, tier)      # rank(H) <= 256 of 512
    assert ridged < 0.9 * plain, (plain, ridged)                 # measured: 17-23% lower


@pytest.mark.parametrize("tier", ["ptq1_0", "q4_0"])
def test_auto_ridge_changes_little_with_many_tokens(tier):
    plain, ridged = _held_out_errors(2, 16 * COLS, tier)
    assert abs(ridged - plain) < 0.06 * plain, (plain, ridged)   # measured: -3% .. +5%


def test_auto_ridge_values():
    assert auto_ridge(4864, 12 * 256) == RIDGE_MAX
    assert auto_ridge(896, 128 * 512) == pytest.approx(2 * 896 / 65536)
    assert auto_ridge(896, 10 ** 9, floor=0.01) == 0.01
    h = torch.eye(4) * torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert torch.equal(torch.diagonal(with_ridge(h, 0.5)), torch.tensor([2.5, 3.5, 4.5, 7.5]))
    assert with_ridge(h, 0.0) is h


def test_ridge_option_parsing_and_report(tmp_path):
    """--ridge auto|X on the command line; the pipeline reports each layer's ridge, the auto value
    from the layer's input width and the calibration tokens."""
    import argparse

    from bonsai_runner.commands import quantize as cmd
    from bonsai_runner.errors import BonsaiError
    from bonsai_runner.quantize import QuantizeOptions, quantize_model
    from model_factory import make_hf_model, write_calibration

    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    base = ["--model-dir", "m"]
    assert p.parse_args(base).ridge is None
    assert p.parse_args(base + ["--ridge", "0.25"]).ridge == 0.25
    for bad in ("-1", "x", "nan"):
        with pytest.raises(SystemExit):
            p.parse_args(base + ["--ridge", bad])

    m = make_hf_model(tmp_path / "m", arch="llama", seed=3, hidden=128, ffn=256, n_layer=1,
                      n_head=4, n_head_kv=2)
    calib = write_calibration(tmp_path / "c.jsonl")
    for ridge, want in ((None, {"q": auto_ridge(128, 4 * 32, 0.01),
                                "down": auto_ridge(256, 4 * 32, 0.01)}),
                        (0.0, {"q": 0.0, "down": 0.0})):
        res = quantize_model(QuantizeOptions(
            model_dir=str(m["dir"]), output_dir=str(tmp_path / f"o{ridge}"), calib_file=str(calib),
            seq_len=32, max_samples=4, progress=False, device="cpu", ridge=ridge,
            policy="*_proj.weight=ptq1_0"), log=lambda s: None)
        layers = res["report"]["blocks"][0]["layers"]
        assert {k: layers[k]["ridge"] for k in want} == pytest.approx(want)
    with pytest.raises(BonsaiError, match="--ridge"):
        quantize_model(QuantizeOptions(model_dir=str(m["dir"]), output_dir=str(tmp_path / "x"),
                                       ridge=-0.5, progress=False), log=lambda s: None)
