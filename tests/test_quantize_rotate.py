"""`bonsai quantize --rotate hadamard[:B]` (quantize/rotation.py): the rotation folded into the model
before quantizing, written as prism.hadamard keys the engine rotates with."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from model_factory import make_hf_model, write_calibration

from bonsai_runner import _core
from bonsai_runner.errors import BonsaiError
from bonsai_runner.gguf_reader import open_gguf
from bonsai_runner.hadamard import unrotate
from bonsai_runner.quantize import QuantizeOptions, quantize_model
from bonsai_runner.quantize.hf_layers import HF_KEYS, HfLayers
from bonsai_runner.quantize.rotation import Rotation, choose_block, parse_rotate

TOKENS = np.random.default_rng(7).integers(3, 200, 24)


def _quantize(tmp_path, m, **kw):
    opts = dict(model_dir=str(m["dir"]), output_dir=str(tmp_path / "o"), outfile=str(tmp_path / "q.gguf"),
                calib_file=str(write_calibration(tmp_path / "c.jsonl")), seq_len=32, max_samples=4,
                batch_size=2, progress=False, device="cpu", force=True)
    opts.update(kw)
    return quantize_model(QuantizeOptions(**opts), log=lambda s: None)


def _meta(path) -> dict:
    r = open_gguf(str(path))
    try:
        return dict(r.metadata)
    finally:
        r.close()


def _logits(path) -> np.ndarray:
    m = _core.Model(str(path))
    try:
        with _core.Context(m, n_ctx=64, n_batch=32, n_threads=2, act_mode="float") as ctx:
            return ctx.decode([int(t) for t in TOKENS], logits="all")
    finally:
        m.close()


def test_rotate_spec_and_block_choice():
    assert parse_rotate(None) is None and parse_rotate("none") is None
    assert parse_rotate("hadamard") == 0 and parse_rotate("hadamard:256") == 256
    for bad in ("hadamard:100", "hadamard:1", "walsh", "hadamard:"):
        with pytest.raises(BonsaiError, match="--rotate"):
            parse_rotate(bad)
    assert choose_block(0, {"a": 896, "b": 4864}) == 128       # Qwen2.5-0.5B's widths
    assert choose_block(0, {"a": 5120, "b": 17408}) == 1024    # capped at 1024
    assert choose_block(64, {"a": 896}) == 64
    with pytest.raises(BonsaiError, match="not a multiple of 256"):
        choose_block(256, {"a": 896})


def test_rotated_layer_computes_the_float_layer(tmp_path):
    """Rotated weights with rotated inputs (the pre-hooks) give the same block output."""
    m = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", seed=1, hidden=128, ffn=256,
                      n_layer=1, n_head=4, n_head_kv=2, dtype="float32")
    cfg = json.loads((m["dir"] / "config.json").read_text())
    from safetensors.numpy import load_file

    raw = load_file(str(m["dir"] / "model.safetensors"))
    w = {k: torch.from_numpy(raw[f"model.layers.0.{hf}"]) for k, hf in HF_KEYS.items()
         if f"model.layers.0.{hf}" in raw}
    layers = HfLayers(cfg, torch.device("cpu"))
    x = torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(0))
    params = {HF_KEYS[k]: v for k, v in w.items()}
    want = layers.forward(0, params, x)
    rot = Rotation(64, seed=3, device=torch.device("cpu"))
    layers.rotation = rot
    seen = {}
    got = layers.forward(0, {HF_KEYS[k]: v for k, v in rot.rotate_block(w).items()}, x,
                         capture=lambda n, a: seen.setdefault(n, a))
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-5)
    # the captured inputs are the rotated ones: x' = WHT(s * x)
    layers.rotation = None
    plain = {}
    layers.forward(0, params, x, capture=lambda n, a: plain.setdefault(n, a))
    assert torch.allclose(seen["mlp.down_proj"], rot.apply(plain["mlp.down_proj"]), atol=1e-5)


def _unrotated_f32_dir(src, dst, reader_names):
    """The PTQ1_0 directory `src` dequantized and un-rotated into a plain float32 HF directory."""
    from safetensors.numpy import save_file

    from bonsai_runner.convert.ptq1_dir import Ptq1Dir
    from bonsai_runner.hadamard import seeded_signs

    d = Ptq1Dir(src)
    rot = d.bonsai["rotation"]
    tensors = {}
    for name in d.shapes:
        a = (d.packed(name).dequantize() if d.tier_of(name) is not None
             else np.asarray(d.ckpt.read_float32(name)))
        if name in rot["weight_names"]:
            a = unrotate(a.astype(np.float64), seeded_signs(a.shape[-1], rot["seed"]), rot["block_size"])
        tensors[name] = np.ascontiguousarray(a, dtype=np.float32)
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"))
    cfg = dict(d.config)
    cfg.pop("quantization_config")
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith((".model", ".txt")) and f.is_file():
            shutil.copy2(f, dst / f.name)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rotated_file_runs_as_its_unrotated_weights(tmp_path, arch):
    """The engine multiplies the stored (rotated) codes with its rotated activations: its logits
    equal those of a float file holding the same weights un-rotated (llama also exercises the
    converter's q/k row permutation, which commutes with the input rotation)."""
    from bonsai_runner.convert import convert

    m = make_hf_model(tmp_path / "m", arch=arch, tokenizer="bpe", seed=2, hidden=128, ffn=256,
                      n_layer=2, n_head=4, n_head_kv=2)
    _quantize(tmp_path, m, rotate="hadamard", target_bpw=3.0)
    md = _meta(tmp_path / "q.gguf")
    names = list(md["prism.hadamard.weight_names"])
    assert len(names) == 14 and "blk.1.ffn_down.weight" in names and md["prism.hadamard.block_size"] == 128
    assert list(md["prism.hadamard.inverse_weight_names"]) == []
    assert sorted(md["prism.hadamard.sign_widths"]) == [128, 256]
    _unrotated_f32_dir(tmp_path / "o", tmp_path / "plain", names)
    convert(str(tmp_path / "plain"), str(tmp_path / "plain.gguf"), "f32", progress=False, log=lambda s: None)
    a, b = _logits(tmp_path / "q.gguf"), _logits(tmp_path / "plain.gguf")
    assert np.abs(a - b).max() < 2e-3 * np.abs(b).max()
    # and the rotation is real: the stored codes differ from a quantization without it
    _quantize(tmp_path, m, rotate="none", target_bpw=3.0, output_dir=str(tmp_path / "o2"),
              outfile=str(tmp_path / "q2.gguf"))
    assert "prism.hadamard.version" not in _meta(tmp_path / "q2.gguf")
    assert np.abs(_logits(tmp_path / "q2.gguf") - a).max() > 1e-3


def test_rotate_refusals(tmp_path):
    m = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", seed=4, hidden=128, ffn=256,
                      n_layer=1, n_head=4, n_head_kv=2)
    with pytest.raises(BonsaiError, match="--rotate and --equalize"):
        _quantize(tmp_path, m, rotate="hadamard", equalize=True)
    with pytest.raises(BonsaiError, match="not a multiple of 256"):
        _quantize(tmp_path, m, rotate="hadamard:256")
    t = make_hf_model(tmp_path / "t", arch="qwen2", tokenizer="bpe", seed=4, hidden=128, ffn=256,
                      n_layer=1, n_head=4, n_head_kv=2, ternary=True)
    with pytest.raises(BonsaiError, match="already ternary"):
        _quantize(tmp_path, t, rotate="hadamard")
    assert not (tmp_path / "o").exists() and not (tmp_path / "q.gguf").exists()


