"""`--method rtn`: the round-to-nearest ternary baseline (absmean threshold, no calibration data).

Oracle: the absmean rule written out independently here (per group of 128: s = mean |w| rounded
to float16, code = sign(w) where |w| > s / 2), compared with the codes and scales in the PTQ1_0
directory; down_proj keeps the default policy's Q8_0 with the reference block quantizer's bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from model_factory import make_hf_model

from bonsai_runner.convert.ptq1_dir import Ptq1Dir
from bonsai_runner.errors import BonsaiError
from bonsai_runner.quantize import QuantizeOptions, quantize_model


def test_rtn_is_the_absmean_rule_without_calibration(tmp_path):
    from bonsai_runner import quants

    m = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", hidden=128, ffn=256,
                      n_layer=2, seed=4)
    out, gg = tmp_path / "rtn", tmp_path / "rtn.gguf"
    logs = []
    res = quantize_model(QuantizeOptions(model_dir=str(m["dir"]), output_dir=str(out),
                                         outfile=str(gg), method="rtn", progress=False),
                         log=logs.append)
    assert not any("calibration:" in s for s in logs)
    d = Ptq1Dir(out)
    name = "model.layers.1.mlp.gate_proj.weight"
    w = m["tensors"][name].astype(np.float64)
    rows, cols = w.shape
    wg = w.reshape(rows, cols // 128, 128)
    s = np.abs(wg).mean(axis=2).astype(np.float16).astype(np.float64)
    want = (np.sign(wg) * (np.abs(wg) > s[..., None] / 2) * s[..., None]).reshape(rows, cols)
    np.testing.assert_array_equal(d.read_float32(name), want.astype(np.float32))
    down = "model.layers.0.mlp.down_proj.weight"
    ref = quants.dequantize(quants.quantize(m["tensors"][down], "q8_0"), "q8_0",
                            m["tensors"][down].shape)
    np.testing.assert_array_equal(d.read_float32(down), np.asarray(ref).reshape(-1, 256))
    assert res["summary"]["tensors_by_type"]["ptq1_0"] == 12
    cal = dict(d.quant_config["calibration"])
    assert cal.pop("compute")["device"] == "cpu"          # device and time per stage
    assert cal == {"method": "rtn"}
    assert gg.stat().st_size > 0


@pytest.mark.parametrize("extra", [dict(sensitivity=True), dict(target_bpw=3.0),
                                   dict(calib_steps=2), dict(calib_file="x.txt")])
def test_rtn_refuses_calibration_options(tmp_path, extra):
    m = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", hidden=128, ffn=256,
                      n_layer=1, seed=4)
    with pytest.raises(BonsaiError, match="--method rtn"):
        quantize_model(QuantizeOptions(model_dir=str(m["dir"]), output_dir=str(tmp_path / "o"),
                                       method="rtn", progress=False, **extra))
    assert not (tmp_path / "o").exists()