def test_auto_rotates_where_it_applies(tmp_path):
    """The default (--rotate auto) rotates a dense model and quietly skips an already-ternary one."""
    m = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", seed=6, hidden=128, ffn=256,
                      n_layer=1, n_head=4, n_head_kv=2)
    _quantize(tmp_path, m)
    assert _meta(tmp_path / "q.gguf")["prism.hadamard.block_size"] == 128
    t = make_hf_model(tmp_path / "t", arch="qwen2", tokenizer="bpe", seed=6, hidden=128, ffn=256,
                      n_layer=1, n_head=4, n_head_kv=2, ternary=True)
    _quantize(tmp_path, t, output_dir=str(tmp_path / "o2"), outfile=str(tmp_path / "t.gguf"))
    assert "prism.hadamard.version" not in _meta(tmp_path / "t.gguf")


@pytest.mark.parametrize("rotate", ["hadamard", "none"])
def test_engine_perplexity_equals_the_quantizers_estimate(tmp_path, rotate):
    """The held-out loss the quantizer reports (--sensitivity-analysis: its own torch forward of
    the quantized weights) is what the engine gives on the same token ids from the written file:
    float activations to 1e-3 of the perplexity, the default INT8 activations within 2%."""
    from bonsai_runner.eval.perplexity import sequence_nll
    from bonsai_runner.quantize.calibration import Tokenizer, load_calibration
    from bonsai_runner.quantize.sensitivity import held_out_split

    m = make_hf_model(tmp_path / "m", arch="qwen2", tokenizer="bpe", seed=4, hidden=128, ffn=256,
                      n_layer=2, n_head=4, n_head_kv=2)
    calib = write_calibration(tmp_path / "c.jsonl")
    # float32 calibration forwards: "auto" takes bfloat16 on CPUs with AVX512_BF16, whose
    # rounding alone moves the estimate by ~0.15%
    res = _quantize(tmp_path, m, rotate=rotate, sensitivity=True, threshold=0.01, max_samples=8,
                    calib_file=str(calib), forward_dtype="float32")
    sens = res["report"]["sensitivity"]
    cal = load_calibration(str(calib), Tokenizer(m["dir"]), 32, 8, 0, m["n_vocab"])
    _, held = held_out_split(cal.tokens, 4)
    assert held.size == sens["held_out_tokens"]
    want = np.exp(sens["loss_quantized"])
    got_f = np.exp(sequence_nll(str(tmp_path / "q.gguf"), held, "float", 2))
    got_8 = np.exp(sequence_nll(str(tmp_path / "q.gguf"), held, "int8", 2))
    assert abs(got_f / want - 1) < 1e-3, (got_f, want)
    assert abs(got_8 / want - 1) < 0.02, (got_8, want)
    # and the estimate is of the quantized model, not the float one
    assert abs(sens["loss_quantized"] - sens["loss_fp"]) > 1e-3
